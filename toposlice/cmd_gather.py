"""``toposlice gather``: archive what discovery reads, for bug reports and CI replays.

The archive replays with ``--gathered FILE`` (or ``--root DIR`` after
``tar xzf FILE -C DIR``) on any machine. After writing it the command replays it and
says whether the replay gives the same inventory as the host (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from discovery.model import Inventory


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--root",
        "--sysfs-root",
        dest="root",
        metavar="DIR",
        help="filesystem root to gather (sysfs at DIR/sys); default: $HOST_ROOT, else this host",
    )
    src.add_argument(
        "--fake",
        metavar="NAME",
        help="gather a fake machine's generated tree and its fake NVML (tests, examples)",
    )
    from toposlice.output import add_output_file_arg

    add_output_file_arg(p, "the archive (.tar.gz)", required=True)
    p.add_argument(
        "--include-serials",
        action="store_true",
        help="keep MAC addresses, GUIDs, GPU UUIDs and other serial-like ids (default: pseudonyms)",
    )
    p.add_argument(
        "--probes", metavar="LIST", help="comma-separated probe names to run (default: all)"
    )
    p.add_argument(
        "--no-check", action="store_true", help="do not replay the archive to compare with the host"
    )


def _discoverer(probes: Sequence[str] | None) -> Callable[[str, Any], Inventory]:
    from toposlice.discover import discover

    def run(root: str, nvml: Any) -> Inventory:
        return discover(root, probes=probes, nvml=nvml, live=False)

    return run


def _host_pynvml(root: str) -> Callable[[], Any]:
    """The host's pynvml, loaded the way the nvidia probe loads it (same messages)."""

    def load() -> Any:
        from discovery.root import Root
        from plugins.base import ProbeContext
        from plugins.nvidia import _load_nvml

        return _load_nvml(ProbeContext(root=Root(root, True), host=Inventory(), nvml=None))

    return load


def gather_source(
    root: str | None,
    fake: str | None,
    output: str,
    *,
    include_serials: bool = False,
    probes: Sequence[str] | None = None,
    check: bool = True,
) -> tuple[Any, Inventory | None]:
    """(GatherResult, the inventory the host gives directly -- None without ``check``)."""
    from discovery.gather import gather
    from toposlice.discover import discover
    from toposlice.sources import host_root

    run = _discoverer(probes)
    if fake is not None:
        from discovery.fake import fake_host

        with fake_host(fake) as host:
            fake_nvml = host.nvml
            result = gather(
                str(host.root),
                run,
                include_serials=include_serials,
                nvml=(lambda: fake_nvml) if fake_nvml is not None else None,
            )
            reference = discover(str(host.root), probes=probes, nvml=fake_nvml) if check else None
        _write(output, result.data)
        return result, reference
    path = os.path.abspath(host_root(root))
    live = path == "/"
    live_inv = discover(path, probes=probes) if live else None
    result = gather(
        path,
        run,
        include_serials=include_serials,
        nvml=_host_pynvml(path) if live else None,
        live_inventory=live_inv,
    )
    reference = (live_inv or discover(path, probes=probes)) if check else None
    _write(output, result.data)
    return result, reference


def _write(output: str, data: bytes) -> None:
    """The archive to ``output`` atomically, or to stdout for ``-``."""
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    from toposlice.output import OUTPUT_FILE, write_output_file

    write_output_file(OUTPUT_FILE, output, data)


def run(args: argparse.Namespace) -> int:
    from discovery.gather import compare_inventories
    from toposlice.output import OUTPUT_FILE, check_output_file
    from toposlice.replay import discover_gathered
    from toposlice.sources import check_fake, host_root, probe_list

    probes = probe_list(args.probes)
    output = args.output_file
    if output != "-":  # a typo in the path: no directories made for it
        check_output_file(OUTPUT_FILE, output)
    if args.fake is not None:
        check_fake(args.fake)
    elif not os.path.isdir(host_root(args.root)):
        flag = "--root" if args.root else "$HOST_ROOT"
        raise ValueError(f"{flag} {host_root(args.root)}: no such directory")
    result, reference = gather_source(
        args.root,
        args.fake,
        output,
        include_serials=args.include_serials,
        probes=probes,
        check=not args.no_check and output != "-",
    )
    out = sys.stderr if output == "-" else sys.stdout
    print(
        f"toposlice gather: wrote {output}: {result.files} files, {result.links} symlinks, "
        f"{result.dirs} directories, {result.size_bytes} bytes"
        + (", NVML answers" if result.nvml else "")
        + (f", {result.redacted} serial-like values replaced" if result.redacted else ""),
        file=out,
    )
    if reference is None:
        return 0
    replay = discover_gathered(output, probes=probes)
    diffs = compare_inventories(
        reference.to_dict(), replay.to_dict(), redacted=not args.include_serials
    )
    if diffs:
        print(
            f"toposlice: warning: the replay differs from the host in: {', '.join(diffs)}",
            file=sys.stderr,
        )
        return 1
    print("toposlice gather: the replay gives the host's inventory", file=out)
    return 0
