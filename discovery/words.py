"""Counts in words for the lines people read ("1 NIC", "2 NICs"): one helper, so no
message says "1 sockets"."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, in the plural (``many``, else ``word + "s"``) unless n is 1."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
