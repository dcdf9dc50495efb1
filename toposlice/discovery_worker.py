"""Discovery in a niced helper process, shared by ``toposlice serve`` and ``toposlice run``.

A discovery is seconds of pure-Python CPU work; in the serving process it holds the GIL
that the HTTP and gRPC threads need, and their tail latency is the discovery's length.
In a helper (spawned, ``nice 10``, killed with its parent) it only costs the parent the
unpickling of the finished snapshot.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

from toposlice.sources import inventory_loader, node_name_of, normalize_options

if TYPE_CHECKING:  # multiprocessing is imported on first use: not on the way to registration
    from concurrent.futures import ProcessPoolExecutor

#: Python switches threads every 5 ms by default; an HTTP request or gRPC call that arrives
#: while another thread runs (publisher, health, unpickling a snapshot from the helper)
#: would wait that long. 1 ms keeps the exporter's and prepare's p99 within target.
SWITCH_INTERVAL = 0.001
#: How often :meth:`DiscoveryWorker.snapshot` looks at its stop event while it waits.
STOP_POLL = 0.1


def background(parent: int = 0) -> None:
    """The discovery helper yields the CPU to the server (and to the workloads), and dies
    with its parent, even one killed with SIGKILL (Linux ``PR_SET_PDEATHSIG``). ``parent``:
    the PID that started it; in a container that is PID 1, so "reparented to init" is
    a parent PID that changed, not one that is 1.

    Ctrl-C reaches the whole process group, the helper too; it leaves stopping to its
    parent (which kills it) and ignores SIGINT. It was started with SIGINT blocked
    (:meth:`DiscoveryWorker.snapshot`), so a Ctrl-C during its interpreter's start-up
    (``Fatal Python error: init_import_site``) or its imports is never delivered."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    with contextlib.suppress(OSError):
        os.nice(10)
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != (parent or os.getppid()):  # it died before prctl took effect
            os._exit(0)


def discover_snapshot(args: argparse.Namespace, loader: Any = None, node: str = "") -> Any:
    """One discovery and its snapshot (in the helper process, or in-process with
    ``loader``). ``node``: the node name; else ``--node-name``, else the inventory's host
    name lower-cased (:func:`toposlice.sources.node_name_of`, as ``slices`` names it)."""
    from normalize.snapshot import build_snapshot

    inv = (loader or inventory_loader(args))()
    return build_snapshot(inv, node or node_name_of(args, inv), normalize_options(args))


class DiscoveryWorker:
    """One helper process, started on first use; :meth:`snapshot` blocks until done."""

    def __init__(self, args: argparse.Namespace, node: str = "") -> None:
        self.args = args
        self.node = node
        self._pool: ProcessPoolExecutor | None = None

    def snapshot(self, stop: threading.Event | None = None) -> Any:
        """The snapshot of one discovery in the helper; None if ``stop`` is set before it is
        done (the helper goes on: :meth:`close` with ``kill`` ends it)."""
        # The helper is spawned (on first use, or after it died) inside submit(); it
        # inherits the signal mask, so SIGINT stays blocked from its exec until
        # background() ignores it. A Ctrl-C meanwhile waits for this thread's unblock.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            if self._pool is None:
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor

                self._pool = ProcessPoolExecutor(
                    1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=background,
                    initargs=(os.getpid(),),
                )
                # Starting multiprocessing's resource tracker (for the pool's locks)
                # unblocks SIGINT in this thread when done: block it again.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            future = self._pool.submit(discover_snapshot, self.args, None, self.node)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if stop is None:
            return future.result()
        while not stop.is_set():
            try:
                return future.result(timeout=STOP_POLL)
            except TimeoutError:
                continue
        return None

    def close(self, kill: bool = False) -> None:
        """Stop the helper: after its discovery, or at once with ``kill`` (a signal asked
        the command to stop; a discovery can take seconds)."""
        if self._pool is not None:
            if kill:
                procs = getattr(self._pool, "_processes", None) or {}
                for proc in list(procs.values()):
                    with contextlib.suppress(Exception):
                        proc.kill()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
