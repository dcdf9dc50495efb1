"""``toposlice`` command line: discover | slices | graph, and the module commands.

Imports are deferred into each command, and only the running command's options are
built (start-up cost: docs/performance.md).
"""

from __future__ import annotations

# Only what main() needs before its try: a Ctrl-C during the imports below must end as
# quietly as one during the command (exit 130, no traceback), so they happen inside it.
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

COMMANDS = ("discover", "slices", "graph")
QUIET_HELP = "do not repeat inventory warnings on stderr"
#: Exit status after Ctrl-C (SIGINT): 128 + 2, what a shell reports for a process it killed.
INTERRUPTED = 130

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
    "completion": ("toposlice.cmd_completion", "print the shell completion script"),
}

#: One example per command, shown under its ``--help``.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "discover": ("toposlice discover --fake dgx-h100", "toposlice discover -o yaml > node.yaml"),
    "slices": (
        "toposlice slices --fake dgx-h100 --node-name node-a | kubectl apply -f -",
        "toposlice slices --node-name node-a -o json > slices.json",
    ),
    "graph": ("toposlice graph --fake dgx-h100", "toposlice graph -o dot | dot -Tsvg > node.svg"),
    "gather": (
        "toposlice gather --output-file node.tar.gz",
        "toposlice discover --gathered node.tar.gz",
    ),
    "machines": ("toposlice machines", "toposlice machines capture --output-file node.yaml"),
    "score": (
        "toposlice score --request examples/requests/tp4-training.yaml --fake dgx-h100",
        "toposlice score --request req.yaml --fake dgx-h100 --devices GPU0,GPU1",
    ),
    "claim": (
        "toposlice claim --gpus 4 --nics-per-gpu 1 --fake dgx-h100",
        "toposlice claim --gpus 2 --nics-per-gpu 1 --pattern tensor-parallel --fake pcie-8gpu",
    ),
    "scorer": ("toposlice scorer serve --no-kube --fake dgx-h100:node-a --http-addr :8090",),
    "serve": ("toposlice serve --fake dgx-h100 --http-addr 127.0.0.1:8080",),
    "doctor": ("toposlice doctor --node-name node-a --slices slices.yaml",),
    "run": ("toposlice run --node-name node-a --kubeconfig ~/.kube/config --http-addr :8080",),
    "nccl-topo": (
        "toposlice nccl-topo --fake dgx-h100 --devices GPU0,GPU1,NIC0 --output-file topo.xml",
    ),
    "completion": ('eval "$(toposlice completion bash)"   # in ~/.bashrc',),
    "help": ("toposlice help serve   # = toposlice serve --help",),
}

BUILTIN_HELP = {
    "discover": "read the node and print its inventory",
    "slices": "print the node's ResourceSlices (resource.k8s.io/v1)",
    "graph": "print the node's topology graph",
}
HELP_HELP = "show the help of a command (toposlice help serve)"


