"""Log set-up for every daemon (``run``, ``serve``, ``scorer serve``): one text format for
people, one JSON object per line for collectors, chosen by the same two flags."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from normalize.snapshot import Snapshot


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value else default


def add_log_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--log-format text|json`` and ``--log-level``, the same on every daemon
    (``$LOG_FORMAT`` / ``$LOG_LEVEL`` as defaults, as the chart sets them)."""
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=_env("LOG_FORMAT", "text"),
        help="log lines as text or one JSON object per line ($LOG_FORMAT; default %(default)s)",
    )
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=_env("LOG_LEVEL", "info").lower(),
        help="($LOG_LEVEL; default %(default)s)",
    )


def setup_from_args(args: argparse.Namespace, *, verbose: bool = False) -> None:
    """The daemon's logging from :func:`add_log_args`' flags (``verbose``: debug). A bad
    ``$LOG_FORMAT``/``$LOG_LEVEL`` (argparse does not check defaults) is a ValueError."""
    fmt, level = str(args.log_format), str(args.log_level)
    if fmt not in LOG_FORMATS:
        raise ValueError(f"--log-format/$LOG_FORMAT {fmt!r}: use {' or '.join(LOG_FORMATS)}")
    if level not in LOG_LEVELS:
        raise ValueError(f"--log-level/$LOG_LEVEL {level!r}: use one of {', '.join(LOG_LEVELS)}")
    setup_logging(fmt, "debug" if verbose else level)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


class _NoUrllib3Retries(logging.Filter):
    """urllib3 warns before its one quick reconnect ("Retrying (Retry(total=0, ...)) after
    connection broken by ..."); our own loops log each failed request with its backoff, so
    that line only doubled every outage message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("urllib3.") and str(record.msg).startswith("Retrying ("))


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_NoUrllib3Retries())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def log_dropped(log: logging.Logger, snap: Snapshot) -> None:
    """One warning per attribute the node's devices do not carry as discovered (over an
    API limit): a claim that selects on it would otherwise match nothing, unexplained."""
    for drop in snap.dropped:
        log.warning("attribute not published in full: %s", drop.message())
