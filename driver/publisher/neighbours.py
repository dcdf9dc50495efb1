"""The other DRA drivers on this node, as ``run`` sees them: which dialects to bridge and
which of toposlice's devices another driver already publishes.

Two drivers publishing the same CPUs (the chart's default ``publish: [gpu, nic, cpu]``
beside dra-driver-cpu) let the scheduler give a pod the same cores twice, since nothing in
DRA links the two devices. So the driver reads its node's ResourceSlices (the publisher's
watch of the node, no request of its own) at start, before it first publishes, and every
``interval`` seconds after: devices another registered
driver publishes for the same hardware leave toposlice's pool (``--duplicates yield``, the
default), and the neighbours' NUMA dialect is bridged (``--bridge auto``). A failed read is
logged and keeps the last answer; the next tick tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from driver.publisher.observe import registered_drivers
from normalize.crossdriver import (
    Neighbourhood,
    NormalizationReport,
    neighbourhood,
    normalization_report,
)
from normalize.snapshot import Snapshot

log = logging.getLogger("toposlice.neighbours")

#: The Node Event's reason when toposlice leaves devices to another driver.
REASON = "DevicesPublishedByAnotherDriver"


class NeighbourWatch:
    """Keeps :attr:`current` (a :class:`Neighbourhood`) and calls ``on_change`` when it
    changes."""

    def __init__(
        self,
        source: Callable[[], list[dict[str, Any]]],
        snapshot: Callable[[], Snapshot | None],
        on_change: Callable[[Neighbourhood], None],
        *,
        registry_dir: str | Path | None,
        interval: float = 10.0,
        on_report: Callable[[NormalizationReport], None] | None = None,
    ) -> None:
        self.source = source
        self.snapshot = snapshot
        self.on_change = on_change
        self.on_report = on_report
        """Given the cross-driver report whenever the slices or the snapshot changed, so
        ``run`` joins the other drivers' devices to its graph (``/v1/topology`` attrs.dra,
        ``/v1/normalization``) as ``serve --observe`` does."""
        self._reported: tuple[object, frozenset[tuple[str, str]]] | None = None
        self.registry_dir = registry_dir
        self.interval = interval
        self.current = Neighbourhood()
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_once(self) -> Neighbourhood:
        snap = self.snapshot()
        if snap is None:
            return self.current
        try:
            slices = self.source()
        except Exception as exc:
            msg = f"listing the node's ResourceSlices failed: {exc}"
            if msg != self.last_error:
                log.warning("%s; keeping what was known of other drivers", msg)
            self.last_error = msg
            return self.current
        self.last_error = ""
        drivers = registered_drivers(self.registry_dir) if self.registry_dir else None
        found = neighbourhood(snap, slices, drivers)
        changed = found != self.current
        if changed:  # before the report: its reader asks which devices are left to others
            self.current = found
        if self.on_report is not None:
            seen = frozenset(
                (str(m.get("name", "")), str(m.get("resourceVersion", "")))
                for m in (s.get("metadata") or {} for s in slices)
            )
            if self._reported != (snap, seen):
                self._reported = (snap, seen)
                self.on_report(normalization_report(snap, slices, None, drivers))
        if changed:
            self.on_change(found)
        return found

    def start(self) -> NeighbourWatch:
        self._thread = threading.Thread(target=self._loop, name="neighbours", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.read_once()
            except Exception:  # a bug here must not stop the driver: log, try next tick
                log.exception("reading other drivers failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
