"""argparse types for the durations and counts of every command, checked before start.

A duration flag given ``0``, ``-5``, ``nan`` or ``1e308`` used to be taken as it was and
turned into a 50 ms busy loop or an ``OverflowError`` inside ``threading`` minutes later;
each type here refuses what is out of range while the arguments are parsed, so the command
stops with argparse's usage line and one ``error: argument --flag: ...`` line (exit 2).
A string default (an environment variable's value, ``run``'s ``$REDISCOVER_INTERVAL``) goes
through the same type, so a bad variable is refused as clearly as a bad flag.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

#: The longest wait any flag may ask for: a week. ``threading`` refuses timeouts beyond
#: ``threading.TIMEOUT_MAX`` (~49 days on Linux), and no period longer than a week is useful.
MAX_SECONDS = 7 * 24 * 3600.0


def seconds(
    low: float = 0.0, high: float = MAX_SECONDS, *, allow_low: bool = False
) -> Callable[[str], float]:
    """A finite number of seconds above ``low`` (or equal to it with ``allow_low``) and at
    most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        lowest = f">= {low:g}" if allow_low else f"> {low:g}"
        if (
            not math.isfinite(value)
            or value > high
            or value < low
            or (value == low and not allow_low)
        ):
            raise argparse.ArgumentTypeError(f"{text!r}: give seconds {lowest} and <= {high:g}")
        return value

    parse.__name__ = "seconds"  # argparse names the type in "invalid <type> value"
    return parse


def count(low: int = 1, high: int = 1_000_000) -> Callable[[str], int]:
    """A whole number in ``low..high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number in {low}..{high}")
        return value

    parse.__name__ = "count"
    return parse
