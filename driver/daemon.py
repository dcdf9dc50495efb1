"""The running driver: wires discovery snapshots to the kubelet services, the publisher,
health and the HTTP exporter.

Start order (each step only once the one before worked):

0. (the CLI, before it builds the daemon) the configuration: names, kubeconfig
   (``load_config``) and whether the HTTP address can be bound (``check_listen``), so a bad
   one leaves no socket or directory behind on the host;
1. discovery through the injected ``discover`` callable (the CLI passes
   ``toposlice.sources.inventory_loader(args)``; nothing here imports a probe);
2. claim state (checkpoint, CDI specs), the DRA service socket, then the registration
   socket (so the kubelet never registers a plugin whose service is not up yet);
3. the API server and the Node, retried for ``startup_timeout`` seconds; when that fails
   the sockets are removed again, and so is what this start made that holds nothing (the
   checkpoint it wrote while no claim is recorded in it, then the directories it created
   that are empty: never one that was there before), and :class:`StartupError` says why
   in one line (the command exits 1);
4. the publisher, health pump, rediscovery (timer + udev on a live host) and the HTTP server.

After start, an unreachable API server is waited out by the publisher (backoff); claims
keep being prepared from the checkpoint where they can.

:meth:`Daemon.stop` (SIGTERM): remove the registration socket, let in-flight gRPC calls
finish (``grace``), remove ``dra.sock``, stop the loops. The checkpoint, CDI specs and
the published slices stay: a restarted driver carries on with them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from discovery.model import Inventory
from driver.config import DaemonConfig
from driver.health.monitor import EventSource, HealthMonitor, LinkState, sysfs_link_reader
from driver.interfaces import DeviceHealth, DriverStatus
from driver.plumbing.kube import (
    KubeConfigError,
    KubeUnavailable,
    NodeNotFound,
    build_api_client,
    driver_user_agent,
    get_node,
    on_request,
)
from driver.plumbing.logs import log_dropped
from normalize.snapshot import Snapshot, build_snapshot

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from driver.kubelet.dra_server import DraServer
    from driver.kubelet.registration import Registrar
    from driver.kubelet.state import DriverState
    from driver.kubelet.vendor_cdi import VendorCdi
    from driver.plumbing.hotplug import Debouncer, UdevWatcher
    from driver.publisher.neighbours import NeighbourWatch
    from driver.publisher.node_pods import NodePods
    from driver.publisher.slices import SlicePublisher
    from driver.publisher.topology_objects import ObjectKind, TopologyObjectWriter
    from normalize.crossdriver import Neighbourhood, NormalizationReport

log = logging.getLogger("toposlice.daemon")

LINK_POLL_S = 5.0


class StartupError(RuntimeError):
    """The driver cannot start; the message is the one line to print."""


def device_kind(device: Mapping[str, Any]) -> str | None:
    attr = (device.get("attributes") or {}).get("type") or {}
    kind = attr.get("string") if isinstance(attr, dict) else None
    return kind if isinstance(kind, str) else None


def published_snapshot(snap: Snapshot, kinds: frozenset[str]) -> Snapshot:
    """The snapshot restricted to the device kinds this driver publishes: what the pool,
    claim preparation, health and the exporter all see as "our devices"."""
    devices = tuple(d for d in snap.devices if device_kind(d) in kinds)
    if len(devices) == len(snap.devices):
        return snap
    names = {d["name"] for d in devices}
    vertex_devices = {v: n for v, n in snap.vertex_devices.items() if n in names}
    dropped = tuple(d for d in snap.dropped if d.device in names)
    return dataclasses.replace(
        snap, devices=devices, vertex_devices=vertex_devices, dropped=dropped
    )


def _settle_memory() -> None:
    """After start-up: collect its garbage once, keep the survivors out of later
    collections, and hand freed heap back to the OS (glibc keeps it otherwise)."""
    import ctypes
    import gc

    gc.collect()
    gc.freeze()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def missing_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """The directories among ``paths`` and their ancestors that do not exist yet, deepest
    first: what creating ``paths`` (``mkdir -p``) would make."""
    out: set[Path] = set()
    for p in paths:
        d = Path(p).absolute()
        while not os.path.lexists(d) and d != d.parent:
            out.add(d)
            d = d.parent
    return sorted(out, key=lambda d: len(d.parts), reverse=True)


def remove_empty_dirs(dirs: Iterable[Path]) -> None:
    """``rmdir`` each of ``dirs`` in order (deepest first); one that is not empty stays."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:  # not empty, already gone, not a directory: leave it
            pass