def examples(*lines: str) -> str:
    """An ``--help`` epilog: the example command lines."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib import metadata

    from toposlice import __version__

    try:
        return metadata.version("toposlice")
    except metadata.PackageNotFoundError:
        return __version__


def _version_action() -> type:
    import argparse

    class VersionAction(argparse.Action):
        """``--version``, looked up only when asked (importlib.metadata costs start-up)."""

        def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
            super().__init__(
                option_strings,
                dest,
                nargs=0,
                default=argparse.SUPPRESS,
                help=kwargs.get("help"),  # type: ignore[arg-type]
            )

        def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
            # stdout, as argparse's own version action and every other tool print it
            print(f"toposlice {version()}", flush=True)
            parser.exit()

    return VersionAction


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with ``only`` the options of that one command (``--help`` of
    the top level still lists every command); ``only="*"``: every command's options
    (shell completion)."""
    import argparse

    from toposlice.sources import add_node_name_arg, add_normalize_args, add_source_args

    parser = argparse.ArgumentParser(
        prog="toposlice",
        description="Describe accelerator-node topology to Kubernetes (DRA ResourceSlices).",
        epilog=examples(*EXAMPLES["discover"][:1], *EXAMPLES["slices"][:1], *EXAMPLES["help"]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action=_version_action(), help="print the installed version and exit"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def wanted(name: str) -> bool:
        return only in (None, "*", name)

    def add_parser(name: str, help_text: str) -> argparse.ArgumentParser:
        # -q also after the command; SUPPRESS keeps the top level's value when absent.
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=examples(*EXAMPLES[name]),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP
        )
        return p

    p = add_parser("discover", BUILTIN_HELP["discover"])
    if wanted("discover"):
        _discover_args(p)

    p = add_parser("slices", BUILTIN_HELP["slices"])
    if wanted("slices"):
        add_source_args(p)
        add_normalize_args(p)
        add_node_name_arg(p)
        p.add_argument(
            "-o",
            "--output",
            choices=["yaml", "json"],
            default="yaml",
            help="yaml: one document per slice (a stream, as kubectl apply -f reads it); "
            "json: a v1 List of them, as kubectl get -o json prints several objects "
            "(default %(default)s)",
        )

    p = add_parser("graph", BUILTIN_HELP["graph"])
    if wanted("graph"):
        add_source_args(p)
        add_normalize_args(p)
        add_node_name_arg(p)
        p.add_argument(
            "-o",
            "--output",
            choices=["table", "json", "yaml", "dot"],
            default="table",
            help="table: the relation matrix; json/yaml: the toposlice.graph/v1 document; "
            "dot: Graphviz (default %(default)s)",
        )

    for name, (module, help_text) in MODULE_COMMANDS.items():
        p = add_parser(name, help_text)
        if wanted(name) and only is not None:
            from importlib import import_module

            import_module(module).add_arguments(p)
    p = add_parser("help", HELP_HELP)
    p.add_argument("topic", nargs="*", metavar="COMMAND", help="the command (and subcommand)")
    return parser


def _discover_args(p: argparse.ArgumentParser) -> None:
    from toposlice.sources import add_source_args

    add_source_args(p)
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml", "fidelity"],
        default="table",
        help="table: for people; json/yaml: the inventory (--inventory reads it back); "
        "fidelity: hwloc's topology-fidelity/v1 view, to score against lstopo truths "
        "(default %(default)s)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; the exit status. Ctrl-C anywhere in it (imports included) ends it
    with 130 and nothing on the terminal, as an interrupted shell command does."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        _close_stdout()
        if argv is None:  # the real command line
            exit_interrupted()
        return INTERRUPTED


def exit_interrupted() -> None:
    """Exit 130 now. The ``finally`` blocks ran while the interrupt unwound; what is left
    is the interpreter's exit, which CPython turns into death by SIGINT (status -2 to
    the parent, not 130) when the interrupt went through one of its ``PyRun`` frames
    (an extension module's import), and which a second Ctrl-C would interrupt."""
    import os

    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(INTERRUPTED)


def _close_stdout() -> None:
    """Flush what was written; a reader that left (or a Ctrl-C mid-write) is no error."""
    import os

    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass


def _main(argv: Sequence[str] | None) -> int:
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    if "_ARGCOMPLETE" in os.environ:  # bash asks for completions (toposlice completion)
        from toposlice.cmd_completion import complete

        complete(build_parser("*"))
    argv = help_argv(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    known = command in COMMANDS or command in MODULE_COMMANDS
    args = build_parser(command if known else None).parse_args(argv)
    if args.command == "help":  # only a topic that is no command gets here
        build_parser().error(f"help: no command {' '.join(args.topic)!r}")
    try:
        rc = _run(args)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # `toposlice ... | head`: the reader left; stop quietly, and keep the interpreter's
        # final flush from failing on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OSError, ValueError) as exc:
        # Bad input (a flag, a file): one line, no traceback.
        print(f"toposlice: error: {one_line(exc)}", file=sys.stderr)
        return 2


def help_argv(argv: list[str]) -> list[str]:
    """``toposlice help [COMMAND [SUB]]`` as ``toposlice [COMMAND [SUB]] --help``; other
    command lines as they are."""
    words = [a for a in argv if a not in ("-q", "--quiet")]
    if not words or words[0] != "help":
        return argv
    topic = words[1:]
    if topic and topic[0] not in COMMANDS and topic[0] not in MODULE_COMMANDS:
        return argv  # the parser says there is no such command
    return [*topic, "--help"]


def one_line(exc: BaseException) -> str:
    """An error for people, in one line: an OSError as "file: reason" (not "[Errno 2] ..."),
    a wrapped PyYAML error as what and where, other text with its line breaks folded."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc)
        cause = exc.__cause__
        if cause is not None and type(cause).__module__.startswith("yaml") and str(cause) in text:
            from driver.plumbing.checks import (
                yaml_error_line,  # PyYAML's text spans lines, with a snippet
            )

            text = text.split(str(cause))[0] + yaml_error_line(cause)
    return " ".join(text.split()) or type(exc).__name__


def _run(args: argparse.Namespace) -> int:
    if args.command in MODULE_COMMANDS:
        from importlib import import_module

        rc: int = import_module(MODULE_COMMANDS[args.command][0]).run(args)
        return rc

    from toposlice import sources
    from toposlice.output import dump, object_list
    from toposlice.sources import check_source, normalize_options

    check_source(args)
    inv = sources.load_inventory(args)  # by attribute: hack/record_outputs.py caches it
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
        from driver.plumbing.checks import check_names
        from normalize.slices import build_slices_reported
        from toposlice.sources import node_name_of

        node = node_name_of(args, inv)
        check_names(node, opts.driver)  # names the API server would refuse: say so
        slices, dropped = build_slices_reported(inv, node, opts)
        for drop in dropped:  # over an API limit: never left out without a word
            print(f"toposlice: warning: not published in full: {drop.message()}", file=sys.stderr)
        # JSON has no document stream kubectl reads: several objects are a v1 List there.
        dump(object_list(slices) if args.output == "json" else slices, args.output)
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
