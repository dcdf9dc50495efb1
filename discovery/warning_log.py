"""Bounded, de-duplicated warnings collected while reading a damaged host.

A tree with thousands of broken files must yield a readable report, not thousands
of lines: after ``limit`` distinct messages the rest are only counted. They end up in
``Inventory.warnings``; whoever runs discovery (the CLI, the daemon) reports them, so
discovery needs no ``logging`` (start-up cost: docs/performance.md).
"""

from __future__ import annotations


class Warnings:
    def __init__(self, limit: int = 100) -> None:
        self.limit = limit
        self.messages: list[str] = []
        self._seen: set[str] = set()
        self.dropped = 0

    def add(self, message: str) -> None:
        if message in self._seen:
            return
        if len(self.messages) >= self.limit:
            self.dropped += 1
            return
        self._seen.add(message)
        self.messages.append(message)

    def extend(self, messages: list[str]) -> None:
        for m in messages:
            self.add(m)

    def result(self) -> list[str]:
        if self.dropped:
            return [*self.messages, f"... and {self.dropped} more warnings"]
        return list(self.messages)
