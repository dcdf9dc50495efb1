"""The loop shared by the writers that keep API objects of one node equal to a desired
state: the slice publisher (driver/publisher/slices.py) and the NRT / NodeFeature writer
(driver/publisher/topology_objects.py).

A writer supplies its reconcile (read, diff, write: its own file's business), its log
lines and its thread name; this base runs it on every change of the desired state and
every ``resync_seconds``:

- conflicts (409) re-read and retry at once, :data:`MAX_CONFLICT_RETRIES` times;
- any other failure backs off exponentially with jitter (``Retry-After`` wins), capped,
  forever; while failing, a new desired state does not cut the backoff short, and an
  unexpected exception never kills the thread;
- ``synced`` says the last reconcile left the API server equal to the desired state,
  ``last_error`` why not.

Objects are owned by the Node (garbage-collected with it) and left in place on stop.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from driver.plumbing.kube import ApiFailure, NodeNotFound, get_node

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

MAX_CONFLICT_RETRIES = 5

#: Seconds a Node UID just read counts as current: a write that wants it re-read (the
#: Node may have been re-created) within that time uses it (a first start reads it once).
NODE_FRESH_S = 5.0

T = TypeVar("T")


class WriteError(RuntimeError):
    """An API call of a writer failed (the loop backs off and retries)."""

    def __init__(self, what: str, fail: ApiFailure) -> None:
        super().__init__(f"{what}: {fail.message}")
        self.failure = fail


class Restart(Exception):
    """A write hit a conflict: read again and recompute."""


class ResyncLoop(ABC):
    """Base of a writer: the reconcile loop, its thread, backoff and the Node owner."""

    error_type: type[WriteError] = WriteError
    """The writer's own error; raised for a Node that cannot be read and for conflicts
    that do not end, and the failures the writer logs itself (:meth:`_log_failed`)."""

    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        *,
        thread_name: str,
        resync_seconds: float,
        backoff_base: float,
        backoff_max: float,
        rng: random.Random | None,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.thread_name = thread_name
        self.resync_seconds = resync_seconds
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.rng = rng or random.Random()
        self._cond = threading.Condition()
        self._dirty = False
        self._kick = False
        self._node_uid: str | None = None
        self._node_read_at = time.monotonic()
        self.reconciles = 0
        self.synced = False
        """The last reconcile left the API server equal to the desired state."""
        self.last_error = ""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- what a writer supplies ----------------------------------------------------------

    @abstractmethod
    def _has_desired(self) -> bool:
        """A desired state was set (before that, the loop only waits)."""

    @abstractmethod
    def _sync_once(self) -> None:
        """One reconcile, logging what it wrote; raises on failure."""

    @abstractmethod
    def _log_recovered(self, failures: int) -> None:
        """A reconcile succeeded after ``failures`` failed ones."""

    @abstractmethod
    def _log_failed(self, exc: WriteError, delay: float) -> None:
        """A reconcile failed with the writer's error; retried in ``delay`` s."""

    @abstractmethod
    def _log_unexpected(self, delay: float) -> None:
        """A reconcile raised something else (called in the ``except`` block, so
        ``log.exception`` shows it); retried in ``delay`` s."""

    # -- shared by the writers -----------------------------------------------------------

    def _changed(self) -> None:
        """The desired state changed (call with ``_cond`` held): reconcile at once."""
        self._dirty = True
        self.synced = False
        self._cond.notify_all()

    def _wake(self, recovered: bool = False) -> None:
        """What the server holds may have changed (a watch event): compare again soon,
        without saying the desired state changed. ``recovered``: the API server answers
        again after a failure, which also ends a backoff (one more attempt; the backoff
        keeps growing if that fails too)."""
        with self._cond:
            self._dirty = True
            self._kick = self._kick or recovered
            self._cond.notify_all()

    def _retry_conflicts(self, attempt: Callable[[], T], what: str) -> T:
        """``attempt()`` until it does not raise :class:`Restart`; counts the reconcile."""
        for _attempt in range(MAX_CONFLICT_RETRIES):
            try:
                result = attempt()
            except Restart:
                continue
            self.reconciles += 1
            return result
        raise self.error_type(
            what, ApiFailure(409, None, f"conflicts {MAX_CONFLICT_RETRIES} times in a row")
        )

    def _get_node(self) -> dict[str, Any]:
        return get_node(self.client, self.node_name)

    def _owner(self, refresh: bool) -> dict[str, Any]:
        """The controller owner reference to the Node (its UID read once, or again)."""
        stale = time.monotonic() - self._node_read_at > NODE_FRESH_S
        if self._node_uid is None or (refresh and stale):
            try:
                node = self._get_node()
            except NodeNotFound as exc:
                raise self.error_type("get node", ApiFailure(404, None, str(exc))) from exc
            except Exception as exc:
                raise self.error_type("get node", ApiFailure(None, None, str(exc))) from exc
            self._node_uid = node["metadata"]["uid"]
            self._node_read_at = time.monotonic()
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node_name,
            "uid": self._node_uid,
            "controller": True,
        }

    # -- the loop ------------------------------------------------------------------------

    def backoff(self, attempt: int, fail: ApiFailure | None) -> float:
        """Capped exponential backoff with jitter; ``Retry-After`` wins when given."""
        if fail is not None and fail.retry_after is not None:
            return min(self.backoff_max, max(0.0, fail.retry_after))
        ceiling = min(self.backoff_max, self.backoff_base * (2 ** min(attempt, 30)))
        return ceiling * (0.5 + 0.5 * self.rng.random())

    def run(self, stop: threading.Event | None = None) -> None:
        """Reconcile on every change and every ``resync_seconds`` until ``stop`` is set."""
        stop = stop or self._stop
        failures = 0
        while not stop.is_set():
            with self._cond:
                self._dirty = False
                self._kick = False
            delay = self.resync_seconds
            if self._has_desired():
                try:
                    self._sync_once()
                    if failures:
                        self._log_recovered(failures)
                    failures = 0
                    self.last_error = ""
                    with self._cond:
                        self.synced = not self._dirty
                except self.error_type as exc:
                    delay = self.backoff(failures, exc.failure)
                    failures += 1
                    self.synced = False
                    self.last_error = str(exc)
                    self._log_failed(exc, delay)
                except Exception as exc:  # never let the thread die
                    delay = self.backoff(failures, None)
                    failures += 1
                    self.synced = False
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    self._log_unexpected(delay)
            # While failing, a new desired state does not cut the backoff short.
            self._wait(stop, delay, wake_on_change=failures == 0)

    def _wait(self, stop: threading.Event, seconds: float, wake_on_change: bool) -> None:
        deadline = time.monotonic() + seconds
        with self._cond:
            while not (self._dirty and wake_on_change) and not self._kick and not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.5))

    def start(self) -> threading.Thread:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; what it wrote stays (a restart must not wipe it)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.synced:
                return True
            time.sleep(0.02)
        return self.synced
