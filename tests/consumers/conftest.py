"""The ``consumers`` tier: the real readers of toposlice's objects from ``../shared/peers``
(nfd-master, the NodeResourceTopology scheduler plugin, Kueue) against a real v1.36.2
control plane, fed by ``toposlice run --node-feature --nrt`` processes on fake nodes.

Run it with ``python3 -m pytest -m consumers -p no:xdist`` (no root needed); without the
kits every test is skipped with a line saying what is missing. The nodes are Node objects
kept Ready by the harness (tests/e2e/cluster.py), one ``toposlice run`` per node as the
chart's ServiceAccount: two fake DGX H100s and four GB200 NVL72 trays in two NVLink
cliques (A and B, two trays each). Each module sets ``pytestmark = pytest.mark.consumers``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.consumers.readers import FIGURES, Fleet, start_fleet
from tests.e2e.cluster import SKIP_REASON, Cluster, find_assets
from tests.interop.peers import kit_or_skip, report_figures


def pytest_terminal_summary(terminalreporter: Any) -> None:
    report_figures(terminalreporter, "consumers tier figures", FIGURES)


@pytest.fixture(scope="session")
def kit() -> Path:
    return kit_or_skip()


@pytest.fixture(scope="session")
def fleet(kit: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    assets = find_assets()
    if assets is None:
        pytest.skip(SKIP_REASON)
    if shutil.which("openssl") is None:
        pytest.skip("the consumers tier makes its certificates with openssl: install it")
    base = Path(tmp_path_factory.mktemp("cons", numbered=True))
    # Kueue's webhooks are reached through their Service's endpoints (peers README).
    cluster = Cluster.start(
        base / "cp", assets, {"kube-apiserver": ["--enable-aggregator-routing=true"]}
    )
    fleet = None
    try:
        fleet = start_fleet(cluster, kit, base)
        yield fleet
    finally:
        if fleet is not None:
            fleet.stop()
        cluster.stop()
