"""``toposlice completion [bash|zsh|fish]``: the shell script that completes toposlice's
commands and flags (argcomplete), and the hook :func:`toposlice.cli.main` calls when that
script asks (``$_ARGCOMPLETE`` set).

The script runs ``toposlice`` itself with the command line in the environment; then
:func:`complete` answers from the full parser (every command's options) and exits. The
ordinary start-up never imports argcomplete.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

SHELLS = ("bash", "zsh", "fish")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "shell",
        nargs="?",
        choices=SHELLS,
        default="bash",
        help="the shell to print the script for (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    import argcomplete

    print(argcomplete.shellcode(["toposlice"], shell=args.shell), end="")
    return 0


def complete(parser: argparse.ArgumentParser) -> NoReturn:
    """Answer the completion request in the environment and exit (argcomplete's way)."""
    import argcomplete

    argcomplete.autocomplete(parser)
    raise SystemExit(0)  # autocomplete exits itself; not reached when it declined
