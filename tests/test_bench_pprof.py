"""bench/pprof.py: Go CPU profiles read through protobuf, as bench/cluster_scale.py
``--profile`` sums them. One real profile (kube-scheduler v1.36.2, 2 s while a claim
ladder was being scheduled on 1,000 nodes) and synthetic ones with known totals."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from bench import pprof

REPO = Path(__file__).resolve().parent.parent
REAL = REPO / "tests" / "data" / "pprof" / "kube-scheduler-v1.36.2-filter.pb.gz"


def _profile(stacks: list[tuple[list[str], int]]) -> bytes:
    """A profile with one sample per (stack leaf first, CPU ns)."""
    prof = pprof._PROFILE()
    strings = [""]
    funcs: dict[str, int] = {}
    for names, _ in stacks:
        for n in names:
            if n not in funcs:
                strings.append(n)
                funcs[n] = len(funcs) + 1
                prof.function.add(id=funcs[n], name=len(strings) - 1)
                loc = prof.location.add(id=funcs[n])
                loc.line.add(function_id=funcs[n])
    for names, ns in stacks:
        prof.sample.add(location_id=[funcs[n] for n in names], value=[ns // 10_000_000, ns])
    prof.string_table.extend(strings)
    return gzip.compress(prof.SerializeToString())


def test_seconds_under_a_frame_count_each_sample_once() -> None:
    data = _profile(
        [
            (["cel.Eval", "alloc.isSelectable", "alloc.allocateOne", "Filter"], 3_000_000_000),
            (["alloc.allocateOne", "alloc.allocateOne", "Filter"], 1_000_000_000),
            (["gcDrain"], 500_000_000),
        ]
    )
    st = pprof.parse(data)
    assert st.total_s == pytest.approx(4.5)
    assert st.seconds_under("Filter") == pytest.approx(4.0)
    assert st.seconds_under("isSelectable") == pytest.approx(3.0)
    # A recursive frame counts its sample once.
    assert st.seconds_under("allocateOne") == pytest.approx(4.0)
    flat, cum = st.top(2)
    assert flat[0] == ("cel.Eval", pytest.approx(3.0))
    assert dict(cum)["Filter"] == pytest.approx(4.0)
    both = pprof.merge([st, pprof.parse(gzip.decompress(data))])  # plain bytes parse too
    assert both.seconds_under("Filter") == pytest.approx(8.0)


def test_a_real_kube_scheduler_profile() -> None:
    st = pprof.parse(REAL.read_bytes())
    assert 0 < st.total_s < 2.5  # a 2-second profile of a 2-core machine
    filt = st.seconds_under("dynamicresources.(*DynamicResources).Filter")
    cel = st.seconds_under(".(*allocator).isSelectable")
    assert 0 < cel < filt <= st.total_s
    _, cum = st.top(40)
    assert any("incubating.(*Allocator).Allocate" in name for name, _ in cum)


def test_cli_prints_shares_and_refuses_garbage(tmp_path: Path) -> None:
    run = [sys.executable, str(REPO / "bench" / "pprof.py")]
    ok = subprocess.run(
        [*run, str(REAL), "--match", "isSelectable", "--top", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "under isSelectable:" in ok.stdout and "-- cumulative" in ok.stdout
    bad = tmp_path / "bad.pb.gz"
    bad.write_bytes(gzip.compress(b"\xff\xff\xff not a profile"))
    got = subprocess.run([*run, str(bad)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2
    assert got.stderr.startswith("pprof: ") and "Traceback" not in got.stderr
