"""bench/cluster_scale.heavy_lock under ``flock FILE python3 bench/...`` (how the heavy
benches are wrapped so two never run at once): the bench inherits flock(1)'s descriptor,
whose open file already holds the lock, and must not wait on it forever; alone, it still
waits for another holder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENTER = (
    "import sys; sys.path.insert(0, {repo!r}); from bench.cluster_scale import heavy_lock\n"
    "with heavy_lock({lock!r}): print('in')"
)

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="no flock(1)")


def _enter(lock: Path, *wrap: str) -> subprocess.CompletedProcess[str]:
    code = ENTER.format(repo=str(REPO), lock=str(lock))
    return subprocess.run(
        [*wrap, sys.executable, "-c", code], capture_output=True, text=True, timeout=20
    )


def test_nested_under_flock_does_not_deadlock(tmp_path: Path) -> None:
    lock = tmp_path / "heavy.lock"
    proc = _enter(lock, "flock", str(lock))
    assert proc.returncode == 0 and proc.stdout.strip() == "in", proc.stderr


def test_alone_waits_for_another_holder(tmp_path: Path) -> None:
    lock = tmp_path / "heavy.lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "1.5"])
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0:
            assert time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        t0 = time.monotonic()
        proc = _enter(lock)
        assert proc.returncode == 0, proc.stderr
        assert time.monotonic() - t0 >= 0.5
    finally:
        holder.wait(timeout=10)
