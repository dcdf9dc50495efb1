#!/usr/bin/env python3
"""Record what ``discover``, ``slices`` and ``graph`` print on every fake machine and
every hwloc fixture dump, in every output format, so a refactor can prove it changed
nothing.

Usage:
  python3 hack/record_outputs.py DIR            write one file per (source, command, format)
  python3 hack/record_outputs.py --compare DIR  record afresh and diff against DIR
  python3 hack/record_outputs.py --checksums    rewrite tests/data/outputs.sha256

The extraction directory is replaced by ``<ROOT>`` so records do not depend on where a
dump was unpacked. ``tests/test_outputs_pinned.py`` holds the checksums.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hack.hwloc_fixtures import HWLOC, extract_all  # noqa: E402

CHECKSUMS = REPO / "tests" / "data" / "outputs.sha256"

#: (command, output formats); slices gets a fixed node name so the host name of the
#: machine recording does not leak in.
COMMANDS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("discover", ("table", "json", "yaml", "fidelity"), ()),
    ("slices", ("yaml", "json"), ("--node-name", "node-a")),
    ("graph", ("table", "json", "yaml", "dot"), ()),
]


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    from toposlice.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except Exception as exc:  # a crash is an output too: record it, go on
            rc = -1
            err.write(f"EXCEPTION {type(exc).__name__}: {exc}\n")
    return rc, out.getvalue(), err.getvalue()


def sources(roots: dict[str, Path]) -> Iterator[tuple[str, list[str], str | None]]:
    """(label, source flags, root path to mask) for every fake machine and hwloc dump."""
    from discovery.fake import list_machines

    for name in list_machines():
        yield f"fake-{name}", ["--fake", name], None
    for case, root in roots.items():
        yield f"hwloc-{case}", ["--sysfs-root", str(root)], str(root)


@contextlib.contextmanager
def discover_once() -> Iterator[None]:
    """Every command of one source reuses that source's first inventory (a copy): the
    output is the same and recording takes a fraction of the time (the test uses it)."""
    import copy

    from toposlice import sources

    real = sources.load_inventory
    cache: dict[tuple[object, ...], Any] = {}

    def cached(args: argparse.Namespace) -> Any:
        key = (args.fake, args.root, args.inventory, args.probes)
        if key not in cache:
            cache[key] = real(args)
        return copy.deepcopy(cache[key])

    sources.load_inventory = cached  # type: ignore[assignment]
    try:
        yield
    finally:
        sources.load_inventory = real  # type: ignore[assignment]


def record_sources(roots: dict[str, Path], shared: bool = False) -> dict[str, str]:
    """file name -> content (stdout, then the exit status and stderr)."""
    out: dict[str, str] = {}
    with discover_once() if shared else contextlib.nullcontext():
        for label, flags, mask in sources(roots):
            for command, formats, extra in COMMANDS:
                for fmt in formats:
                    rc, stdout, stderr = _run_cli([command, *flags, *extra, "-o", fmt])
                    text = f"{stdout}\n--- rc={rc} stderr:\n{stderr}"
                    if mask:
                        text = text.replace(mask, "<ROOT>")
                    out[f"{label}.{command}.{fmt}"] = text
    return out


def record(shared: bool = False) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="toposlice-record-") as tmp:
        roots = extract_all(Path(tmp)) if HWLOC.exists() else {}
        return record_sources(roots, shared)


def checksums(records: dict[str, str]) -> str:
    lines = [
        f"{hashlib.sha256(text.encode()).hexdigest()}  {name}\n"
        for name, text in sorted(records.items())
    ]
    return "".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dir", nargs="?", type=Path)
    ap.add_argument("--compare", action="store_true", help="diff a fresh record against DIR")
    ap.add_argument("--checksums", action="store_true", help=f"rewrite {CHECKSUMS.name}")
    ap.add_argument(
        "--discover-once", action="store_true", help="discover each source once (as the test)"
    )
    args = ap.parse_args()
    records = record(args.discover_once)
    if args.checksums:
        CHECKSUMS.write_text(checksums(records))
        print(f"wrote {len(records)} checksums to {CHECKSUMS}")
    if args.dir is None:
        return 0
    if not args.compare:
        args.dir.mkdir(parents=True, exist_ok=True)
        for name, text in records.items():
            (args.dir / name).write_text(text)
        print(f"wrote {len(records)} records to {args.dir}")
        return 0
    import difflib

    differ = 0
    old_names = {p.name for p in args.dir.iterdir()}
    for name in sorted(old_names | set(records)):
        old = (args.dir / name).read_text() if name in old_names else ""
        new = records.get(name, "")
        if old != new:
            differ += 1
            diff = difflib.unified_diff(
                old.splitlines(True), new.splitlines(True), f"before/{name}", f"after/{name}", n=1
            )
            sys.stdout.writelines(list(diff)[:40])
    print(f"{len(records)} records, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
