"""Log set-up for the daemon: text for people, one JSON object per line for collectors."""

from __future__ import annotations

import datetime
import json
import logging
import sys


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
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
