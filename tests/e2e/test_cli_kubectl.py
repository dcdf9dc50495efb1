"""``toposlice slices`` through the real kubectl against the real API server: ``kubectl
create --dry-run=client -f`` takes both output forms (``-o json``: a v1 List, ``-o yaml``:
a document stream), and ``doctor --slices`` reads what ``kubectl get -o json/yaml`` prints
of the slices the API server then holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NODE = "e2e-cli-kubectl"
TOPOSLICE = (sys.executable, "-m", "toposlice")


def _slices(fmt: str, node: str = NODE) -> str:
    return subprocess.run(
        [*TOPOSLICE, "slices", "--fake", "cpu-2s", "--node-name", node, "-o", fmt],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_kubectl_create_dry_run_takes_slices(cluster: Cluster, fmt: str) -> None:
    out = cluster.kubectl("create", "--dry-run=client", "-o", "name", "-f", "-", input=_slices(fmt))
    assert out.split() and all(
        line.startswith("resourceslice.resource.k8s.io/") for line in out.split()
    ), out


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_doctor_reads_kubectl_get(cluster: Cluster, fmt: str, tmp_path: Path) -> None:
    node = f"{NODE}-{fmt}"
    cluster.kubectl("create", "-f", "-", input=_slices("json", node))
    try:
        listed = cluster.kubectl(
            "get", "resourceslices", f"--field-selector=spec.nodeName={node}", "-o", fmt
        )
        got = str(tmp_path / f"got.{fmt}")
        Path(got).write_text(listed)
        r = subprocess.run(
            [*TOPOSLICE, "doctor", "--fake", "cpu-2s", "--node-name", node, "--slices", got],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        cluster.kubectl("delete", "resourceslices", f"--field-selector=spec.nodeName={node}")
