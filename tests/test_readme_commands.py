"""README's command table matches the CLI's parsers, derived from the parsers themselves so
that a command, subcommand or flag added, renamed or made optional fails here until the
table says so: every (sub)command of the parser has a row and every row a (sub)command;
every flag a row shows exists there, with the choices shown among its choices; a flag
shown bare (outside ``[...]`` and ``(... | ...)``) is required by the parser, and one the
parser requires is shown bare."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from toposlice import cli

README = Path(__file__).resolve().parent.parent / "README.md"
FLAG = re.compile(r"^--?[A-Za-z][\w-]*$")


@dataclass
class Row:
    words: list[str]
    """``["scorer", "serve"]``: the (sub)command the row shows."""
    optional_words: list[str] = field(default_factory=list)
    """Subcommands shown as options: ``machines [list|capture]``."""
    bare: set[str] = field(default_factory=set)
    """Flags shown outside brackets and parentheses: required."""
    flags: dict[str, list[str]] = field(default_factory=dict)
    """Every flag shown -> the choices shown after it (``-o table|json``), if any."""


def _cells() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        m = re.match(r"^\| `(toposlice [^`]+)` \|", line)
        if m:
            out.append(m.group(1).replace("\\|", "|"))
    return out


def _tokens(usage: str) -> list[tuple[str, int]]:
    """(token, nesting depth inside [] and ()) of a usage line."""
    out: list[tuple[str, int]] = []
    depth = 0
    for tok in re.findall(r"[\[\]()]|[^\s\[\]()]+", usage):
        if tok in "[(":
            depth += 1
        elif tok in "])":
            depth -= 1
        else:
            out.append((tok, depth))
    return out


def _row(usage: str) -> Row:
    tokens = _tokens(usage)
    assert tokens[0] == ("toposlice", 0), usage
    row = Row(words=[])
    flag: str | None = None
    for tok, depth in tokens[1:]:
        if FLAG.match(tok):
            flag = tok
            row.flags.setdefault(tok, [])
            if depth == 0:
                row.bare.add(tok)
            continue
        if flag is None and not row.flags:  # before any flag: (sub)command words
            if depth == 0:
                row.words.append(tok)
            else:
                row.optional_words += [w for w in tok.split("|") if w]
            continue
        if flag is not None and "|" in tok and tok == tok.lower():
            row.flags[flag] = [c for c in tok.split("|") if c]
        flag = None if tok.isupper() or "|" in tok or tok.endswith("…") else flag
    return row


def _parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every (sub)command path -> its parser, from the CLI's own build_parser."""
    names = [*cli.COMMANDS, *cli.MODULE_COMMANDS, "help"]
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        out[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk((*path, name), sub)

    for name in names:
        top = cli.build_parser(name)
        (action,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
        assert set(action.choices) == set(names), "build_parser lists every command"
        walk((name,), action.choices[name])
    return out


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def test_every_command_has_a_row_and_every_row_a_command() -> None:
    parsers = _parsers()
    shown: set[tuple[str, ...]] = set()
    for usage in _cells():
        row = _row(usage)
        path = tuple(row.words)
        assert path in parsers, f"README shows `{usage}`: no such command"
        shown.add(path)
        shown.update((*path, w) for w in row.optional_words)
    missing = sorted(" ".join(p) for p in parsers if p not in shown)
    # A command whose subcommands have rows of their own needs no row of its own.
    missing = [m for m in missing if not any(" ".join(s).startswith(m + " ") for s in shown)]
    assert missing == [], f"commands with no row in README's table: {missing}"
    extra = sorted(" ".join(p) for p in shown if p not in parsers)
    assert extra == [], f"README shows subcommands the CLI does not have: {extra}"


def test_every_flag_shown_exists_and_is_required_exactly_when_shown_bare() -> None:
    parsers = _parsers()
    for usage in _cells():
        row = _row(usage)
        parser = parsers[tuple(row.words)]
        options = _options(parser)
        for flag, choices in row.flags.items():
            assert flag in options, f"`{usage}`: {flag} is not a flag of that command"
            action = options[flag]
            if choices and action.choices is not None:
                unknown = sorted(set(choices) - {str(c) for c in action.choices})
                assert unknown == [], f"`{usage}`: {flag} has no choice {unknown}"
            if flag in row.bare:
                assert action.required, f"`{usage}` shows {flag} as required; it is optional"
        shown = {options[f].dest for f in row.flags}
        for action in parser._actions:
            if action.required and action.option_strings:
                assert action.dest in shown and any(f in row.bare for f in action.option_strings), (
                    f"`{usage}`: {action.option_strings[0]} is required but not shown bare"
                )


def test_the_row_reader_sees_what_a_person_sees() -> None:
    """The reader itself, on rows shaped like the table's."""
    row = _row("toposlice doctor (--kubeconfig F | --slices F) [-o table|json]")
    assert row.words == ["doctor"] and row.bare == set()
    assert row.flags == {"--kubeconfig": [], "--slices": [], "-o": ["table", "json"]}
    row = _row("toposlice machines [list|capture]")
    assert row.words == ["machines"] and row.optional_words == ["list", "capture"]
    row = _row("toposlice gather -o node.tar.gz")
    assert row.bare == {"-o"} and row.flags == {"-o": []}
    row = _row("toposlice nccl-topo [--devices GPU0,NIC1,…] [-o FILE]")
    assert set(row.flags) == {"--devices", "-o"} and row.bare == set()
