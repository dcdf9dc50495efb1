"""``toposlice`` command line: discover | slices | graph | machines.

Imports are deferred into each command so a cold ``toposlice discover`` only pays for
what it uses (the kubernetes client alone costs more than a whole discovery).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from discovery.model import Inventory

if TYPE_CHECKING:
    from normalize.options import NormalizeOptions


def _source_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--sysfs-root",
        default="/",
        metavar="DIR",
        help="filesystem root to read (sysfs at DIR/sys); default: this host",
    )
    src.add_argument(
        "--fake",
        metavar="NAME",
        help="run against built-in fake hardware (see `toposlice machines`) or a YAML file",
    )
    src.add_argument(
        "--inventory",
        metavar="FILE",
        help="read a saved `toposlice discover -o json` inventory instead of a host",
    )
    p.add_argument(
        "--probes",
        metavar="LIST",
        help="comma-separated probe names to run (default: all installed)",
    )


def _normalize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--driver", default="toposlice.dev", help="DRA driver name (default %(default)s)"
    )
    p.add_argument(
        "--numa-list",
        action="store_true",
        help="publish numaNode in the list form (needs the DRAListTypeAttributes gate)",
    )
    p.add_argument(
        "--cpu-grouping",
        choices=["numa", "l3", "core"],
        default="numa",
        help="how CPUs are partitioned into devices (default %(default)s)",
    )
    p.add_argument(
        "--legacy-aliases",
        action="store_true",
        help="also publish dra.net/numaNode and dra.cpu/numaNodeID",
    )


COMMANDS = ("discover", "slices", "graph", "machines")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with ``only`` the options of that one command.

    argparse spends ~0.3 ms per option; building just the command being run keeps
    start-up short (``--help`` of the top level still lists every command).
    """
    parser = argparse.ArgumentParser(
        prog="toposlice",
        description="Describe accelerator-node topology to Kubernetes (DRA ResourceSlices).",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="do not repeat inventory warnings on stderr"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def wanted(name: str) -> bool:
        return only is None or only == name

    p = sub.add_parser("discover", help="read the node and print its inventory")
    if wanted("discover"):
        _discover_args(p)

    p = sub.add_parser("slices", help="print the node's ResourceSlices (resource.k8s.io/v1)")
    if wanted("slices"):
        _source_args(p)
        _normalize_args(p)
        p.add_argument("--node-name", help="Kubernetes node name (default: inventory hostname)")
        p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")

    p = sub.add_parser("graph", help="print the node's topology graph")
    if wanted("graph"):
        _source_args(p)
        _normalize_args(p)
        p.add_argument("-o", "--output", choices=["table", "json", "yaml", "dot"], default="table")

    sub.add_parser("machines", help="list the built-in fake machines")
    return parser


def _discover_args(p: argparse.ArgumentParser) -> None:
    _source_args(p)
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml", "fidelity"],
        default="table",
        help="fidelity = hwloc's topology-fidelity/v1 view, to score against lstopo truths",
    )


def _inventory(args: argparse.Namespace) -> Inventory:
    if args.inventory:
        import json

        with open(args.inventory, encoding="utf-8") as fh:
            return Inventory.from_dict(json.load(fh))
    from discovery.discover import discover

    probes = [p.strip() for p in args.probes.split(",") if p.strip()] if args.probes else None
    return discover(args.sysfs_root, fake=args.fake, probes=probes)


def _options(args: argparse.Namespace) -> NormalizeOptions:
    from normalize.options import NormalizeOptions

    return NormalizeOptions(
        driver=args.driver,
        numa_list=args.numa_list,
        cpu_grouping=args.cpu_grouping,
        legacy_aliases=args.legacy_aliases,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    try:
        rc = _run(args)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # `toposlice ... | head`: the reader left; stop quietly, and keep the interpreter's
        # final flush from failing on the closed pipe.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OSError, ValueError) as exc:
        print(f"toposlice: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from toposlice.output import dump

    if args.command == "machines":
        from discovery.fake import list_machines

        for name in list_machines():
            print(name)
        return 0

    inv = _inventory(args)
    if not args.quiet and not (args.command == "discover" and args.output == "table"):
        # The table shows them itself; for machine-readable output they go to stderr too.
        for warning in inv.warnings:
            print(f"toposlice: warning: {warning}", file=sys.stderr)
    if args.command == "discover":
        if args.output == "table":
            from toposlice.output import inventory_table

            sys.stdout.write(inventory_table(inv))
        elif args.output == "fidelity":
            from discovery.fidelity import to_fidelity

            dump(to_fidelity(inv, inv.hostname or ""), "json")
        else:
            dump(inv.to_dict(), args.output)
        return 0

    opts = _options(args)
    if args.command == "slices":
        import socket

        from normalize.slices import build_slices

        node = args.node_name or inv.hostname or socket.gethostname()
        dump(build_slices(inv, node, opts), args.output)
        return 0

    from normalize.graph import build_graph, graph_table, graph_to_dot

    graph = build_graph(inv, opts)
    if args.output == "table":
        sys.stdout.write(graph_table(graph))
    elif args.output == "dot":
        sys.stdout.write(graph_to_dot(graph))
    else:
        dump(graph, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