class ClaimReaderWhenConnected:
    """The :class:`~driver.interfaces.ClaimReader` before and after the API server is
    connected: a prepare that arrives first waits (bounded) instead of failing at once."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._ready = threading.Event()
        self._reader: Any = None

    def connect(self, client: ApiClient) -> None:
        from driver.kubelet.claims import KubeClaimReader

        self._reader = KubeClaimReader(client)
        self._ready.set()

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if not self._ready.wait(self.wait_s):
            raise RuntimeError("not connected to the API server yet")
        claim: dict[str, Any] = self._reader.get_claim(namespace, name)
        return claim


class Daemon:
    """Also the :class:`~driver.interfaces.ExporterView` of the HTTP server."""

    def __init__(
        self,
        cfg: DaemonConfig,
        discover: Callable[[], Inventory],
        *,
        event_sources: Sequence[EventSource] = (),
        link_reader: Callable[[str], LinkState | None] | None = None,
        api_client: ApiClient | None = None,
        snapshotter: Callable[[], Snapshot] | None = None,
        dot: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.discover = discover
        self.snapshotter = snapshotter
        """Rediscovery elsewhere (the CLI passes a niced helper process, so a discovery
        does not hold the GIL the gRPC and HTTP threads need); the first discovery stays
        in-process: registration waits for it and a helper would start first."""
        self.dot = dot
        """The ``?format=dot`` renderer for the exporter (the CLI passes
        ``toposlice.render.graph_to_dot``; driver/ cannot import it)."""
        self.event_sources = list(event_sources)
        if link_reader is None and cfg.live:
            link_reader = sysfs_link_reader(cfg.root)
        self.health_monitor = HealthMonitor(cfg.driver_name, link_reader=link_reader)
        self.client = api_client
        self.claim_reader = ClaimReaderWhenConnected(cfg.startup_timeout + 5.0)
        self._snap: Snapshot | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.state: DriverState | None = None
        self.dra: DraServer | None = None
        self.registrar: Registrar | None = None
        self.publisher: SlicePublisher | None = None
        self.node: dict[str, Any] | None = None
        """The Node as read at start (its UID owns the slices; the Events name it)."""
        self.topology_writers: list[TopologyObjectWriter] = []
        """NodeResourceTopology / NodeFeature writers (``--nrt``, ``--node-feature``)."""
        self.node_pods: NodePods | None = None
        """The node's pods, for the NRT's pods fingerprint (``--nrt``)."""
        self.http: Any = None
        self.metrics: Any = None
        self.debouncer: Debouncer | None = None
        self.udev: UdevWatcher | None = None
        self._made_dirs: list[Path] = []
        """Directories this start is about to create (see :meth:`_fail_start`)."""
        self.started_at = time.monotonic()
        self._started = False
        self._stopped = False
        self.last_discovery_error = ""
        self.nvml_gap = ""
        """Why NVIDIA GPUs are published without NVML (driver/health/nvml_gap.py); empty if not."""
        self.vendor_cdi_gap = ""
        """Why GPUs get no vendor CDI device (discovery/vendor_cdi.py); empty if not."""
        self.neighbour_report: NormalizationReport | None = None
        """The other drivers' devices matched to the hardware, as last read."""
        self.neighbours: NeighbourWatch | None = None
        """The other drivers on the node (driver/publisher/neighbours.py), once connected."""

    # -- ExporterView --------------------------------------------------------------------

    def snapshot(self) -> Snapshot | None:
        return self._snap

    def status(self) -> DriverStatus:
        reg = self.registrar
        pub = self.publisher
        errors = [
            e
            for e in (
                reg.error if reg is not None else "",
                pub.last_error if pub is not None else "",
                self.last_discovery_error,
                *(w.last_error for w in self.topology_writers),
            )
            if e
        ]
        return DriverStatus(
            registered=bool(reg is not None and reg.registered),
            publisher_synced=bool(pub is not None and pub.synced),
            last_error=errors[0] if errors else "",
            details={
                "node": self.cfg.node_name,
                "driver": self.cfg.driver_name,
                "pool_generation": pub.generation if pub is not None else 0,
                "slice_writes": dict(pub.writes) if pub is not None else {},
                **{f"{w.kind.plural}_writes": dict(w.writes) for w in self.topology_writers},
                "uptime_s": round(time.monotonic() - self.started_at, 1),
                **self._degraded(),
            },
        )

    def _degraded(self) -> dict[str, Any]:
        gaps = [g for g in (self.nvml_gap, self.vendor_cdi_gap) if g]
        out: dict[str, Any] = {"degraded": "; ".join(gaps)} if gaps else {}
        near = self.neighbours.current if self.neighbours is not None else None
        if near is not None and near.drivers:
            out["other_drivers"] = list(near.drivers)
            out["bridges"] = list(self._bridges())
            if near.taken:
                yielding = self.cfg.duplicates == "yield"
                out["yielded" if yielding else "double_published"] = near.message(yielding)
        return out

    def _bridges(self) -> tuple[str, ...]:
        """The dialects spoken now: the flag's, and with ``--bridge auto`` the neighbours'."""
        static = self.cfg.normalize.bridges
        near = self.neighbours.current if self.neighbours is not None else None
        if not self.cfg.bridge_auto or near is None:
            return static
        return tuple(sorted(set(static) | set(near.bridges)))

    def _left_to_others(self) -> frozenset[str]:
        near = self.neighbours.current if self.neighbours is not None else None
        if near is None or self.cfg.duplicates != "yield":
            return frozenset()
        return frozenset(near.taken)

    def allocated(self) -> Mapping[str, str]:
        return self.state.prepared_devices() if self.state is not None else {}

    def health(self) -> list[DeviceHealth]:
        return self.health_monitor.current()

    # -- start ---------------------------------------------------------------------------

    def _discover_snapshot(self) -> Snapshot:
        if self.snapshotter is not None and self._snap is not None:
            snap = self.snapshotter()
        else:
            snap = build_snapshot(self.discover(), self.cfg.node_name, self.cfg.normalize)
        for warning in snap.inventory.warnings:
            log.warning("discovery: %s", warning)
        return published_snapshot(snap, self.cfg.publish)

    def _connect(self) -> ApiClient:
        try:
            client = self.client or build_api_client(
                self.cfg.kubeconfig, user_agent=driver_user_agent(self.cfg.node_name)
            )
        except KubeConfigError as exc:
            raise StartupError(str(exc)) from exc
        if self.metrics is not None:
            on_request(client, self.metrics.api_request)
        deadline = time.monotonic() + self.cfg.startup_timeout
        delay = 0.5
        while True:
            try:
                self.node = get_node(client, self.cfg.node_name)
                return client
            except (KubeUnavailable, NodeNotFound) as exc:
                if time.monotonic() + delay > deadline or self._stop.is_set():
                    raise StartupError(str(exc)) from exc
                log.warning("%s; retrying in %.1f s", exc, delay)
                self._stop.wait(delay)  # a stop asked meanwhile ends the wait
                delay = min(delay * 2, 5.0)

    def start(self) -> None:
        from driver.kubelet.dra_server import start_dra_server
        from driver.kubelet.registration import start_registration
        from driver.kubelet.state import TOPO_DIR, DriverState

        cfg = self.cfg
        try:
            self._snap = self._discover_snapshot()
        except (OSError, ValueError) as exc:
            raise StartupError(f"discovery failed: {exc}") from exc
        self.health_monitor.update_snapshot(self._snap)
        # The kubelet side first: importing the kubernetes client takes longer than all
        # of this, and registration should not wait for it. Claims that arrive before the
        # API server is connected wait for it (see _ClaimReaderWhenConnected).
        self._made_dirs = missing_dirs(
            (
                cfg.cdi_root,
                os.path.join(cfg.state_dir, TOPO_DIR),
                cfg.plugins_dir,
                cfg.registrar_dir,
            )
        )
        from driver.kubelet.device_metadata import MetadataWriter

        try:
            metadata = MetadataWriter(
                cfg.driver_name,
                cfg.plugins_dir,
                cfg.cdi_root,
                versions=cfg.device_metadata_versions,
                enabled=cfg.device_metadata,
            )
            self.state = DriverState(
                cfg.driver_name,
                cfg.node_name,
                cfg.cdi_root,
                cfg.state_dir,
                cfg.root,
                self.claim_reader,
                self.snapshot,
                vendor_cdi=self._vendor_cdi(),
                metadata=metadata,
            )
            self.dra = start_dra_server(
                cfg.plugins_dir, self.state, self.health_monitor, snapshot_fn=self.snapshot
            )
            self.registrar = start_registration(
                cfg.registrar_dir, cfg.driver_name, self.dra.endpoint, self.dra.supported_versions
            )
        except (OSError, ValueError) as exc:
            self._fail_start()
            raise StartupError(f"cannot serve the kubelet: {exc}") from exc
        if cfg.http_addr:  # metrics only have a reader with the HTTP server
            from driver.exporter.metrics import DriverMetrics

            self.metrics = DriverMetrics()
        try:
            self.client = self._connect()
        except StartupError:
            self._fail_start(grace=1.0)
            raise
        self.claim_reader.connect(self.client)
        # Said once the start can no longer fail for want of the API server: a start that
        # fails prints its one error line, not a "serving" line it then takes back.
        log.info(
            "serving %s on %s, registration at %s",
            cfg.driver_name,
            self.dra.endpoint,
            cfg.registrar_dir,
        )
        if self._snap is not None:
            log_dropped(log, self._snap)  # what the slices will lack, once they are written
        from driver.publisher.slices import (
            SlicePublisher,  # after registration: not on the kubelet's path
        )

        self.publisher = SlicePublisher(
            self.client,
            cfg.driver_name,
            cfg.node_name,
            max_devices_per_slice=cfg.normalize.max_devices_per_slice,
            resync_seconds=cfg.resync_interval,
            node_uid=(self.node or {}).get("metadata", {}).get("uid"),
        )
        if self.metrics is not None:
            metrics = self.metrics
            self.publisher.on_write = lambda op, err, ok: metrics.slice_write(op, err, ok=ok)
        if self.state is not None:  # claims holding another driver's GPUs: the NCCL file
            self.state.other_slices = self.publisher.other_slices
        self._start_neighbours()  # before the first write: never publish what others do
        self._publish_desired()
        self._check_nvml(self._snap.inventory)
        self._check_vendor_cdi(self._snap.inventory)
        self.publisher.start()
        self._start_topology_objects()
        self._spawn(self._health_pump, "health-pump")
        for source in self.event_sources:
            self._spawn(self._event_loop_for(source), "health-events")
        if self.health_monitor.link_reader is not None:
            self._spawn(self._link_loop, "link-poll")
        self._spawn(self._rediscover_loop, "rediscover")
        self._start_hotplug()
        if cfg.http_addr:
            self._start_http(cfg.http_addr)
        self._started = True
        _settle_memory()

    def _fail_start(self, grace: float = 5.0) -> None:
        """Stop, then take back what this start left on the host that holds nothing: the
        checkpoint it wrote (there was none) while no claim is recorded in it, then the
        directories it created, deepest first, those still empty. A directory that was
        there before, and a checkpoint with claims (prepared meanwhile), stay."""
        self.stop(grace)
        state = self.state
        if state is not None and state.load_status == "missing" and not state.claims():
            with contextlib.suppress(OSError):  # gone already, or not ours to remove
                state.checkpoint_path.unlink()
        remove_empty_dirs(self._made_dirs)

    def _start_http(self, addr: str) -> None:
        from driver.exporter.http_server import HttpServer

        try:
            self.http = HttpServer(addr, self, self.metrics, dot=self.dot).start()
        except OSError as exc:
            self._fail_start()
            raise StartupError(f"--http-addr {addr}: {exc.strerror or exc}") from exc
        log.info("HTTP on %s", self.http.url)
        if self.neighbour_report is not None:  # read before the server was up
            self.http.publish(normalization=self.neighbour_report)

    def _start_hotplug(self) -> None:
        from driver.plumbing.hotplug import Debouncer, start_udev

        self.debouncer = Debouncer(self._rediscover_quietly)
        if self.cfg.live:
            self.udev = start_udev(self.debouncer)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _start_topology_objects(self) -> None:
        """The NRT / NodeFeature writers the flags ask for (docs/integrations.md)."""
        cfg = self.cfg
        if not (cfg.nrt or cfg.node_feature) or self.client is None:
            return
        from driver.publisher.topology_objects import (
            NODE_FEATURE_KIND,
            NRT_KIND,
            TopologyObjectWriter,
        )

        kinds = ([NRT_KIND] if cfg.nrt else []) + ([NODE_FEATURE_KIND] if cfg.node_feature else [])
        for kind in kinds:
            self.topology_writers.append(
                TopologyObjectWriter(
                    self.client, kind, cfg.node_name, resync_seconds=cfg.resync_interval
                )
            )
        if cfg.nrt and cfg.topology_manager_policy is None:
            log.warning(
                "--nrt without --topology-manager-policy: the NodeResourceTopology scheduler "
                "plugin reads such an object as invalid and refuses the node; pass the "
                "kubelet's policy (chart: integrations.nrt.topologyManagerPolicy)"
            )
        if cfg.nrt and cfg.nrt_pods_fingerprint:
            from driver.publisher.node_pods import NodePods

            self.node_pods = NodePods(self.client, cfg.node_name, self._pods_changed).start()
            # The first object carries the fingerprint, so a start is one write, not two;
            # a slow server only delays it until its LIST is in (NodePods tells then).
            if not self.node_pods.wait_synced(min(10.0, cfg.startup_timeout)):
                log.warning("the node's pods are not listed yet: the NRT waits for them")
        if self._snap is not None:
            self._set_topology_objects(self._snap)
        for writer in self.topology_writers:
            writer.start()

    def _pods_changed(self, fingerprint: str) -> None:
        from driver.publisher.topology_objects import NRT_KIND

        log.debug("pods fingerprint of node %s: %s", self.cfg.node_name, fingerprint)
        if self._snap is not None:  # pods change only the NRT: the NodeFeature stays as built
            self._set_topology_objects(self._snap, only=NRT_KIND)

    def _set_topology_objects(self, snap: Snapshot, only: ObjectKind | None = None) -> None:
        """Rebuild the objects of ``snap`` (of the one kind ``only``, when given)."""
        from driver.publisher.topology_objects import NRT_KIND

        cfg = self.cfg
        for writer in self.topology_writers:
            if only is not None and writer.kind is not only:
                continue
            try:
                if writer.kind is NRT_KIND:
                    from normalize.nrt import build_nrt

                    pods = self.node_pods
                    fingerprint = None if pods is None else pods.fingerprint()
                    if pods is not None and fingerprint is None:
                        continue  # not listed yet: NodePods calls again after its LIST
                    obj = build_nrt(
                        snap.inventory,
                        cfg.node_name,
                        policy=cfg.topology_manager_policy,
                        scope=cfg.topology_manager_scope,
                        pods_fingerprint=fingerprint,
                        topology_policies=cfg.nrt_topology_policies,
                    )
                else:
                    from normalize.node_feature import build_node_feature

                    obj = build_node_feature(
                        snap.inventory, cfg.node_name, cfg.node_feature_namespace or ""
                    )
            except ValueError as exc:  # checked at start; a bad inventory keeps the last one
                log.error("%s not updated: %s", writer.kind.name, exc)
                continue
            writer.set_desired(obj)

    # -- loops ---------------------------------------------------------------------------

    def _publish_desired(self) -> None:
        from normalize.dialects import bridge_devices

        snap, pub = self._snap, self.publisher
        if snap is None or pub is None:
            return
        others = self._left_to_others()
        devices = [d for d in snap.devices if d["name"] not in others]
        devices += self.health_monitor.lost_devices()
        pub.set_devices(bridge_devices(devices, self._bridges()), self.health_monitor.taints())

    def _start_neighbours(self) -> None:
        """Read the node's other drivers from the publisher's watch of the node's slices:
        once now, waiting for its first LIST (before anything is published), then every
        resync interval (no request: the watch keeps the view)."""
        from driver.publisher.neighbours import NeighbourWatch

        pub, cfg = self.publisher, self.cfg
        if pub is None or not (cfg.bridge_auto or cfg.duplicates == "yield"):
            return
        self.neighbours = NeighbourWatch(
            pub.other_slices,
            self.snapshot,
            self._neighbours_changed,
            registry_dir=cfg.registrar_dir,
            interval=cfg.resync_interval,
            on_report=self._neighbour_report,
        )
        pub.view.start().wait_synced(cfg.startup_timeout)
        self.neighbours.read_once()
        self.neighbours.start()

    def _neighbour_report(self, report: NormalizationReport) -> None:
        """The other drivers' devices joined to the graph on /v1/topology (attrs.dra): a
        vendor's GPU maps to its vertex as toposlice's own devices do."""
        report = dataclasses.replace(report, withheld=self._left_to_others())
        self.neighbour_report = report
        if self.http is not None:
            self.http.publish(normalization=report)

    def _neighbours_changed(self, near: Neighbourhood) -> None:
        """Say once what changed (log, Node Event, metric), then publish accordingly."""
        from driver.publisher.neighbours import REASON

        if self.metrics is not None:
            self.metrics.set_neighbours(near, yielding=self.cfg.duplicates == "yield")
        if near.drivers:
            log.info(
                "other drivers on the node: %s; speaking %s",
                ", ".join(near.drivers),
                ", ".join(self._bridges()) or "no other dialect",
            )
        text = near.message(yielding=self.cfg.duplicates == "yield")
        if text:
            log.warning("%s", text)
            # Leaving a device to its driver is the intended outcome (Normal); keeping a
            # second copy of it (--duplicates publish) can hand it out twice (Warning).
            yielding = self.cfg.duplicates == "yield"
            self._post_node_event(text, REASON, "Normal" if yielding else "Warning")
        self._publish_desired()
        if self._snap is not None and self.state is not None:
            self._check_vendor_cdi(self._snap.inventory)  # GPUs left to a vendor driver

    def rediscover(self) -> bool:
        """Discover again; True when the published devices changed."""
        started = time.monotonic()
        try:
            snap = self._discover_snapshot()
        except Exception as exc:  # a bad rediscovery keeps the last good snapshot
            self.last_discovery_error = f"discovery failed: {exc}"
            if self.metrics is not None:
                self.metrics.discovery(time.monotonic() - started, None, failed=True)
            log.exception("rediscovery failed; keeping the previous snapshot")
            return False
        self.last_discovery_error = ""
        if self.metrics is not None:
            self.metrics.discovery(time.monotonic() - started, snap.inventory)
        old = self._snap
        self._snap = snap
        if old is not None and old.dropped != snap.dropped:
            log_dropped(log, snap)
        self.health_monitor.update_snapshot(snap)
        self._check_nvml(snap.inventory)
        self._check_vendor_cdi(snap.inventory)
        changed = old is None or list(old.devices) != list(snap.devices)
        self._publish_desired()
        self._set_topology_objects(snap)
        log.debug("rediscovery took %.2f s", time.monotonic() - started)
        if changed:
            log.info("devices changed: %d device(s) now", len(snap.devices))
        return changed

    def _check_nvml(self, inv: Inventory) -> None:
        """NVIDIA GPUs without NVML: metric, log, readiness detail and a Node Event, once
        per distinct reason (driver/health/nvml_gap.py)."""
        from driver.health.nvml_gap import REASON, missing_gpus, nvml_gap

        if self.metrics is not None:
            self.metrics.nvml_missing_gpus.set(missing_gpus(inv))
        gap = nvml_gap(inv)
        if gap == self.nvml_gap:
            return
        self.nvml_gap = gap
        if not gap:
            log.info("NVML answers again")
            return
        log.warning("%s", gap)
        self._post_node_event(gap, REASON)

    def _vendor_cdi(self) -> VendorCdi:
        from discovery.vendor_cdi import spec_dirs
        from driver.kubelet import cdi
        from driver.kubelet.vendor_cdi import VendorCdi

        cfg = self.cfg
        # toposlice's own spec files (one per claim, and the device metadata specs
        # ``<driver>_metadata_*``) hold no vendor device: not read.
        own = (
            f"{cdi.vendor_for(cfg.driver_name)}-",
            f"{cfg.driver_name}-",
            f"{cfg.driver_name}_metadata_",
        )
        dirs = cfg.cdi_spec_dirs or spec_dirs(None, cfg.cdi_root)
        return VendorCdi(dirs, cfg.root, own_prefixes=own)

    def _check_vendor_cdi(self, inv: Inventory) -> None:
        """GPUs without the vendor's CDI device: gauge, one log line, readiness detail and
        one Node Event per distinct reason, as for NVML; never per claim."""
        state = self.state
        if state is None or state.vendor_cdi is None:
            return
        from driver.kubelet.vendor_cdi import EVENT_REASON

        gap = state.vendor_cdi.gap(self._own_gpus(inv))
        if self.metrics is not None:
            self.metrics.vendor_cdi_missing_gpus.set(gap.missing)
        if gap.message == self.vendor_cdi_gap:
            return
        self.vendor_cdi_gap = gap.message
        if not gap.message:
            log.info("every GPU has its vendor CDI device again")
            return
        log.warning("%s", gap.message)
        self._post_node_event(gap.message, EVENT_REASON)

    def _own_gpus(self, inv: Inventory) -> Inventory:
        """``inv`` with only the GPUs toposlice publishes: one left out (``--publish``
        without gpu, or published by the vendor's own DRA driver, which writes its CDI spec
        per claim, ``k8s.gpu.nvidia.com/claim``) needs no vendor CDI device of toposlice's."""
        snap = self._snap
        names = set(snap.vertex_devices.values()) if snap is not None else set()
        names -= self._left_to_others()
        vertex = snap.vertex_devices if snap is not None else {}
        gpus = [g for g in inv.gpus if vertex.get(f"gpu:{g.bus_id}") in names]
        if len(gpus) == len(inv.gpus):
            return inv
        return dataclasses.replace(inv, gpus=gpus)

    def _post_node_event(self, message: str, reason: str, kind: str = "Warning") -> None:
        """An Event on the Node, in a thread of its own (the API may be slow)."""
        from driver.health.nvml_gap import post_node_event

        client = self.client
        if client is None:
            return
        node_name = self.cfg.node_name

        def post() -> None:
            node = self.node  # read at start; the event names its UID
            if node is None:
                try:
                    node = get_node(client, node_name)
                except Exception as exc:
                    log.warning(
                        "could not read node %s for the %s event: %s", node_name, reason, exc
                    )
                    return
            post_node_event(
                client, node, message, f"{self.cfg.driver_name}-kubelet-plugin", reason, kind
            )

        self._spawn(post, "node-event")

    def _rediscover_quietly(self) -> None:
        self.rediscover()

    def _rediscover_loop(self) -> None:
        while not self._stop.wait(self.cfg.rediscover_interval):
            self.rediscover()

    def _health_pump(self) -> None:
        version = self.health_monitor.version
        while not self._stop.is_set():
            new = self.health_monitor.wait_change(version, 0.5)
            if new != version:
                version = new
                self._publish_desired()

    def _event_loop(self, source: EventSource) -> None:
        while not self._stop.is_set():
            try:
                events = source.poll(0.5)
            except Exception:
                log.exception("health event source failed; retrying")
                self._stop.wait(5)
                continue
            if events:
                self.health_monitor.report_many(events)
        source.close()

    def add_event_source(self, source: EventSource) -> None:
        """Start feeding ``source``'s events into health (after :meth:`start`)."""
        self.event_sources.append(source)
        self._spawn(self._event_loop_for(source), "health-events")

    def _event_loop_for(self, source: EventSource) -> Callable[[], None]:
        return lambda: self._event_loop(source)

    def _link_loop(self) -> None:
        while not self._stop.wait(LINK_POLL_S):
            try:
                self.health_monitor.poll_links()
            except Exception:
                log.exception("reading NIC link state failed")

    # -- stop ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    def stop(self, grace: float = 5.0) -> None:
        """Deregister, finish in-flight calls, remove our sockets; keep checkpoint and slices.
        Once: a failed start stops the daemon, and its caller may stop it again."""
        self._stop.set()
        if self._stopped:
            return
        self._stopped = True
        if self.registrar is not None:
            self.registrar.stop()
        if self.dra is not None:
            self.dra.stop(grace)
        if self.udev is not None:
            self.udev.stop()
        if self.debouncer is not None:
            self.debouncer.stop()
        if self.neighbours is not None:
            self.neighbours.stop()
        if self.publisher is not None:
            self.publisher.stop()
        for writer in self.topology_writers:
            writer.stop()
        if self.node_pods is not None:
            self.node_pods.stop()
        if self.http is not None:
            self.http.stop()
        for t in self._threads:
            t.join(2)
        if self._started:  # a failed start says so in its error, not in a "stopped" line
            log.info("stopped")
