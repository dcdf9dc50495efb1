"""``toposlice serve``: the HTTP exporter on its own, for nodes where toposlice publishes
nothing. Same sources as every command (``--fake``, ``--root``, live); with ``--observe`` it
also reads the other drivers' ResourceSlices of the node and serves the cross-driver report.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from driver.plumbing.logs import add_log_args, setup_from_args
from toposlice.sources import (
    add_node_name_arg,
    add_normalize_args,
    add_source_args,
    check_source,
    inventory_loader,
    normalize_options,
)

log = logging.getLogger("toposlice.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from driver.plumbing.flag_types import seconds

    add_source_args(p)
    add_normalize_args(p)
    p.add_argument(
        "--http-addr", default=":8080", help="HOST:PORT to serve on (default %(default)s)"
    )
    add_node_name_arg(p)
    p.add_argument(
        "--rediscover-interval",
        type=seconds(),
        default=60.0,
        metavar="S",
        help="rediscover the node every S seconds (default %(default)s; at most a week)",
    )
    p.add_argument(
        "--discover-in-process",
        action="store_true",
        help="run discovery in the server process (default: a helper process, so its CPU "
        "time does not hold the GIL the HTTP thread needs)",
    )
    p.add_argument(
        "--observe",
        action="store_true",
        help="read other drivers' ResourceSlices of the node and report on them",
    )
    p.add_argument(
        "--kubeconfig", help="kubeconfig for --observe (default: in-cluster, else ~/.kube)"
    )
    p.add_argument(
        "--slices",
        action="append",
        metavar="FILE",
        help="observe these slice files instead of the API server (repeatable)",
    )
    p.add_argument(
        "--observe-interval",
        type=seconds(),
        default=15.0,
        metavar="S",
        help="re-read the observed slices every S seconds (default %(default)s)",
    )
    p.add_argument(
        "--plugins-registry",
        default="/var/lib/kubelet/plugins_registry",
        metavar="DIR",
        help="kubelet plugin-registration directory, to find drivers no longer on the node",
    )
    add_log_args(p)


class ServeView:
    """ExporterView of a node toposlice does not publish for: the snapshot, and device
    health as the driver would judge it from each discovery (NIC links down, devices gone);
    nothing is allocated."""

    def __init__(self, driver: str = "toposlice.dev") -> None:
        from driver.health.monitor import HealthMonitor

        self._snapshot: Any = None
        self.last_error = ""
        self.health_monitor = HealthMonitor(driver)

    def snapshot(self) -> Any:
        return self._snapshot

    def set(self, snap: Any) -> None:
        self.health_monitor.update_snapshot(snap)
        self._snapshot = snap

    def status(self) -> Any:
        from driver.interfaces import DriverStatus

        return DriverStatus(last_error=self.last_error, details={"mode": "serve"})

    def allocated(self) -> Mapping[str, str]:
        return {}

    def health(self) -> list[Any]:
        return self.health_monitor.current()


def run(args: argparse.Namespace) -> int:
    from driver.exporter.http_server import HttpServer
    from driver.exporter.metrics import DriverMetrics
    from driver.plumbing.checks import parse_http_addr
    from toposlice.render import graph_to_dot

    # Bad flags exit 2 before anything binds (cli.main prints the ValueError in one line).
    parse_http_addr(args.http_addr)
    check_source(args)
    if args.slices:
        from driver.publisher.observe import load_slice_files

        load_slice_files(args.slices)  # unreadable or not YAML: ValueError naming the file
    elif args.observe and args.kubeconfig:
        from driver.plumbing.checks import check_kubeconfig

        check_kubeconfig(args.kubeconfig)
    setup_from_args(args)
    from toposlice.discovery_worker import SWITCH_INTERVAL

    sys.setswitchinterval(SWITCH_INTERVAL)  # see toposlice/discovery_worker.py
    loader = inventory_loader(args)
    opts = normalize_options(args)
    gc.freeze()  # start-up objects: out of the collector's way for good
    view = ServeView(opts.driver)
    metrics = DriverMetrics()

    def ready() -> tuple[bool, str]:
        return (True, "ok") if view.snapshot() is not None else (False, "no discovery yet")

    # SIGTERM (the kubelet, systemd) stops with 0; SIGINT (Ctrl-C) with 130, as a shell
    # expects. Both set the event (from a thread, never in the handler: shutdown.py): the
    # loop below ends, and the finally stops the observer, the discovery helper (which
    # ignores SIGINT: discovery_worker.py) and the server. Whatever still runs
    # shutdown.GRACE seconds after the signal (a discovery stuck in a read) is not waited
    # for: the process ends with the same status.
    from toposlice.shutdown import StopSignals

    signals = StopSignals(name="toposlice serve").install()
    stop = signals.event
    server = HttpServer(
        args.http_addr, view, metrics, ready=ready, publishes=False, dot=graph_to_dot
    )
    try:
        server.start()
    except OSError as exc:  # the address is in use, or not this host's: a runtime failure
        print(f"toposlice: error: --http-addr {args.http_addr}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        _serve(args, view, server, metrics, loader, opts.driver, stop)
    finally:
        server.stop(timeout=1.0)
    return signals.status()


def _serve(
    args: argparse.Namespace,
    view: ServeView,
    server: Any,
    metrics: Any,
    loader: Any,
    driver: str,
    stop: threading.Event,
) -> None:
    """The discovery loop of a started server, until ``stop`` (SIGTERM/SIGINT)."""
    from toposlice.discovery_worker import DiscoveryWorker, discover_snapshot

    log.info("serving on %s", server.url)
    observer = None
    if args.observe or args.slices:
        observer = _observer(args, view, server, driver)

    worker = None if args.discover_in_process else DiscoveryWorker(args)

    def discover_once(first: bool) -> bool:
        start = time.perf_counter()
        try:
            if worker is not None:
                snap = worker.snapshot(stop)
                if snap is None:  # stopped meanwhile: the helper is killed below
                    return False
            else:
                snap = discover_snapshot(args, loader)
            inv = snap.inventory
        except Exception as exc:
            if first and isinstance(exc, ValueError):
                # The source itself is bad (an unknown machine, a host name that is no node
                # name): one line and exit 2 through cli.main, not a 503 forever.
                raise
            view.last_error = f"discovery failed: {exc}"
            log.warning("%s", view.last_error)
            metrics.discovery(time.perf_counter() - start, None, failed=True)
            return False
        metrics.discovery(time.perf_counter() - start, inv)
        server.publish(snap)  # rendered before /readyz can say ready
        view.set(snap)
        view.last_error = ""
        if observer is not None:
            observer.poke()
        return True

    backoff = 1.0
    try:
        if observer is not None:
            observer.start()
        first = True
        while not stop.is_set():
            ok, first = discover_once(first), False
            if ok:
                backoff = 1.0
                stop.wait(args.rediscover_interval)
            else:
                stop.wait(backoff)
                backoff = min(backoff * 2, max(args.rediscover_interval, 1.0))
    finally:
        if observer is not None:
            observer.stop(timeout=0.5)  # a daemon thread: an API call in flight may go on
        if worker is not None:
            worker.close(kill=stop.is_set())


def _observer(args: argparse.Namespace, view: ServeView, server: Any, own_driver: str) -> Any:
    from driver.publisher.observe import ApiSlices, Observer, load_slice_files

    files = list(args.slices or [])
    if files:

        def source() -> list[dict[str, Any]]:
            return load_slice_files(files)

    else:
        holder: dict[str, ApiSlices] = {}

        def source() -> list[dict[str, Any]]:
            snap = view.snapshot()
            if "api" not in holder:
                holder["api"] = ApiSlices(snap.node_name, args.kubeconfig)
            return holder["api"].list()

    return Observer(
        source,
        view.snapshot,
        lambda report: server.publish(normalization=report),
        interval=args.observe_interval,
        registry_dir=args.plugins_registry,
        exclude_driver=own_driver,
    )
