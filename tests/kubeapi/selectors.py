"""Label and field selectors as the API server parses them (the subset clients send)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


class SelectorError(ValueError):
    """A selector the server cannot parse: answered with 400 BadRequest."""


def _split_top(expr: str) -> list[str]:
    """Split on commas outside parentheses (``a in (x,y),b=c`` is two terms)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _in_set(key: str, values: set[str], inside: bool) -> Callable[[Mapping[str, str]], bool]:
    return lambda labels: (labels.get(key) in values) == inside


def _equals(key: str, value: str, equal: bool) -> Callable[[Mapping[str, str]], bool]:
    return lambda labels: (labels.get(key) == value) == equal


def _exists(key: str, present: bool) -> Callable[[Mapping[str, str]], bool]:
    return lambda labels: (key in labels) == present


def label_selector(expr: str | None) -> Predicate:
    """``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``."""
    if not expr:
        return lambda _obj: True
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_top(expr):
        m = _SET_RE.match(term)
        if m:
            values = {v.strip() for v in m.group(4).split(",") if v.strip()}
            tests.append(_in_set(m.group(2), values, m.group(3) == "in"))
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            tests.append(_equals(key, value, False))
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(_equals(key, value, True))
        elif term.startswith("!"):
            tests.append(_exists(term[1:].strip(), False))
        elif re.match(r"^[A-Za-z0-9./_-]+$", term):
            tests.append(_exists(term, True))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(t(labels) for t in tests)

    return match


def field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(
    expr: str | None, supported: frozenset[str]
) -> list[tuple[str, str, bool]]:
    """``[(path, value, equal)]``; unsupported field paths are a 400 like the real server."""
    out: list[tuple[str, str, bool]] = []
    for term in _split_top(expr or ""):
        if "!=" in term:
            path, value = term.split("!=", 1)
            equal = False
        elif "=" in term:
            path, value = term.replace("==", "=").split("=", 1)
            equal = True
        else:
            raise SelectorError(f"invalid field selector term {term!r}")
        path = path.strip()
        if path not in supported:
            raise SelectorError(f'field label not supported: "{path}"')
        out.append((path, value.strip(), equal))
    return out


def field_selector(terms: list[tuple[str, str, bool]]) -> Predicate:
    def match(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, p) == v) == eq for p, v, eq in terms)

    return match
