"""``toposlice run``: the DRA kubelet plugin daemon (registration, node service, slices,
health, exporter) for this node, or for a fake machine with ``--fake``.

Exit status: 0 after SIGTERM, 130 after SIGINT (Ctrl-C, as a shell expects); 2 for bad
flags; 1 when it cannot start (API server unreachable or Node missing after
``--startup-timeout``, sockets or address unusable).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from toposlice.sources import add_normalize_args, add_source_args, host_root, inventory_loader

log = logging.getLogger("toposlice.run")

#: Seconds ``run`` may take to stop after SIGTERM/SIGINT before it exits without waiting
#: for the rest (deregistering, in-flight gRPC calls, threads): under a pod's 30 s grace.
STOP_GRACE_S = 20.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from driver.config import add_driver_args

    add_source_args(p)
    add_normalize_args(p, driver_env=True)
    add_driver_args(p)


def _nvml_sources(daemon: Any) -> None:
    """XID events on a real GPU host (pynvml present and a driver loaded)."""
    snap = daemon.snapshot()
    gpus = [g.bus_id for g in snap.inventory.gpus if g.vendor == "nvidia"] if snap else []
    if not gpus:
        return
    try:
        import pynvml

        from driver.health.nvml_events import NvmlXidSource
        from plugins.nvidia import preload_from_driver_root

        preload_from_driver_root()  # $NVIDIA_DRIVER_ROOT: the chart's driver-root mode

        daemon.add_event_source(NvmlXidSource(pynvml, gpus))
    except Exception as exc:  # no library / no driver: health still has links and loss
        log.warning("no NVML XID events: %s", exc)


def run(args: argparse.Namespace) -> int:
    from driver.config import load_config
    from driver.plumbing.checks import ConfigError, ListenError, check_listen
    from driver.plumbing.logs import setup_logging
    from toposlice.sources import check_source, normalize_options

    live = not (args.fake or args.inventory or getattr(args, "gathered", None))
    try:  # every flag checked before anything is created on the host
        cfg = load_config(args, host_root(args.root), live, normalize_options(args))
        check_source(args)
    except (ConfigError, ValueError) as exc:
        print(f"toposlice: error: {exc}", file=sys.stderr)
        return 2
    if cfg.http_addr:
        try:
            check_listen(cfg.http_addr)  # in use: exit 1 before any socket or directory exists
        except ListenError as exc:
            print(f"toposlice: error: {exc}", file=sys.stderr)
            return 1
    setup_logging(cfg.log_format, cfg.log_level)
    from toposlice.discovery_worker import SWITCH_INTERVAL

    sys.setswitchinterval(SWITCH_INTERVAL)  # see toposlice/discovery_worker.py

    from driver.daemon import Daemon, StartupError
    from toposlice.discovery_worker import DiscoveryWorker
    from toposlice.render import graph_to_dot

    worker = DiscoveryWorker(args, cfg.node_name)
    daemon = Daemon(cfg, inventory_loader(args), snapshotter=worker.snapshot, dot=graph_to_dot)
    from toposlice.shutdown import StopSignals

    def on_stop() -> None:  # on the signal watcher's thread, not in the handler
        log.info("signal %s: stopping", ",".join(str(int(s)) for s in signals.received))
        daemon.request_stop()

    # A pod gets SIGKILL 30 s after SIGTERM (the default grace): a stop that is still
    # running STOP_GRACE_S after the signal ends the process itself, with its exit status.
    signals = StopSignals(grace=STOP_GRACE_S, name="toposlice run", on_stop=on_stop).install()
    stopped_by = signals.received
    try:
        try:
            daemon.start()
        except StartupError as exc:
            daemon.stop(grace=0)
            if signal.SIGINT in stopped_by:  # Ctrl-C while it waited for the API server
                return 130
            print(f"toposlice: error: {exc}", file=sys.stderr)
            return 1
        if live:
            _nvml_sources(daemon)
        while not daemon.wait(1.0):
            pass
        daemon.stop()
    finally:
        worker.close(kill=bool(stopped_by))
    return 130 if signal.SIGINT in stopped_by else 0
