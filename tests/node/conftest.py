"""The ``node`` tier: one control plane, one real kubelet + containerd node, the image built
without a daemon (hack/build_oci.py) and the chart installed with Helm's Go SDK, once per
session. Run it with ``python3 -m pytest -m node -p no:xdist`` (as root); without the
binaries of ``../shared/kube`` or the host's prerequisites every test is skipped with a
line saying what is missing. Each module sets ``pytestmark = pytest.mark.node``.

The tier's figures (image size and build time, node and plugin start, pod creation to
Running with a claim) are printed at the end of the run (docs/deploy.md quotes them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import SKIP_REASON, find_assets
from tests.node.node import Node, NodeCluster, missing_prerequisites, node_ip

NODE_NAME = "toposlice-node"
TOPOSLICE_IMAGE = "docker.io/library/toposlice:dev"
WORKLOAD_IMAGE = "docker.io/toposlice/workload:test"

#: name -> value, printed in the terminal summary.
FIGURES: dict[str, Any] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("node tier figures")
        for key, value in FIGURES.items():
            terminalreporter.write_line(f"{key}: {value}")


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    assets = find_assets(node=True)
    if assets is None:
        pytest.skip(SKIP_REASON)
    lacking = missing_prerequisites()
    if lacking:
        pytest.skip(lacking)
    from hack import build_oci

    # Short base path: the kubelet's plugin sockets must stay under 108 bytes.
    base = Path(tmp_path_factory.mktemp("node", numbered=True))
    node_dir = base / "n"
    images = node_dir / "images"
    images.mkdir(parents=True)
    cache = build_oci.cache_dir(os.environ.get("TOPOSLICE_OCI_CACHE"))
    built = build_oci.build(images / "toposlice.tar", TOPOSLICE_IMAGE, cache)
    FIGURES["image"] = (
        f"{built['tarball_mb']} MB tarball, rootfs {built['rootfs_mb']} MB "
        f"(Debian part {built['debian_rootfs_mb']} MB), built in {built['build_s']} s"
    )
    build_oci.build_workload(images / "workload.tar", WORKLOAD_IMAGE, cache)

    NodeCluster.node_address = node_ip() or ""
    cluster = NodeCluster.start(base / "cp", assets)
    n = Node(cluster, node_dir, NODE_NAME)
    try:
        n.start()
        FIGURES["control plane + node Ready"] = (
            f"{sum(cluster.timings.values()):.1f} s + {n.timings['node_up_s']:.1f} s "
            "(node-up.sh: containerd, 3 image imports, kubelet to Ready)"
        )
        yield n
    finally:
        n.stop()
        cluster.stop()
