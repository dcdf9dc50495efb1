"""``toposlice doctor --kubeconfig`` and ``toposlice serve --observe`` against the foreign
slices of tests/data/foreign-slices/ applied through the real API server (its validation,
its field selectors, its list semantics), on a node of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.publisher.observe import load_slice_files
from tests.e2e.cluster import Cluster, free_ports, poll
from tests.e2e.toposlice_setup import remove_node_and_slices
from tests.exporter_view import FOREIGN_SLICE_FILES
from tests.test_doctor import EXPECTED_VERTEX, NOT_FLAGGED, PLANTED, assert_observed_planted, keys

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NODE = "e2e-foreign-dgx"
ON_NODE = ("gpu.nvidia.com", "dra.net", "dra.cpu")


def _renamed(s: dict[str, Any]) -> dict[str, Any]:
    """A foreign slice moved from node ``dgx-h100`` to NODE (name, nodeName, pool)."""
    s = json.loads(json.dumps(s))
    s["metadata"] = {"name": s["metadata"]["name"].replace("dgx-h100", NODE)}
    s["spec"]["nodeName"] = NODE
    s["spec"]["pool"]["name"] = NODE
    return s


@pytest.fixture(scope="module")
def foreign(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The node, its foreign slices (accepted by the real API server), and a kubelet
    plugin registry naming the drivers on the node; yields the registry folder."""
    cluster.add_node(NODE)
    slices = [_renamed(s) for s in load_slice_files(FOREIGN_SLICE_FILES)]
    registry = tmp_path_factory.mktemp("registry")
    for driver in ON_NODE:
        (registry / f"{driver}-reg.sock").touch()
    try:
        cluster.apply(slices)
        yield registry
    finally:
        remove_node_and_slices(cluster, NODE)


def _vertices(report: dict[str, Any]) -> dict[tuple[str, str], str | None]:
    return {(d["driver"], d["device"]): d["vertex"] for d in report["devices"]}


def test_doctor_reads_the_real_api(cluster: Cluster, foreign: Path) -> None:
    argv = [sys.executable, "-m", "toposlice", "-q", "doctor", "--fake", "dgx-h100"]
    argv += ["--node-name", NODE, "--kubeconfig", str(cluster.kubeconfig)]
    argv += ["--plugins-registry", str(foreign), "-o", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    found = keys(report)
    assert PLANTED <= found, PLANTED - found
    assert not NOT_FLAGGED & {(d, dev, c) for d, dev, c, _a in found}
    # The generation-1 leftover of dra.net is in the API too and is ignored.
    assert _vertices(report) == EXPECTED_VERTEX


def test_serve_observe_reads_the_real_api(cluster: Cluster, foreign: Path) -> None:
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "toposlice", "-q", "serve", "--fake", "dgx-h100"]
    argv += ["--node-name", NODE, "--http-addr", f"127.0.0.1:{port}", "--observe"]
    argv += ["--kubeconfig", str(cluster.kubeconfig), "--plugins-registry", str(foreign)]
    argv += ["--observe-interval", "0.5"]
    cluster.spawn("toposlice-serve-observe", argv, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}/v1/normalization"

    def observed() -> dict[str, Any] | None:
        with urllib.request.urlopen(url, timeout=2) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc if doc.get("devices") else None

    try:
        norm = poll(observed, 60, 0.2, "serve --observe report")
        assert_observed_planted(norm)
        assert PLANTED <= keys(norm)
        assert _vertices(norm) == EXPECTED_VERTEX
    finally:
        cluster.kill("toposlice-serve-observe")
