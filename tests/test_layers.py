"""The import rules that keep the layers pointing down (docs/architecture.md).

discovery/ reads the host and knows nothing above it; plugins/ (probes) build on
discovery and never on each other; normalize/ is pure functions over the inventory;
driver/ and scorer/ use normalize but never the CLI (toposlice/). Inside driver/, the
plumbing floor (driver/plumbing/) imports no other part of the driver; the kubelet plugin
(driver/kubelet/), the publisher (driver/publisher/), the exporter (driver/exporter/) and
device health (driver/health/) stand side by side on it and on driver/interfaces.py, and
never import each other; only the daemon (driver/daemon.py, with run's driver/config.py)
wires them together. scorer/ uses the plumbing alone; the CLI never imports the kubelet
plugin. Every import in every file counts, function-level and relative ones included: a
deferred import is still a dependency.
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

#: The parts of driver/ (a sub-package, or a module at driver/'s top level).
DRIVER_PARTS = (
    "driver.plumbing",
    "driver.interfaces",
    "driver.health",
    "driver.kubelet",
    "driver.publisher",
    "driver.exporter",
    "driver.config",
    "driver.daemon",
)

#: driver/ part -> the other driver/ parts it may import. The kubelet plugin, the publisher,
#: the exporter and device health sit side by side and never import each other; the daemon
#: and run's configuration wire them and may import every part.
_SIDE_BY_SIDE = {"driver.plumbing", "driver.interfaces"}
DRIVER_MAY_USE: dict[str, set[str]] = {
    "driver": set(),
    "driver.plumbing": set(),
    "driver.interfaces": {"driver.plumbing"},
    "driver.health": _SIDE_BY_SIDE,
    "driver.kubelet": _SIDE_BY_SIDE,
    "driver.publisher": _SIDE_BY_SIDE,
    "driver.exporter": _SIDE_BY_SIDE,
    "driver.config": set(DRIVER_PARTS),
    "driver.daemon": set(DRIVER_PARTS),
}

#: The driver/ modules and packages scorer/ may use: the plumbing (the one HTTP stack,
#: the API client and cache); the kubelet plugin, publisher and exporter are not the
#: scorer's business.
SCORER_MAY_USE = {"driver.plumbing"}

#: The driver/ modules and packages the CLI (toposlice/) may use: the plumbing, ``run``'s
#: configuration and daemon, the exporter and device health (``serve``), the interfaces,
#: and the reader of the other drivers' slices (``serve --observe``, ``doctor``). Never the
#: kubelet plugin: what a command needs of it lives in discovery/ or normalize/.
CLI_MAY_USE = {
    "driver.plumbing",
    "driver.config",
    "driver.daemon",
    "driver.interfaces",
    "driver.health",
    "driver.exporter",
    "driver.publisher.observe",
}

#: plugins/ modules every probe may use; a probe importing any other plugins/ module
#: (another probe) breaks the rule "probes never import each other".
PLUGIN_SHARED = {"plugins", "plugins.base"}

#: (file, imported module) pairs allowed for now, with the reason.
KNOWN: dict[tuple[str, str], str] = {}


def _package_of(rel: str) -> list[str]:
    """The package a repository file belongs to, as name parts (``driver/kubelet/x.py`` ->
    driver.kubelet; ``driver/kubelet/__init__.py`` -> driver.kubelet too)."""
    return rel.removesuffix(".py").split("/")[:-1]


def imports_of(path: Path, rel: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in ``path`` (relative imports
    resolved as if the file were the repository file ``rel``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if rel is None:
                    continue
                base = _package_of(rel)
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            elif node.module:
                module = node.module
            else:
                continue
            out.append((node.lineno, module))
            # `from plugins import rdma` imports the probe module itself
            out.extend((node.lineno, f"{module}.{a.name}") for a in node.names)
    return out


def _within(module: str, allowed: set[str]) -> bool:
    """``module`` is one of ``allowed`` or inside one (``from driver.plumbing.informer
    import Informer`` is recorded as driver.plumbing.informer.Informer too)."""
    return any(module == a or module.startswith(a + ".") for a in allowed)


def driver_part(module: str) -> str:
    """The driver/ part a driver module belongs to (``driver`` for the package itself)."""
    return next((p for p in DRIVER_PARTS if module == p or module.startswith(p + ".")), "driver")


def source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def violations(rel: str, path: Path) -> list[str]:
    """The layer rules ``path`` breaks, judged as the repository file ``rel``."""
    layer = rel.split("/", 1)[0]
    banned = FORBIDDEN.get(layer, set())
    own = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    found = []
    for line, module in imports_of(path, rel):
        top = module.split(".", 1)[0]
        if (rel, module) in KNOWN or (rel, module.rsplit(".", 1)[0]) in KNOWN:
            continue
        if top in banned:
            found.append(f"{rel}:{line} imports {module} ({layer}/ must not import {top}/)")
        elif layer == "driver" and top == "driver" and module != "driver":
            mine, theirs = driver_part(own), driver_part(module)
            if theirs != mine and theirs not in DRIVER_MAY_USE[mine]:
                found.append(
                    f"{rel}:{line} imports {module} ({mine} uses only "
                    f"{sorted(DRIVER_MAY_USE[mine]) or 'no other part of driver/'})"
                )
        elif layer == "scorer" and top == "driver" and not _within(module, SCORER_MAY_USE):
            found.append(
                f"{rel}:{line} imports {module} (scorer/ uses only {sorted(SCORER_MAY_USE)})"
            )
        elif layer == "toposlice" and top == "driver" and not _within(module, CLI_MAY_USE):
            found.append(
                f"{rel}:{line} imports {module} (toposlice/ uses only {sorted(CLI_MAY_USE)})"
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


def test_every_driver_module_is_in_a_part() -> None:
    """A new sub-package or top-level module of driver/ gets its rules here first."""
    for path in (REPO / "driver").rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        assert module == "driver" or driver_part(module) != "driver", rel


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
        ("scorer/z.py", "from driver.exporter.http_server import HttpServer\n"),
        ("driver/y.py", "from scorer.extender import Extender\n"),
        ("driver/plumbing/x.py", "from driver.interfaces import DeviceHealth\n"),
        ("driver/plumbing/y.py", "def f():\n    from driver.kubelet.cdi import qualified\n"),
        ("driver/plumbing/z.py", "from ..kubelet import cdi\n"),
        ("driver/kubelet/x.py", "from driver.publisher.observe import registered_drivers\n"),
        ("driver/kubelet/y.py", "from driver.daemon import Daemon\n"),
        ("driver/kubelet/z.py", "from driver.health.monitor import HealthMonitor\n"),
        ("driver/publisher/x.py", "from driver.exporter.metrics import DriverMetrics\n"),
        ("driver/publisher/y.py", "from driver.config import DaemonConfig\n"),
        ("driver/exporter/x.py", "from driver.kubelet import state\n"),
        ("driver/exporter/y.py", "from ..publisher.slices import SlicePublisher\n"),
        ("driver/health/x.py", "from driver.kubelet.state import DriverState\n"),
        ("driver/interfaces.py", "from driver.kubelet.state import DriverState\n"),
        ("toposlice/x.py", "from driver.kubelet.vendor_cdi import VendorCdi\n"),
        ("toposlice/y.py", "def f():\n    from driver import kubelet\n"),
        ("toposlice/z.py", "import driver.publisher.slices\n"),
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


#: What each floor may import of driver/, one file per floor: the checker finds nothing.
ALLOWED_SAMPLES = {
    "driver/plumbing/x.py": "from driver.plumbing.kube import request_json\n"
    "from .gen import pluginregistration_pb2\n",
    "driver/kubelet/x.py": "from driver.plumbing.atomic import write_atomic\n"
    "from . import cdi\nfrom driver.interfaces import HealthFeed\n",
    "driver/publisher/x.py": "from driver.plumbing.informer import Informer\n",
    "driver/exporter/x.py": "from driver.interfaces import ExporterView\n",
    "driver/health/x.py": "from driver.interfaces import DeviceHealth\n",
    "driver/daemon.py": "from driver.kubelet.state import DriverState\n",
    "driver/config.py": "from driver.kubelet.device_metadata import check_versions\n",
    "scorer/x.py": "from driver.plumbing.http_transport import HttpTransport\n",
    "toposlice/x.py": "from driver.exporter.http_server import HttpServer\n"
    "from driver.health.monitor import HealthMonitor\nfrom driver.daemon import Daemon\n",
}


def test_rule_allows_the_driver_floors(tmp_path: Path) -> None:
    file = tmp_path / "x.py"
    for rel, text in ALLOWED_SAMPLES.items():
        file.write_text(text)
        assert violations(rel, file) == [], rel
