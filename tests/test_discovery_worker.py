"""The rediscovery helper (toposlice/discovery_worker.py) works when the server is PID 1,
as ``toposlice run`` is in the chart's container: it used to take a parent PID of 1 for
"my parent died" and exit at once, so every rediscovery in the pod failed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import os
    from toposlice.cli import build_parser
    from toposlice.discovery_worker import DiscoveryWorker

    if __name__ == "__main__":
        args = build_parser().parse_args(["graph", "--fake", "cpu-2s"])
        worker = DiscoveryWorker(args, "n1")
        try:
            snap = worker.snapshot()
            print(os.getpid(), len(snap.devices))
        finally:
            worker.close()
    """
)


def _run(tmp_path: Path, prefix: list[str]) -> tuple[int, int]:
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run(
        [*prefix, sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    pid, devices = res.stdout.split()
    return int(pid), int(devices)


def test_helper_answers(tmp_path: Path) -> None:
    _, devices = _run(tmp_path, [])
    assert devices > 0


def test_helper_answers_when_the_server_is_pid_1(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a PID namespace")
    probe = subprocess.run([unshare, "-p", "-f", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("PID namespaces are not available here")
    pid, devices = _run(tmp_path, [unshare, "-p", "-f"])
    assert pid == 1 and devices > 0
