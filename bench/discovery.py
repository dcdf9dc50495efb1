#!/usr/bin/env python3
"""Discovery speed on every hwloc fixture, side by side with lstopo, in one run.

For each case it times, as medians of N runs after one warm-up:
  lstopo     HWLOC_COMPONENTS=linux,stop HWLOC_FSROOT=ROOT lstopo-no-graphics
             --of xml --whole-io --disallowed -   (whole process, output to /dev/null)
  inproc     toposlice.discover.discover(ROOT) in this process: the daemon's
             rediscovery path (sysfs backends + every probe)
  cold       `python -m toposlice discover --sysfs-root ROOT -o json` as a new process
  cold-net   cold minus a bare `python -c pass` of the same interpreter (site included)
  lean       the same CLI run with `python -S` (no site-packages start-up hooks: a lean
             container's interpreter; discover needs only the standard library)
and prints the ratios inproc/lstopo and cold/lstopo. Targets (issue #2): inproc not
slower than lstopo on any case; cold CLI under 150 ms.

Usage: python3 bench/discovery.py [--runs 15] [--fixtures DIR] [--case NAME ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hack.hwloc_fixtures import case_env, extract_case, hwloc_cases  # noqa: E402
from toposlice.discover import discover  # noqa: E402

LEAN = (
    "import sys; sys.path.insert(0, {repo!r}); from toposlice.cli import main; "
    "sys.exit(main(['discover', '--sysfs-root', {root!r}, '-o', 'json']))"
)


def median_ms(fn: object, runs: int) -> float:
    assert callable(fn)
    fn()  # warm-up: page cache, imports
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def run_process(cmd: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument(
        "--fixtures",
        type=Path,
        help="dumps folder (default: tests/data/hwloc plus ../shared extras)",
    )
    ap.add_argument("--case", action="append", help="only these cases")
    args = ap.parse_args()

    lstopo = shutil.which("lstopo-no-graphics") or shutil.which("lstopo")
    if lstopo is None:
        print("lstopo not found: apt-get install hwloc-nox", file=sys.stderr)
    py = sys.executable
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # An installed package ships bytecode; a source checkout under
    # PYTHONDONTWRITEBYTECODE=1 would otherwise recompile every module on each start.
    import compileall

    for pkg in ("toposlice", "discovery", "plugins", "normalize", "driver"):
        compileall.compile_dir(str(REPO / pkg), quiet=1)
    baseline = median_ms(lambda: run_process([py, "-c", "pass"], env), args.runs)
    lean_base = median_ms(lambda: run_process([py, "-S", "-c", "pass"], env), args.runs)

    print(f"python: {py}  lstopo: {lstopo}  runs: {args.runs} (median ms)")
    print(f"interpreter start-up: python -c pass {baseline:.1f} ms, python -S {lean_base:.1f} ms")
    hdr = f"{'case':<34}{'lstopo':>8}{'inproc':>8}{'cold':>8}{'cold-net':>9}{'lean':>7}"
    print(hdr + f"{'inproc/lstopo':>15}{'cold/lstopo':>13}")
    worst_ratio = 0.0
    worst_cold = 0.0
    worst_lean = 0.0
    with tempfile.TemporaryDirectory(prefix="toposlice-bench-") as tmp:
        for case in args.case or hwloc_cases(args.fixtures):
            root = extract_case(case, Path(tmp) / case, args.fixtures)
            lst = float("nan")
            if lstopo:
                lenv = dict(os.environ, HWLOC_COMPONENTS="linux,stop", HWLOC_FSROOT=str(root))
                lenv.update(case_env(case, args.fixtures))
                cmd = [lstopo, "--of", "xml", "--whole-io", "--disallowed", "-"]
                lst = median_ms(lambda cmd=cmd, lenv=lenv: run_process(cmd, lenv), args.runs)
            inproc = median_ms(lambda root=root: discover(str(root)), args.runs)
            cli = [py, "-m", "toposlice", "discover", "--sysfs-root", str(root), "-o", "json"]
            cold = median_ms(lambda cli=cli: run_process(cli, env), args.runs)
            lean_cli = [py, "-S", "-c", LEAN.format(repo=str(REPO), root=str(root))]
            lean = median_ms(lambda lean_cli=lean_cli: run_process(lean_cli, env), args.runs)
            worst_lean = max(worst_lean, lean)
            ratio = inproc / lst
            worst_ratio = max(worst_ratio, ratio)
            worst_cold = max(worst_cold, cold)
            print(
                f"{case:<34}{lst:>8.1f}{inproc:>8.1f}{cold:>8.1f}"
                f"{cold - baseline:>9.1f}{lean:>7.1f}"
                f"{ratio:>15.2f}{cold / lst:>13.2f}"
            )
    print(f"worst inproc/lstopo: {worst_ratio:.2f} (target <= 1.00)")
    print(
        f"worst cold CLI: {worst_cold:.1f} ms, {worst_cold - baseline:.1f} ms above interpreter "
        "start-up (target < 150 ms)"
    )
    print(f"worst lean cold CLI (python -S): {worst_lean:.1f} ms (target < 150 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
