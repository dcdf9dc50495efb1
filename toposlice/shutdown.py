"""SIGTERM / SIGINT for a long-running command: a stop that cannot hang, and cannot take long.

Two things used to keep ``toposlice serve`` running long after a SIGTERM:

* its handler called ``Event.set()``. A Python signal handler runs in the main thread
  between two bytecodes, so a signal that lands while the main thread holds that same
  Event's lock (entering or leaving ``stop.wait()``) blocks the handler on a lock its own
  thread holds: the process hangs for good;
* the main thread only looks at the stop between discoveries, and a discovery can take
  seconds, or never end (a sysfs read or NVML call on a wedged device); the threads it then
  joins (observer, HTTP server) wait for their own timeouts (an API call: 10 s).

Here the Python-level handler only records the signal (a list append, no lock). The
interpreter's C-level handler also writes the signal number to a pipe
(:func:`signal.set_wakeup_fd`); a daemon thread blocked on that pipe sets :attr:`event` (so
every waiter wakes, the main thread in ``event.wait()`` included) and, if the process is
still there ``grace`` seconds later, ends it with :func:`os._exit` and the same exit status
a clean stop gives. A second signal ends it at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

#: Seconds a stop may take before the process is ended without waiting any further.
GRACE = 5.0


class StopSignals:
    """Install with :meth:`install` (main thread); wait on :attr:`event`; exit with
    :meth:`status` (0 after SIGTERM, 130 after SIGINT, as a shell expects)."""

    def __init__(
        self,
        grace: float = GRACE,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        name: str = "toposlice",
        exit_fn: Callable[[int], Any] = os._exit,
        on_stop: Callable[[], Any] | None = None,
    ) -> None:
        """``on_stop``: called once on the watcher thread when the first signal comes,
        before :attr:`event` is set (a daemon's ``request_stop``: it may take locks, being
        outside the signal handler)."""
        self.on_stop = on_stop
        self.grace = grace
        self.signals = tuple(signals)
        self.name = name
        self.event = threading.Event()
        self.received: list[int] = []
        self._exit = exit_fn
        self._pipe: tuple[int, int] | None = None
        self._old_fd = -1
        self._old_handlers: dict[int, Any] = {}
        self._closed = False
        self._thread: threading.Thread | None = None

    def install(self) -> StopSignals:
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._pipe = (r, w)
        for sig in self.signals:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name=f"{self.name}-stop", daemon=True)
        self._thread.start()
        return self

    def uninstall(self) -> None:
        """Put the previous handlers back and end the watcher (for tests and embedders; a
        command that exits need not call it)."""
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._old_fd)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._pipe[1], b"\0")  # wake the watcher: 0 is no signal
        if self._thread is not None:
            self._thread.join(2)
        for fd in self._pipe:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pipe = None

    def status(self) -> int:
        return 130 if signal.SIGINT in self.received else 0

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # No lock here (see the module docstring): the watcher thread does the rest.
        self.received.append(signum)

    def _read(self, timeout: float | None) -> list[int]:
        """Signal numbers from the pipe (waiting up to ``timeout``); [] on timeout."""
        assert self._pipe is not None
        r = self._pipe[0]
        ready, _, _ = select.select([r], [], [], timeout)
        if not ready:
            return []
        try:
            data = os.read(r, 64)
        except OSError:
            return []
        return [b for b in data if b in self.signals or b == 0]

    def _watch(self) -> None:
        got: list[int] = []
        while not got:
            got = self._read(None)
            if self._closed:
                return
            got = [s for s in got if s]
        for s in got:
            if s not in self.received:
                self.received.append(s)
        if self.on_stop is not None:
            with contextlib.suppress(Exception):
                self.on_stop()
        self.event.set()
        again = len(got) > 1  # two signals at once: stop now
        deadline = time.monotonic() + self.grace
        while not again:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            more = self._read(left)
            if self._closed:
                return
            again = any(more)
        why = "a second signal" if again else f"still running {self.grace:g} s after the signal"
        self._say(f"{self.name}: {why}: exiting now\n")
        self._exit(self.status())

    def _say(self, text: str) -> None:
        """One line on stderr without a lock the stuck thread may hold (logging's, or a
        full pipe's write): written from a throwaway thread, given 0.5 s."""

        def write() -> None:
            with contextlib.suppress(Exception):
                os.write(sys.stderr.fileno(), text.encode())

        t = threading.Thread(target=write, daemon=True)
        t.start()
        t.join(0.5)
