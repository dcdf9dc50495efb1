"""Scripted failures: answer matching requests with an error status, or be unreachable."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class Fault:
    status: int
    verb: str = "*"
    """``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
    ``write`` (any of the last four) or ``*``."""
    resource: str = "*"
    name: str = "*"
    times: int = 1
    """How many matching requests fail; ``-1`` = until cleared."""
    retry_after: int | None = None
    """Seconds for a ``Retry-After`` header (429/503)."""
    message: str = ""

    def matches(self, verb: str, resource: str, name: str) -> bool:
        if self.verb == "write":
            verb_ok = verb in ("create", "update", "patch", "delete")
        else:
            verb_ok = self.verb in ("*", verb)
        return (
            verb_ok
            and self.resource in ("*", resource)
            and self.name in ("*", name)
            and self.times != 0
        )


class FaultPlan:
    """Faults applied in the order they were added; each consumes itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._down_until = 0.0
        self._down_mode = "refuse"
        self.injected = 0

    def add(
        self,
        status: int,
        verb: str = "*",
        resource: str = "*",
        name: str = "*",
        times: int = 1,
        retry_after: int | None = None,
        message: str = "",
    ) -> Fault:
        fault = Fault(status, verb, resource, name, times, retry_after, message)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._down_until = 0.0

    def take(self, verb: str, resource: str, name: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(verb, resource, name):
                    if fault.times > 0:
                        fault.times -= 1
                    self.injected += 1
                    return fault
            self._faults = [f for f in self._faults if f.times != 0]
        return None

    def set_down(self, seconds: float, mode: str) -> None:
        if mode not in ("refuse", "503"):
            raise ValueError("mode is 'refuse' or '503'")
        with self._lock:
            self._down_until = time.monotonic() + seconds
            self._down_mode = mode

    def down_mode(self) -> str | None:
        """``refuse``/``503`` while the server plays dead, else None."""
        with self._lock:
            if time.monotonic() < self._down_until:
                return self._down_mode
            return None
