"""Rediscovery triggers: a timer, and udev hot-plug events on a live host, debounced.

A PCIe hot-plug or an SR-IOV reconfiguration arrives as a burst of uevents (one per
function, netdev and RDMA device); rediscovering on each would run discovery dozens of
times. :class:`Debouncer` turns a burst into one call, made once the events have been
quiet for ``quiet`` seconds (and at the latest ``max_delay`` after the first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("toposlice.hotplug")

#: uevent subsystems whose changes can change the published devices.
SUBSYSTEMS = ("pci", "net", "infiniband", "nvidia-nvswitch", "drm")


class Debouncer:
    def __init__(
        self,
        action: Callable[[], None],
        quiet: float = 2.0,
        max_delay: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.action = action
        self.quiet = quiet
        self.max_delay = max_delay
        self.clock = clock
        self._cond = threading.Condition()
        self._first: float | None = None
        self._last = 0.0
        self._stop = False
        self.fired = 0
        self._thread = threading.Thread(target=self._run, name="hotplug-debounce", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """One event happened."""
        with self._cond:
            now = self.clock()
            if self._first is None:
                self._first = now
            self._last = now
            self._cond.notify_all()

    def _due(self) -> float | None:
        if self._first is None:
            return None
        return min(self._last + self.quiet, self._first + self.max_delay)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop:
                    due = self._due()
                    if due is not None and self.clock() >= due:
                        break
                    self._cond.wait(0.05 if due is not None else 1.0)
                if self._stop:
                    return
                self._first = None
            self.fired += 1
            try:
                self.action()
            except Exception:
                log.exception("rediscovery after hot-plug failed")

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(2)


class UdevWatcher:
    """pyudev monitor on the kernel's uevent socket (live host only), feeding a debouncer."""

    def __init__(self, debouncer: Debouncer) -> None:
        import pyudev

        self.debouncer = debouncer
        context = pyudev.Context()
        self.monitor = pyudev.Monitor.from_netlink(context)
        for subsystem in SUBSYSTEMS:
            self.monitor.filter_by(subsystem)
        self.observer = pyudev.MonitorObserver(self.monitor, callback=self._event, name="udev")

    def _event(self, device: Any) -> None:
        if device.action in ("add", "remove", "change", "bind", "unbind", "move"):
            log.debug("uevent %s %s", device.action, device.sys_path)
            self.debouncer.poke()

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        self.observer.send_stop()


def start_udev(debouncer: Debouncer) -> UdevWatcher | None:
    """A running watcher, or None (logged) where udev is not available, e.g. a container
    without the host network namespace: the rediscovery timer still runs."""
    try:
        watcher = UdevWatcher(debouncer)
        watcher.start()
    except Exception as exc:
        log.warning("no udev hot-plug events (%s); rediscovering on the timer only", exc)
        return None
    return watcher
