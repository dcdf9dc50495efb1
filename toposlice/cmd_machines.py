"""``toposlice machines [list]`` and ``toposlice machines capture``.

``list`` (the default) prints the built-in fake machines. ``capture`` writes a machine
file in the fake format from a live host, a dump, a gathered archive or a saved
inventory: ``--fake node.yaml`` then generates a machine that discovery reads back as
the same inventory (docs/fake-hardware.md, "Captured machines"). After writing, the
file is loaded, generated and discovered once more; differences go to stderr and make
the exit status 1.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    import argparse as ap

    from toposlice.cli import examples

    sub = p.add_subparsers(dest="machines_command", metavar="{list,capture}")
    sub.add_parser(
        "list",
        help="list the built-in fake machines (the default)",
        description="List the built-in fake machines (names for --fake).",
        epilog=examples("toposlice machines list"),
        formatter_class=ap.RawDescriptionHelpFormatter,
    )
    cap = sub.add_parser(
        "capture",
        help="write a machine YAML that reproduces a host",
        description="Write a fake-machine YAML that reproduces a host (--fake FILE replays it).",
        epilog=examples(
            "toposlice machines capture --output-file node.yaml",
            "toposlice machines capture --gathered node.tar.gz --output-file node.yaml",
        ),
        formatter_class=ap.RawDescriptionHelpFormatter,
    )
    from toposlice.output import add_output_file_arg
    from toposlice.sources import add_source_args

    add_source_args(cap)
    cap.add_argument(
        "-o",
        "--output",
        choices=["yaml"],
        default="yaml",
        help="format: the fake-machine YAML `--fake FILE` reads, the only one "
        "(default %(default)s)",
    )
    add_output_file_arg(cap, "the machine file")
    cap.add_argument(
        "--no-check", action="store_true", help="do not regenerate the machine to compare"
    )


def run(args: argparse.Namespace) -> int:
    if getattr(args, "machines_command", None) != "capture":
        from discovery.fake import list_machines

        for name in list_machines():
            print(name)
        return 0
    return _capture(args)


def _origin(args: argparse.Namespace) -> str:
    for flag in ("inventory", "gathered", "fake"):
        value = getattr(args, flag, None)
        if value:
            return f"--{flag} {value}"
    from toposlice.sources import host_root

    root = host_root(getattr(args, "root", None))
    return "this host" if root == "/" else f"--root {root}"


def _capture(args: argparse.Namespace) -> int:
    from toposlice.capture import capture_yaml
    from toposlice.output import OUTPUT_FILE, check_output_file, write_output_file
    from toposlice.sources import check_source, load_inventory

    check_source(args)
    if args.output_file:
        check_output_file(OUTPUT_FILE, args.output_file)
    inv = load_inventory(args)
    text = capture_yaml(inv, _origin(args))
    if args.output_file:
        write_output_file(OUTPUT_FILE, args.output_file, text.encode())
    else:
        sys.stdout.write(text)
    if args.no_check:
        return 0
    diffs = _check(inv, text)
    if diffs:
        print(
            "toposlice: warning: the captured machine differs from the source in: "
            + ", ".join(diffs),
            file=sys.stderr,
        )
        return 1
    return 0


def _check(inv: object, text: str) -> list[str]:
    from discovery.fake import fake_host, load_yaml
    from discovery.model import Inventory
    from toposlice.capture import capture_differences
    from toposlice.discover import discover

    assert isinstance(inv, Inventory)
    spec = load_yaml(text, source="<capture>")
    with fake_host(spec) as host:
        replayed = discover(str(host.root), nvml=host.nvml)
    return capture_differences(inv, replayed)
