#!/usr/bin/env python3
"""Cold start of ``toposlice discover --fake MACHINE -o json``: a new process each run.

Times, as median and minimum of N runs after one warm-up (whole process, output to
/dev/null):
  python -c pass   the interpreter's own start-up (site included), for scale
  first run        empty tree cache: the machine's tree is generated and kept
  cached           the tree cache filled (every later run): target <= 250 ms
  cache off        TOPOSLICE_FAKE_CACHE=off: generate the tree and delete it every run
                   (how every run went before the cache)
  console script   the `toposlice` entry point next to this interpreter, cache filled
Then the import cost of one cached run (``python -X importtime``): the sum over every
module and the largest top-level imports.

The cache lives in a temporary folder beside the default one (the same filesystem,
tmpfs when there is one: discovery/fake/cache.py), not in the user's.

Usage: python3 bench/cold_start.py [--machine dgx-h100] [--runs 20]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TARGET_MS = 250.0

from discovery.fake.cache import cache_dir  # noqa: E402


def timed_ms(fn: Callable[[], object], runs: int, warm_up: bool = True) -> tuple[float, float]:
    """(median, min) wall time in ms of ``runs`` calls, after one warm-up call."""
    if warm_up:
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), min(samples)


def run(cmd: list[str], env: dict[str, str]) -> None:
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)


def import_times(cmd: list[str], env: dict[str, str]) -> tuple[float, list[tuple[float, str]]]:
    """Total self time of every import (ms) and the top-level imports by cumulative time."""
    err = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        check=True,
    ).stderr
    total, top = 0.0, []
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:") :].split("|")
        total += int(self_us) / 1000
        if not name.startswith("  "):  # a top-level import (indented names are nested)
            top.append((int(cumulative_us) / 1000, name.strip()))
    return total, sorted(top, reverse=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--machine", default="dgx-h100")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    py = sys.executable
    # An installed package ships bytecode; a checkout under PYTHONDONTWRITEBYTECODE=1
    # would otherwise recompile every module on each start.
    for pkg in ("toposlice", "discovery", "plugins", "normalize", "driver"):
        compileall.compile_dir(str(REPO / pkg), quiet=1)
    cli = [py, "-m", "toposlice", "discover", "--fake", args.machine, "-o", "json"]
    script = Path(py).parent / "toposlice"
    print(f"python: {py}  machine: {args.machine}  runs: {args.runs} (ms: median / min)")

    default = cache_dir()
    parent = default.parent if default is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-cache-", dir=parent) as tmp:
        print(f"cache: {tmp}")
        env = dict(os.environ, PYTHONPATH=str(REPO), TOPOSLICE_FAKE_CACHE=tmp)
        rows: list[tuple[str, tuple[float, float]]] = []
        rows.append(("python -c pass", timed_ms(lambda: run([py, "-c", "pass"], env), args.runs)))

        counter = iter(range(1 << 30))

        def first_run() -> None:
            fresh = dict(env, TOPOSLICE_FAKE_CACHE=f"{tmp}/first-{next(counter)}")
            run(cli, fresh)

        rows.append(("first run (empty cache)", timed_ms(first_run, args.runs)))
        cached = timed_ms(lambda: run(cli, env), args.runs)
        rows.append(("cached (every later run)", cached))
        off = dict(env, TOPOSLICE_FAKE_CACHE="off")
        rows.append(("cache off", timed_ms(lambda: run(cli, off), args.runs)))
        if script.is_file():
            cmd = [str(script), *cli[3:]]
            rows.append(("console script, cached", timed_ms(lambda: run(cmd, env), args.runs)))
        for label, (median, fastest) in rows:
            print(f"  {label:<26}{median:>8.1f}{fastest:>8.1f}")
        print(f"cached cold start: {cached[0]:.1f} ms median (target <= {TARGET_MS:.0f} ms)")

        total, top = import_times(cli, env)
        print(f"imports of one cached run: {total:.1f} ms in all; largest top-level:")
        for cumulative, name in top[:8]:
            print(f"  {name:<32}{cumulative:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
