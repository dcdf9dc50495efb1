"""``toposlice`` command line: discover | slices | graph, and the module commands.

Imports are deferred into each command, and only the running command's options are
built (start-up cost: docs/performance.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

from toposlice.sources import (
    add_node_name_arg,
    add_normalize_args,
    add_source_args,
    check_source,
    load_inventory,
    normalize_options,
)

COMMANDS = ("discover", "slices", "graph")
QUIET_HELP = "do not repeat inventory warnings on stderr"

#: Commands that live in a module of their own: name -> (module, one-line help). The
#: module has ``add_arguments(parser)`` and ``run(args) -> int``; it is imported only
#: when its command runs (or for the full ``--help``).
MODULE_COMMANDS: dict[str, tuple[str, str]] = {
    "gather": ("toposlice.cmd_gather", "archive the files discovery reads (replay: --gathered)"),
    "machines": ("toposlice.cmd_machines", "list the fake machines, or capture a host as one"),
    "score": ("toposlice.cmd_score", "rank placements of a workload on topology graphs"),
    "claim": ("toposlice.cmd_claim", "a prioritized-list claim for N GPUs with NICs"),
    "scorer": (
        "toposlice.cmd_scorer",
        "placement scorer services (serve: kube-scheduler extender)",
    ),
    "serve": ("toposlice.cmd_serve", "serve the topology, metrics and page over HTTP"),
    "doctor": ("toposlice.cmd_doctor", "check other DRA drivers' slices against the hardware"),
    "run": ("toposlice.cmd_run", "run the DRA kubelet plugin (slices, claims, health)"),
    "nccl-topo": ("toposlice.cmd_nccl_topo", "print the NCCL topology XML claims get"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with ``only`` the options of that one command (``--help`` of
    the top level still lists every command)."""
    parser = argparse.ArgumentParser(
        prog="toposlice",
        description="Describe accelerator-node topology to Kubernetes (DRA ResourceSlices).",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    def wanted(name: str) -> bool:
        return only is None or only == name

    def add_parser(name: str, help_text: str) -> argparse.ArgumentParser:
        # -q also after the command; SUPPRESS keeps the top level's value when absent.
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP
        )
        return p

    p = add_parser("discover", "read the node and print its inventory")
    if wanted("discover"):
        _discover_args(p)

    p = add_parser("slices", "print the node's ResourceSlices (resource.k8s.io/v1)")
    if wanted("slices"):
        add_source_args(p)
        add_normalize_args(p)
        add_node_name_arg(p)
        p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")

    p = add_parser("graph", "print the node's topology graph")
    if wanted("graph"):
        add_source_args(p)
        add_normalize_args(p)
        add_node_name_arg(p)
        p.add_argument("-o", "--output", choices=["table", "json", "yaml", "dot"], default="table")

    for name, (module, help_text) in MODULE_COMMANDS.items():
        p = add_parser(name, help_text)
        if only == name:
            import_module(module).add_arguments(p)
    return parser


def _discover_args(p: argparse.ArgumentParser) -> None:
    add_source_args(p)
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml", "fidelity"],
        default="table",
        help="fidelity = hwloc's topology-fidelity/v1 view, to score against lstopo truths",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    known = command in COMMANDS or command in MODULE_COMMANDS
    args = build_parser(command if known else None).parse_args(argv)
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
        # Bad input (a flag, a file): one line, no traceback.
        print(f"toposlice: error: {one_line(exc)}", file=sys.stderr)
        return 2


def one_line(exc: BaseException) -> str:
    """An error for people, in one line: an OSError as "file: reason" (not "[Errno 2] ..."),
    a wrapped PyYAML error as what and where, other text with its line breaks folded."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc)
        cause = exc.__cause__
        if cause is not None and type(cause).__module__.startswith("yaml") and str(cause) in text:
            from driver.config import yaml_error_line  # PyYAML's text spans lines, with a snippet

            text = text.split(str(cause))[0] + yaml_error_line(cause)
    return " ".join(text.split()) or type(exc).__name__


def _run(args: argparse.Namespace) -> int:
    if args.command in MODULE_COMMANDS:
        rc: int = import_module(MODULE_COMMANDS[args.command][0]).run(args)
        return rc

    from toposlice.output import dump

    check_source(args)
    inv = load_inventory(args)
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

    opts = normalize_options(args)
    if args.command == "slices":
        from driver.config import check_names
        from normalize.slices import build_slices_reported
        from toposlice.sources import node_name_of

        node = node_name_of(args, inv)
        check_names(node, opts.driver)  # names the API server would refuse: say so
        slices, dropped = build_slices_reported(inv, node, opts)
        for drop in dropped:  # over an API limit: never left out without a word
            print(f"toposlice: warning: not published in full: {drop.message()}", file=sys.stderr)
        dump(slices, args.output)
        return 0

    from normalize.graph import build_graph
    from toposlice.render import graph_table, graph_to_dot

    # Node and pool follow --node-name as in `slices`; without it, the host's names.
    graph = build_graph(inv, opts, node_name=args.node_name)
    if args.output == "table":
        sys.stdout.write(graph_table(graph))
    elif args.output == "dot":
        sys.stdout.write(graph_to_dot(graph))
    else:
        dump(graph, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
