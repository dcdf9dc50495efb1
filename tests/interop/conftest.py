"""The ``interop`` tier: toposlice beside the real neighbours of ``../shared/peers`` on one
real node (kubelet + containerd with NRI) and a v1.36.2 control plane with the list-attribute
gate off, as clusters run it. Run it with ``python3 -m pytest -m interop -p no:xdist`` (as
root); without the kits or the host's prerequisites every test is skipped with a line saying
what is missing. Each module sets ``pytestmark = pytest.mark.interop``.

Figures (start-up of each peer and of ``toposlice run`` beside it) are printed at the end.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import SKIP_REASON, find_assets
from tests.interop.peers import FIGURES, StockCluster, kit_or_skip, report_figures
from tests.node.node import Node, missing_prerequisites, node_ip

NODE_NAME = "interop-node"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    report_figures(terminalreporter, "interop tier figures", FIGURES)


class NriNode(Node):
    """The node tier's node started by the peers kit's ``node-up-nri.sh``: containerd with
    NRI on, which dra-driver-cpu and dranet plug into. No kube-proxy: nothing here needs
    Services."""

    def __init__(self, *args: Any, kit: Path, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.kit = kit

    def start(self) -> None:
        import atexit
        import shutil
        import time

        shutil.copy(self.bin / "images" / "pause.tar", self.images / "pause.tar")
        (self.cluster.dir / "ports.env").write_text(f"APISERVER_PORT={self.cluster.api_port}\n")
        env = dict(
            os.environ,
            NODE_NAME=self.name,
            NODE_KIT=str(self.bin),
            KUBECTL=str(self.cluster.bin / "kubectl"),
            PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin",
        )
        self.started = True
        atexit.register(self.stop)
        t0 = time.monotonic()
        res = subprocess.run(
            [
                "bash",
                str(self.kit / "scripts" / "node-up-nri.sh"),
                str(self.cluster.dir),
                str(self.dir),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if res.returncode != 0:
            raise RuntimeError(f"node-up-nri.sh failed: {res.stderr.strip()[-2000:]}")
        self.timings["node_up_s"] = time.monotonic() - t0


@pytest.fixture(scope="session")
def kit() -> Path:
    return kit_or_skip()


@pytest.fixture(scope="session")
def node(kit: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NriNode]:
    assets = find_assets(node=True)
    if assets is None:
        pytest.skip(SKIP_REASON)
    lacking = missing_prerequisites()
    if lacking:
        pytest.skip(lacking.replace("node tier", "interop tier"))
    # Short base path: the kubelet's plugin sockets must stay under 108 bytes.
    base = Path(tmp_path_factory.mktemp("iop", numbered=True))
    StockCluster.node_address = node_ip() or ""
    cluster = StockCluster.start(base / "cp", assets)
    n = NriNode(cluster, base / "n", NODE_NAME, kit=kit)
    try:
        n.start()
        FIGURES["control plane + NRI node Ready"] = (
            f"{sum(cluster.timings.values()):.1f} s + {n.timings['node_up_s']:.1f} s"
        )
        yield n
    finally:
        n.stop()
        cluster.stop()
