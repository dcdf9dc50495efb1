"""Shared fixtures: the hwloc sysfs dumps shipped in ``tests/data/hwloc`` (plus any extra
cases of ``../shared/fixtures/hwloc``), listed and extracted by ``hack/hwloc_fixtures.py``,
which bench/ and hack/ use too; the Hypothesis profiles; the tier deselection."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from hack.hwloc_fixtures import HWLOC, SHARED, ExtractedCases, case_file, hwloc_cases

__all__ = ["HWLOC", "SHARED", "examples", "hwloc_cases", "link_copy", "load_truth"]

#: Hypothesis profiles. ``ci``, the default, runs what each test asks for (bounded:
#: property tests give their count through :func:`examples`, e.g. 100 damaged trees);
#: ``long`` runs ten times as many, for a thorough run before a release or after a parser
#: change: ``python3 -m pytest --hypothesis-profile long tests/test_hostile_sysfs.py``.
CI_EXAMPLES = 100
settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None, print_blob=True)
settings.register_profile(
    "long",
    max_examples=10 * CI_EXAMPLES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")


def examples(n: int) -> int:
    """A property test's example count: ``n`` under the ``ci`` profile, scaled with the
    loaded profile's ``max_examples`` (``--hypothesis-profile long``: ten times ``n``)."""
    return max(1, n * settings.default.max_examples // CI_EXAMPLES)


def load_truth(case: str) -> dict[str, Any]:
    with open(case_file(case, ".json"), encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


@pytest.fixture(autouse=True)
def _no_node_name_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run``, ``serve`` and ``doctor`` default ``--node-name`` to ``$NODE_NAME``: the
    suite runs the same whether or not the caller's shell (or pod) sets it."""
    monkeypatch.delenv("NODE_NAME", raising=False)


@pytest.fixture(scope="session")
def hwloc_roots(tmp_path_factory: pytest.TempPathFactory) -> ExtractedCases:
    """case name -> extracted fsroot (the tarball's single top directory). Each case is
    extracted on first use, once per run: pytest-xdist workers share the folder (their
    base temp dirs sit side by side). Read the trees; copy one before damaging it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return ExtractedCases(base / "hwloc")


@pytest.fixture(scope="session", autouse=True)
def fake_tree_cache() -> Iterator[Path]:
    """``--fake`` trees are cached (discovery/fake/cache.py) in a folder of this run's
    (on tmpfs when there is one, as the default cache is), not the user's; removed at
    the end."""
    from discovery.fake import scratch_dir

    folder = Path(tempfile.mkdtemp(prefix="toposlice-test-fake-cache-", dir=scratch_dir()))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOSLICE_FAKE_CACHE", str(folder))
        yield folder
    shutil.rmtree(folder, ignore_errors=True)


def link_copy(src: Path, dest: Path) -> Path:
    """A copy of the tree ``src`` at ``dest`` whose files are hard links to ``src``'s
    (a few times faster than copying a 9,000-file dump). Replace, delete or rename its
    entries freely, but never write into one of its files: that writes ``src`` too
    (unlink the file first, then write a new one)."""
    shutil.copytree(src, dest, symlinks=True, copy_function=os.link)
    return dest


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The whole default suite (``python3 -m pytest`` without paths) runs on every core
    with pytest-xdist (``-n auto --dist worksteal``; ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    caps it). Not in ``addopts``: ``-p no:xdist``, as the tiers run, would then reject
    ``-n``. Naming paths, ``-n``/``--dist``, ``-m``, ``--pdb`` or ``--collect-only``
    keeps the run as asked (one process unless ``-n`` says otherwise)."""
    opt = config.option
    if (
        not config.pluginmanager.hasplugin("xdist")
        or os.environ.get("PYTEST_XDIST_WORKER")
        or config.args_source != pytest.Config.ArgsSource.TESTPATHS
        or getattr(opt, "numprocesses", None) is not None
        or getattr(opt, "dist", "no") != "no"
        or getattr(opt, "tx", None)
        or opt.markexpr
        or opt.usepdb
        or opt.collectonly
    ):
        return
    opt.numprocesses = "auto"
    opt.dist = "worksteal"  # an idle worker takes queued tests from a busy one


#: Markers of the tiers that start real Kubernetes binaries. A plain ``pytest`` leaves
#: them out (they take minutes and need ``../shared/kube``); ``-m e2e`` / ``-m node`` /
#: ``-m interop`` / ``-m consumers`` or a path inside their folders runs them.
TIER_MARKERS = ("e2e", "node", "interop", "consumers")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.markexpr:
        return
    named = [str(a) for a in config.args]
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        tier = next((m for m in TIER_MARKERS if item.get_closest_marker(m)), None)
        if tier is None or any(f"{tier}" in Path(a).parts for a in named):
            keep.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
