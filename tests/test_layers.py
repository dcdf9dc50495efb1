"""The import rules that keep the layers pointing down (docs/architecture.md).

discovery/ reads the host and knows nothing above it; plugins/ (probes) build on
discovery and never on each other; normalize/ is pure functions over the inventory;
driver/ and scorer/ use normalize but never the CLI (toposlice/). Every import in every
file counts, function-level ones included: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("discovery", "plugins", "normalize", "driver", "scorer", "toposlice")

#: package -> top-level packages it must not import
FORBIDDEN: dict[str, set[str]] = {
    "discovery": {"plugins", "normalize", "toposlice", "driver", "scorer"},
    "plugins": {"normalize", "toposlice", "driver", "scorer"},
    "normalize": {"plugins", "toposlice", "driver", "scorer"},
    "driver": {"toposlice", "scorer"},
    "scorer": {"toposlice"},
}

#: The driver/ modules scorer/ may use: the one HTTP stack and the API cache (and what
#: they import); the kubelet plugin, publisher and exporter are not the scorer's business.
SCORER_MAY_USE = {
    "driver.plumbing.http_transport",
    "driver.plumbing.informer",
    "driver.plumbing.kube",
}

#: plugins/ modules every probe may use; a probe importing any other plugins/ module
#: (another probe) breaks the rule "probes never import each other".
PLUGIN_SHARED = {"plugins", "plugins.base"}

#: (file, imported module) pairs allowed for now, with the reason.
KNOWN: dict[tuple[str, str], str] = {}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            # `from plugins import rdma` imports the probe module itself
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return out


def _scorer_may_use(module: str) -> bool:
    # ``from driver.plumbing.informer import Informer`` is recorded as
    # driver.plumbing.informer.Informer too.
    return module in SCORER_MAY_USE or module.rsplit(".", 1)[0] in SCORER_MAY_USE


def source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def violations(rel: str, path: Path) -> list[str]:
    """The layer rules ``path`` breaks, judged as the repository file ``rel``."""
    layer = rel.split("/", 1)[0]
    banned = FORBIDDEN.get(layer, set())
    own = rel.removesuffix(".py").replace("/", ".")
    found = []
    for line, module in imports_of(path):
        top = module.split(".", 1)[0]
        if (rel, module) in KNOWN or (rel, module.rsplit(".", 1)[0]) in KNOWN:
            continue
        if top in banned:
            found.append(f"{rel}:{line} imports {module} ({layer}/ must not import {top}/)")
        elif layer == "scorer" and top == "driver" and not _scorer_may_use(module):
            found.append(
                f"{rel}:{line} imports {module} (scorer/ uses only {sorted(SCORER_MAY_USE)})"
            )
        elif layer == "plugins" and top == "plugins" and rel != "plugins/registry.py":
            # The registry loads probes by name; a probe may use only plugins.base
            # (``from plugins.base import X`` is recorded as ``plugins.base.X`` too).
            shared = module in PLUGIN_SHARED or module.startswith("plugins.base.")
            if not shared and module != own:
                found.append(f"{rel}:{line} imports {module} (probes never import each other)")
    return found


def test_scans_every_layer() -> None:
    layers = {p.relative_to(REPO).parts[0] for p in source_files()}
    assert {"discovery", "plugins", "normalize", "toposlice"} <= layers


@pytest.mark.parametrize("path", source_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_imports_point_down(path: Path) -> None:
    assert violations(path.relative_to(REPO).as_posix(), path) == []


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("discovery/x.py", "def f():\n    from normalize.graph import build_graph\n"),
        ("plugins/x.py", "from plugins.rdma import RdmaProbe\n"),
        ("plugins/y.py", "from plugins import nvidia\n"),
        ("normalize/x.py", "import plugins.registry\n"),
        ("driver/x.py", "import toposlice.sources\n"),
        ("scorer/x.py", "from toposlice.discover import discover\n"),
        ("scorer/y.py", "from driver.publisher.slices import SlicePublisher\n"),
        ("driver/y.py", "from scorer.extender import Extender\n"),
    ],
)
def test_rule_catches_an_upward_import(tmp_path: Path, rel: str, text: str) -> None:
    """The checker itself reports each kind of upward or sideways import."""
    file = tmp_path / "x.py"
    file.write_text(text)
    assert violations(rel, file)


def test_rule_allows_downward_imports(tmp_path: Path) -> None:
    file = tmp_path / "x.py"
    file.write_text(
        "from discovery.model import Inventory\nfrom plugins.base import ProbeContext\n"
    )
    assert violations("plugins/x.py", file) == []
    assert violations("normalize/x.py", file.with_name("x.py")) != []
