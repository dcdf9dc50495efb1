"""What the API server holds of the driver's own objects, learnt from a watch, so that a
writer compares against it instead of listing on every resync.

A :class:`ServerView` runs one :class:`~driver.plumbing.informer.Informer` (one LIST, then a WATCH
resumed from its resourceVersion; the state again only on ``410 Gone``, by a streaming
list where the server has them) over a collection
narrowed by a field selector to this node's objects, and lays the answers to the writer's
own writes over it until the watch has delivered them: the Go resourceslice controller's
``NewIntegerResourceVersionMutationCache`` in small. Without that layer a reconcile right
after a write would see the object as it was and write it again. resourceVersions are
compared as integers, as that cache does (every etcd-backed API server issues them so);
an answer is kept at most ``ttl_s`` seconds, after which the watch alone counts.

``on_change(recovered)`` runs on the informer's thread for every event, and with True
when the server answers again after a failure. ``healthy`` says the view can be
trusted: listed, and no informer failure since the API
server last answered a LIST or opened a WATCH. While it is not, a writer reports itself
unsynced (``/readyz`` 503) rather than claim the server holds what it last saw.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from driver.plumbing.informer import Informer, object_key

Obj = dict[str, Any]


def rv_int(obj: Obj | None) -> int:
    """The object's resourceVersion as an integer (-1 when absent or not a number)."""
    value = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(value))
    except ValueError:
        return -1


class ServerView:
    """The objects of one collection that the selectors match, as the server holds them."""

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        *,
        selectors: dict[str, str] | None = None,
        on_change: Callable[[bool], None] | None = None,
        ttl_s: float = 60.0,
        watch_timeout_s: float = 300.0,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        server: str | None = None,
    ) -> None:
        """``server``: the API server's URL, for the informer's check that a server which
        went away accepts connections again, and its settle, before it retries
        (driver/plumbing/informer.py)."""
        self.on_change = on_change
        self.ttl_s = ttl_s
        self.clock = clock
        self._cond = threading.Condition()
        self._written: dict[str, tuple[float, Obj | None, int]] = {}
        """key -> (expiry, our write's answer or None for a deletion, its resourceVersion)."""
        self._deletions: dict[str, int] = {}
        """DELETED events seen per key (what :meth:`wait_newer` waits for, too)."""
        self._answered_at = -1
        """The informer's failure count when the server last answered a LIST or WATCH."""
        self.informer: Informer[Obj] = Informer(
            name,
            self._answered(list_fn),
            lambda obj: obj,
            on_event=self._event,
            selectors=selectors,
            watch_timeout_s=watch_timeout_s,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            rng=rng,
            server=server,
        )
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> ServerView:
        if not self._started:
            self._started = True
            self.informer.start()
        return self

    def stop(self) -> None:
        if self._started:
            self._started = False
            self.informer.stop()

    def wait_synced(self, timeout: float) -> bool:
        return self.informer.wait_synced(timeout)

    @property
    def healthy(self) -> bool:
        return self.informer.synced.is_set() and self._answered_at == self.informer.failures

    @property
    def last_error(self) -> str:
        return self.informer.last_error

    def _answered(self, list_fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(**kwargs: Any) -> Any:
            resp = list_fn(**kwargs)  # raises when the server refused or did not answer
            first = self._answered_at != self.informer.failures
            self._answered_at = self.informer.failures
            if first and self.on_change is not None:
                self.on_change(True)  # back after a failure: the writer may be synced again
            return resp

        return call

    # -- reads ---------------------------------------------------------------------------

    def objects(self) -> list[Obj]:
        """Every object: the watch's copy, or our newer write's answer, minus deletions."""
        now = self.clock()
        with self._cond:
            merged: dict[str, Obj | None] = dict(self.informer.store)
            for key, (expiry, obj, rv) in list(self._written.items()):
                if expiry < now:
                    del self._written[key]
                    continue
                if key in merged and rv_int(merged[key]) > rv:
                    continue  # the watch has a newer one (someone else wrote after us)
                if obj is None:
                    merged.pop(key, None)
                else:
                    merged[key] = obj
        return [obj for obj in merged.values() if obj is not None]

    # -- our writes ----------------------------------------------------------------------

    def wrote(self, obj: Any) -> None:
        """The server's answer to our create or update. Not kept when the watch has
        already passed its resourceVersion: it delivered the write (and whatever came
        after, a deletion included) before the answer reached us, and layering the answer
        now would hide that deletion until ``ttl_s``."""
        if isinstance(obj, dict) and (obj.get("metadata") or {}).get("name"):
            rv = rv_int(obj)
            with self._cond:
                if 0 <= rv <= self._watched_rv():
                    return
                self._written[object_key(obj)] = (self.clock() + self.ttl_s, obj, rv)

    def _watched_rv(self) -> int:
        """The resourceVersion the informer has delivered up to (-1: none yet)."""
        try:
            return int(str(self.informer.resource_version))
        except ValueError:
            return -1

    def deleted(self, obj: Obj) -> None:
        """We deleted ``obj`` (or found it gone): hide the watch's copy until it says so."""
        with self._cond:
            self._written[object_key(obj)] = (self.clock() + self.ttl_s, None, rv_int(obj))

    def wait_newer(self, obj: Obj, timeout: float) -> bool:
        """After a conflict on ``obj``: wait (bounded) until the watch shows a newer
        version of it, or its deletion. False when none came in time."""
        key, rv = object_key(obj), rv_int(obj)
        deadline = time.monotonic() + timeout
        with self._cond:
            deletions = self._deletions.get(key, 0)
            while True:
                cur = self.informer.store.get(key)
                # Absent from the watch is not "deleted": it may not have shown it yet.
                if (cur is not None and rv_int(cur) > rv) or self._deletions.get(
                    key, 0
                ) != deletions:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))

    # -- the informer's events -------------------------------------------------------------

    def _event(self, typ: str, key: str, old: Any, new: Any) -> None:
        with self._cond:
            if typ == "DELETED":
                self._deletions[key] = self._deletions.get(key, 0) + 1
            mine = self._written.get(key)
            if mine is not None and (typ == "DELETED" or rv_int(new) >= mine[2]):
                del self._written[key]  # the watch has caught up with our write
            self._cond.notify_all()
        if self.on_change is not None:
            self.on_change(False)
