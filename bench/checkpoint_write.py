#!/usr/bin/env python3
"""What a durable checkpoint write costs, per on-disk layout (issue #21 item 7).

Every prepare and unprepare ends with one checkpoint write; with the boot id known it is
temp file + write + fsync + rename over the old file (driver/checkpoint.py). This
measures that against the layouts a different checkpoint format could use, on the
filesystem of ``--dir`` (default: a temp dir under /var/tmp, i.e. the disk, not tmpfs),
taking turns write by write so that all see the same disk load:

  rename+fsync    what the driver does: temp, write, fsync, rename onto the name
  rename+fdatasync  the same with fdatasync (size and mtime of a new inode still commit)
  rename          temp, write, rename: no flush (enough against kill -9, not power loss)
  overwrite       pwrite the whole record over a preallocated file of fixed size +
                  fdatasync: same inode, same size, no journal commit
  append          append the record to a log + fdatasync (a journal: size changes)

Each write is ``--size`` bytes (a checkpoint of a few claims is 1-3 kB). Prints p50 / p99.

Usage: python3 bench/checkpoint_write.py [--writes 1000] [--size 2048] [--dir DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # bench/http.py would shadow the standard library's http package

import argparse
import os
import tempfile
import time
from collections.abc import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.stats import pct  # noqa: E402
from driver.atomic import write_atomic  # noqa: E402


def layouts(d: Path, size: int) -> dict[str, Callable[[bytes], None]]:
    final = d / "checkpoint.json"
    log_fd = os.open(d / "journal.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    slot = 1 << max(12, (size - 1).bit_length())
    over_fd = os.open(d / "fixed.bin", os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(over_fd, b"\0" * slot, 0)  # allocated and written once: later writes overwrite
    os.fsync(over_fd)

    def rename_fsync(data: bytes) -> None:
        write_atomic(final, data, mode=0o600, sync=True, sync_dir=False)

    def rename_fdatasync(data: bytes) -> None:
        tmp = d / ".checkpoint.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)

    def rename_only(data: bytes) -> None:
        write_atomic(final, data, mode=0o600, sync=False)

    def overwrite(data: bytes) -> None:
        os.pwrite(over_fd, data.ljust(slot, b"\0"), 0)
        os.fdatasync(over_fd)

    def append(data: bytes) -> None:
        os.write(log_fd, data)
        os.fdatasync(log_fd)

    return {
        "rename+fsync": rename_fsync,
        "rename+fdatasync": rename_fdatasync,
        "rename": rename_only,
        "overwrite": overwrite,
        "append": append,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writes", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsb-ckpt-", dir=args.dir or "/var/tmp") as d:
        fns = layouts(Path(d), args.size)
        times: dict[str, list[float]] = {k: [] for k in fns}
        data = b"x" * (args.size - 1) + b"\n"
        for k in range(args.writes + args.warmup):
            order = list(fns) if k % 2 else list(reversed(fns))
            for name in order:
                t = time.perf_counter()
                fns[name](data)
                if k >= args.warmup:
                    times[name].append(time.perf_counter() - t)
        fs = os.statvfs(d)
        print(
            f"checkpoint write of {args.size} B, {args.writes} each, taking turns, in {d} "
            f"(block size {fs.f_bsize})"
        )
        for name, t in times.items():
            print(f"{name:17} p50 {pct(t, 50) * 1e3:6.3f} ms  p99 {pct(t, 99) * 1e3:6.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
