"""Prometheus metrics of the driver and exporter, on a registry of our own.

Two kinds of series live here:

* **Event counters** the daemon's parts update as things happen: gRPC calls and their
  latency (:meth:`DriverMetrics.grpc_call`, :meth:`DriverMetrics.time_grpc`), ResourceSlice
  writes and errors (:meth:`DriverMetrics.slice_write`), discovery runs
  (:meth:`DriverMetrics.discovery`). These are thread-safe prometheus-client objects.
* **State** derived from the current snapshot (device info, PCIe links, NVLinks), the
  cross-driver report and the live view (health, taints, allocations, readiness). The
  snapshot part is computed once per snapshot (:meth:`DriverMetrics.set_topology`) and the
  live part at scrape time, by a collector registered on the same registry.

Label policy (docs/metrics.md): only bounded values become labels — device identity (one
set per device of this node), fixed enums (gRPC method and code, slice operation, probe
name, health status, taint effect, check name) and driver names seen on this node, capped.
Free text (error messages, taint reasons, model strings outside ``*_info``) never does.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from threading import Lock
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from discovery.model import Inventory
from driver.exporter.links import pcie_links
from normalize.crossdriver import Neighbourhood

NAMESPACE = "toposlice"

# ``*_created`` series double the exposition for nothing a dashboard uses (process-wide).
disable_created_metrics()

#: Latency buckets for kubelet gRPC calls (prepare can take seconds with CDI writes).
GRPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DISCOVERY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

GRPC_CODES = frozenset(
    {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)
SLICE_OPERATIONS = frozenset({"create", "update", "patch", "delete"})
API_VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete"})
MAX_RESOURCES = 8
MAX_METHODS = 32
MAX_PROBES = 32
MAX_DRIVERS = 16
OTHER = "other"


class _Bounded:
    """Maps free input to a bounded label set: the first ``limit`` values, then ``other``."""

    def __init__(self, limit: int, allowed: frozenset[str] | None = None) -> None:
        self.limit = limit
        self.allowed = allowed
        self._seen: set[str] = set()
        self._lock = Lock()

    def __call__(self, value: str) -> str:
        if self.allowed is not None:
            return value if value in self.allowed else OTHER
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self.limit:
                return OTHER
            self._seen.add(value)
        return value


def grpc_method_name(method: str) -> str:
    """``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`` -> the last part."""
    return method.rsplit("/", 1)[-1] or OTHER


def error_class(code: int | str | None) -> str:
    """A bounded label for a failed API write: the HTTP status (``409``), else ``network``."""
    if isinstance(code, int) and 100 <= code <= 599:
        return str(code)
    if isinstance(code, str) and code.isdigit() and len(code) == 3:
        return code
    return "network"


@dataclass(frozen=True)
class DeviceInfo:
    """One DRA identity of a graph vertex, as the ``toposlice_device_info`` series shows it."""

    vertex: str
    kind: str
    vendor: str = ""
    model: str = ""
    bus_id: str = ""
    pcie_root: str = ""
    numa_node: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""


@dataclass
class _Topology:
    families: list[Metric] = field(default_factory=list)
    devices: list[DeviceInfo] = field(default_factory=list)
    text: bytes = b""


def _counts(
    name: str, doc: str, labels: list[str], counts: Mapping[tuple[str, str], int]
) -> Metric:
    """A gauge of counts keyed by (driver, x); drivers beyond MAX_DRIVERS fold into other."""
    drivers = _Bounded(MAX_DRIVERS)
    agg: dict[tuple[str, str], int] = {}
    for (drv, second), n in sorted(counts.items()):
        key = (drivers(drv), second)
        agg[key] = agg.get(key, 0) + n
    fam = GaugeMetricFamily(f"{NAMESPACE}_{name}", doc, labels=labels)
    for key, n in agg.items():
        fam.add_metric(list(key), float(n))
    return fam


class DriverMetrics:
    """All of toposlice's metrics on one :class:`CollectorRegistry`.

    Call from any thread. The daemon creates one and hands it to the gRPC services, the
    publisher and the HTTP server (which serves ``registry`` on ``/metrics``).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # Event counters and live state go on a private registry; the per-snapshot series
        # are pre-rendered to text in set_topology(), so a scrape formats only what changes.
        self._events = CollectorRegistry()
        r = self._events
        n = NAMESPACE
        self._methods = _Bounded(MAX_METHODS)
        self._codes = _Bounded(0, GRPC_CODES)
        self._ops = _Bounded(0, SLICE_OPERATIONS)
        self._probes = _Bounded(MAX_PROBES)
        self.grpc_requests = Counter(
            f"{n}_grpc_requests",
            "kubelet gRPC calls served, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.grpc_duration = Histogram(
            f"{n}_grpc_request_duration_seconds",
            "Time to serve a kubelet gRPC call",
            ["method"],
            buckets=GRPC_BUCKETS,
            registry=r,
        )
        self.slice_writes = Counter(
            f"{n}_resourceslice_writes",
            "ResourceSlice writes sent to the API server, by operation",
            ["operation"],
            registry=r,
        )
        self._verbs = _Bounded(0, API_VERBS)
        self._resources = _Bounded(MAX_RESOURCES)
        self.api_requests = Counter(
            f"{n}_api_requests",
            "Requests sent to the Kubernetes API server, by verb and resource",
            ["verb", "resource"],
            registry=r,
        )
        self.slice_errors = Counter(
            f"{n}_resourceslice_write_errors",
            "ResourceSlice writes that failed, by operation and HTTP status (or network)",
            ["operation", "code"],
            registry=r,
        )
        self.discovery_duration = Histogram(
            f"{n}_discovery_duration_seconds",
            "Time one discovery (sysfs walk and vendor probes) took",
            buckets=DISCOVERY_BUCKETS,
            registry=r,
        )
        self.discovery_errors = Counter(
            f"{n}_discovery_errors",
            "Discoveries that failed as a whole (no new snapshot)",
            registry=r,
        )
        self.probe_errors = Counter(
            f"{n}_probe_errors",
            "Discoveries in which a vendor probe ended in error, by probe",
            ["probe"],
            registry=r,
        )
        self.nvml_missing_gpus = Gauge(
            f"{n}_nvml_missing_gpus",
            "NVIDIA GPUs published from sysfs only because NVML is unavailable in the "
            "container (0 when NVML answers or there is none)",
            registry=r,
        )
        self.shared_devices = Gauge(
            f"{n}_devices_shared_with_other_drivers",
            "toposlice devices whose hardware another driver on the node publishes too, by "
            "that driver and what toposlice does: yielded (left out of its pool) or "
            "published (--duplicates publish: a pod can be given them twice)",
            ["driver", "action"],
            registry=r,
        )
        self.vendor_cdi_missing_gpus = Gauge(
            f"{n}_vendor_cdi_missing_gpus",
            "NVIDIA GPUs with the kernel driver bound but no usable nvidia.com/gpu CDI device "
            "in the CDI spec directories: their pods get no driver libraries",
            registry=r,
        )
        self.probe_up = Gauge(
            f"{n}_probe_up",
            "1 when the probe's last run was ok, 0 when unavailable or in error",
            ["probe"],
            registry=r,
        )
        self.inventory_warnings = Gauge(
            f"{n}_inventory_warnings",
            "Warnings of the newest inventory (damaged sysfs, degraded links, ...)",
            registry=r,
        )
        self.last_discovery = Gauge(
            f"{n}_last_discovery_timestamp_seconds",
            "Unix time the newest snapshot was taken",
            registry=r,
        )
        self._topology = _Topology()
        self._live: list[Callable[[], Iterable[Metric]]] = []
        r.register(_Collect(self._collect_live))
        self.registry.register(_Collect(self._collect_all))

    # ---- events (daemon parts call these) ------------------------------------------------

    def set_neighbours(self, near: Neighbourhood, *, yielding: bool) -> None:
        """The devices other drivers publish too (driver/publisher/neighbours.py)."""
        self.shared_devices.clear()
        counts = Tally(d for ids in near.taken.values() for d in {i.driver for i in ids})
        for driver, count in counts.items():
            self.shared_devices.labels(driver, "yielded" if yielding else "published").set(count)

    def grpc_call(self, method: str, seconds: float, code: str = "OK") -> None:
        """One served gRPC call: ``method`` as grpc gives it (full path or short name)."""
        m = self._methods(grpc_method_name(method))
        self.grpc_requests.labels(m, self._codes(code)).inc()
        self.grpc_duration.labels(m).observe(max(0.0, seconds))

    @contextmanager
    def time_grpc(self, method: str) -> Iterator[None]:
        """Times the block; an exception counts as ``INTERNAL`` (or its ``code().name``)."""
        start = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            code = "INTERNAL"
            code_fn = getattr(exc, "code", None)
            if callable(code_fn):
                try:
                    code = str(getattr(code_fn(), "name", code))
                except Exception:
                    code = "INTERNAL"
            self.grpc_call(method, time.perf_counter() - start, code)
            raise
        self.grpc_call(method, time.perf_counter() - start, "OK")

    def slice_write(
        self, operation: str, error: int | str | None = None, *, ok: bool = True
    ) -> None:
        """One ResourceSlice write (``create``/``update``/``patch``/``delete``); pass the
        HTTP status (or any non-status for network errors) with ``ok=False`` when it failed."""
        op = self._ops(operation)
        self.slice_writes.labels(op).inc()
        if not ok or error is not None:
            self.slice_errors.labels(op, error_class(error)).inc()

    def api_request(self, verb: str, resource: str) -> None:
        """One request to the API server (driver/plumbing/kube.py tells of each)."""
        self.api_requests.labels(self._verbs(verb), self._resources(resource)).inc()

    def discovery(
        self, seconds: float, inventory: Inventory | None = None, failed: bool = False
    ) -> None:
        """One discovery run; with the inventory, its per-probe states and warnings."""
        self.discovery_duration.observe(max(0.0, seconds))
        if failed or inventory is None:
            self.discovery_errors.inc()
            return
        self.last_discovery.set(time.time())
        for probe in inventory.probes:
            name = self._probes(probe.name)
            self.probe_up.labels(name).set(1 if probe.state == "ok" else 0)
            if probe.state == "error":
                self.probe_errors.labels(name).inc()
        self.inventory_warnings.set(len(inventory.warnings))

    # ---- state (the exporter sets these) -------------------------------------------------

    def set_topology(
        self,
        inventory: Inventory,
        devices: list[DeviceInfo],
        findings: Mapping[tuple[str, str], int] | None = None,
        foreign: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        """Precompute the per-snapshot series: device info, PCIe links, NVLinks, and the
        cross-driver report counts (``(driver, check) -> n``, ``(driver, matched) -> n``)."""
        families: list[Metric] = []
        info = InfoMetricFamily(
            f"{NAMESPACE}_device",
            "One series per DRA identity of a device vertex (join key: bus_id or device)",
            labels=[
                "kind",
                "vendor",
                "model",
                "bus_id",
                "pcie_root",
                "numa_node",
                "driver",
                "pool",
                "device",
            ],
        )
        for d in devices:
            info.add_metric(
                [
                    d.kind,
                    d.vendor,
                    d.model,
                    d.bus_id,
                    d.pcie_root,
                    d.numa_node,
                    d.driver,
                    d.pool,
                    d.device,
                ],
                {},
            )
        families.append(info)
        links = pcie_links(inventory)
        specs: list[tuple[str, str, Callable[[Any], float | None]]] = [
            ("pcie_link_speed_gts", "Current PCIe link speed (GT/s)", lambda s: s.speed_gts),
            (
                "pcie_link_max_speed_gts",
                "Maximum PCIe link speed (GT/s)",
                lambda s: s.max_speed_gts,
            ),
            ("pcie_link_width_lanes", "Current PCIe link width (lanes)", lambda s: s.width),
            ("pcie_link_max_width_lanes", "Maximum PCIe link width (lanes)", lambda s: s.max_width),
            (
                "pcie_link_degraded",
                "1 when the link trained below its capability (GPUs: width only)",
                lambda s: 1.0 if s.degraded else 0.0,
            ),
        ]
        for name, doc, get in specs:
            fam = GaugeMetricFamily(f"{NAMESPACE}_{name}", doc, labels=["bus_id", "kind"])
            for s in links:
                value = get(s)
                if value is not None:
                    fam.add_metric([s.bus_id, s.kind], float(value))
            families.append(fam)
        nvl = GaugeMetricFamily(
            f"{NAMESPACE}_nvlink_links_up", "Active NVLinks of a GPU", labels=["bus_id"]
        )
        for gpu in inventory.gpus:
            if gpu.vendor == "nvidia" or gpu.nvlinks:
                nvl.add_metric([gpu.bus_id], float(len(gpu.nvlinks)))
        families.append(nvl)
        families.append(
            _counts(
                "normalization_findings",
                "Cross-driver findings on this node's ResourceSlices, by driver and check",
                ["driver", "check"],
                findings or {},
            )
        )
        families.append(
            _counts(
                "foreign_devices",
                "Devices other drivers publish on this node, by driver and whether they matched",
                ["driver", "matched"],
                foreign or {},
            )
        )
        static = CollectorRegistry()
        static.register(_Collect(lambda: families))
        self._topology = _Topology(
            families=families, devices=list(devices), text=generate_latest(static)
        )

    def add_live(self, source: Callable[[], Iterable[Metric]]) -> None:
        """A callable yielding metric families at scrape time (health, readiness, HTTP)."""
        self._live.append(source)

    def _collect_live(self) -> Iterable[Metric]:
        for source in list(self._live):
            yield from source()

    def _collect_all(self) -> Iterable[Metric]:
        yield from self._events.collect()
        yield from self._topology.families

    def exposition(self) -> bytes:
        """The Prometheus text format of every series (what ``/metrics`` serves)."""
        return generate_latest(self._events) + self._topology.text

    @property
    def devices(self) -> list[DeviceInfo]:
        return self._topology.devices


class _Collect(Collector):
    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self._fn = fn

    def collect(self) -> Iterable[Metric]:
        return self._fn()

    def describe(self) -> Iterable[Metric]:
        # Describing would run collect() at registration; the names are ours alone.
        return []
