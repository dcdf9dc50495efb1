"""Device health: conditions reported against graph vertices, spread to the devices they hit.

Sources report :class:`HealthEvent` s about a vertex of the topology graph (``gpu:<bdf>``,
``nic:<bdf>``, ``bridge:<bdf>``, ``nvswitch:<bdf>``): NVML XID events (an injected
:class:`EventSource`; the daemon never talks to NVML or a probe itself), NIC carrier /
operstate (from each snapshot's inventory, and between snapshots from sysfs under the
root through an injected reader), and devices that disappeared between two snapshots.

The blast radius comes from the graph: a condition on a bridge (a PCIe switch port) makes
every device behind it, through ``pcie`` edges, unhealthy; one on an NVSwitch, every GPU
with an NVLink to it. The monitor is the node service's :class:`~driver.interfaces.HealthFeed`
and gives the publisher one taint list per device (``NoExecute`` for fatal conditions,
``NoSchedule`` otherwise): one change of health is one change of desired slices, so one
write.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from driver.interfaces import DeviceHealth
from normalize.snapshot import Snapshot

Taint = dict[str, str]

#: XIDs that report an application's own fault (bad address, illegal instruction, ...):
#: the GPU is fine. The NVIDIA device plugin skips the same set by default.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: XIDs after which the GPU needs a reset or is gone: running pods are evicted.
FATAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_DOWN_STATES = frozenset({"down", "lowerlayerdown", "notpresent"})


@dataclass(frozen=True)
class HealthEvent:
    """One report about one graph vertex, from one source."""

    vertex: str
    healthy: bool
    cause: str
    """Short machine word, also the taint key's name: ``xid``, ``link-down``, ``gone``."""
    value: str = ""
    """Taint value (a label value): the XID number, the interface name, ..."""
    reason: str = ""
    """For people: ``XID 79``, ``carrier down on ens1f0``."""
    fatal: bool = False


class EventSource(Protocol):
    def poll(self, timeout: float) -> list[HealthEvent]:
        """Events that arrived, waiting up to ``timeout`` seconds for the first."""
        ...

    def close(self) -> None: ...


def xid_event(vertex: str, xid: int) -> HealthEvent | None:
    """The condition an NVML XID event means, or None for an application XID."""
    if xid in APPLICATION_XIDS:
        return None
    return HealthEvent(vertex, False, "xid", str(xid), f"XID {xid}", fatal=xid in FATAL_XIDS)


@dataclass(frozen=True)
class LinkState:
    operstate: str | None
    carrier: bool | None


def sysfs_link_reader(root: str) -> Callable[[str], LinkState | None]:
    """Reads ``<root>/sys/class/net/<name>/{operstate,carrier}``; None if it is gone."""

    def read(name: str) -> LinkState | None:
        base = os.path.join(root, "sys", "class", "net", name)

        def text(leaf: str) -> str | None:
            try:
                with open(os.path.join(base, leaf), encoding="ascii") as fh:
                    return fh.read().strip()
            except (OSError, ValueError):
                return None

        oper = text("operstate")
        if oper is None and not os.path.exists(base):
            return None
        carrier = text("carrier")
        return LinkState(oper, None if carrier not in ("0", "1") else carrier == "1")

    return read


def link_down(state: LinkState | None) -> bool:
    if state is None:
        return False
    if state.carrier is False:
        return True
    return state.operstate is not None and state.operstate in _DOWN_STATES


def _label_value(text: str) -> str:
    value = _LABEL_VALUE_BAD.sub("-", text).strip("-._")[:63].strip("-._")
    return value


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(int(ts), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _Condition:
    cause: str
    value: str
    reason: str
    fatal: bool
    since: float


@dataclass(frozen=True)
class _Hit:
    """A condition as it lands on one device (directly or through the blast radius)."""

    cause: str
    value: str
    reason: str
    fatal: bool
    since: float


class HealthMonitor:
    """Health of the pool's devices; thread-safe. Implements ``HealthFeed``."""

    def __init__(
        self,
        driver: str,
        *,
        link_reader: Callable[[str], LinkState | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.driver = driver
        self.link_reader = link_reader
        self.clock = clock
        self._cond = threading.Condition()
        self._version = 0
        self._snap: Snapshot | None = None
        self._conditions: dict[tuple[str, str], _Condition] = {}
        """(vertex, cause) -> condition."""
        self._lost: dict[str, dict[str, Any]] = {}
        """DRA device name -> its last published form, for devices that disappeared."""
        self._lost_vertex: dict[str, str] = {}
        self._graph: _Graph | None = None
        self._health: dict[str, list[_Hit]] = {}

    # -- inputs --------------------------------------------------------------------------

    def update_snapshot(self, snap: Snapshot) -> bool:
        """A new discovery: note devices that disappeared or came back, and NIC links as
        the inventory saw them. True when device health changed."""
        with self._cond:
            old = self._snap
            self._snap = snap
            self._graph = _Graph(snap)
            names = {d["name"] for d in snap.devices}
            if old is not None:
                old_vertex = {v: k for k, v in old.vertex_devices.items() if v}
                for dev in old.devices:
                    if dev["name"] not in names:
                        self._lost[dev["name"]] = dev
                        self._lost_vertex[dev["name"]] = old_vertex.get(dev["name"]) or dev["name"]
            for name in [n for n in self._lost if n in names]:
                del self._lost[name]
                self._lost_vertex.pop(name, None)
            for vertex, cond in list(self._conditions):
                if cond == "gone":
                    del self._conditions[(vertex, cond)]
            now = self.clock()
            for name, vertex in self._lost_vertex.items():
                self._conditions[(vertex, "gone")] = _Condition(
                    "gone", "", f"{name} disappeared from the node", True, now
                )
            self._apply_links(self._inventory_links(snap))
            return self._recompute()

    def report(self, event: HealthEvent) -> bool:
        """One event from a source; True when device health changed."""
        with self._cond:
            self._set(event)
            return self._recompute()

    def report_many(self, events: Iterable[HealthEvent]) -> bool:
        with self._cond:
            for ev in events:
                self._set(ev)
            return self._recompute()

    def poll_links(self) -> bool:
        """Re-read every NIC's interfaces through the link reader (live hosts)."""
        if self.link_reader is None:
            return False
        with self._cond:
            snap = self._snap
        if snap is None:
            return False
        states: dict[str, dict[str, LinkState | None]] = {}
        for vertex, netdevs in _nic_netdevs(snap).items():
            states[vertex] = {n: self.link_reader(n) for n in netdevs}
        with self._cond:
            self._apply_links(states)
            return self._recompute()

    def _set(self, ev: HealthEvent) -> None:
        key = (ev.vertex, ev.cause)
        if ev.healthy:
            self._conditions.pop(key, None)
            return
        old = self._conditions.get(key)
        since = old.since if old is not None and old.value == ev.value else self.clock()
        self._conditions[key] = _Condition(ev.cause, ev.value, ev.reason, ev.fatal, since)

    def _inventory_links(self, snap: Snapshot) -> dict[str, dict[str, LinkState | None]]:
        by_name = {n.name: n for n in snap.inventory.net_interfaces}
        out: dict[str, dict[str, LinkState | None]] = {}
        for vertex, netdevs in _nic_netdevs(snap).items():
            out[vertex] = {}
            for name in netdevs:
                iface = by_name.get(name)
                out[vertex][name] = LinkState(iface.operstate, None) if iface else None
        return out

    def _apply_links(self, states: Mapping[str, Mapping[str, LinkState | None]]) -> None:
        for vertex, per_if in states.items():
            down = sorted(n for n, st in per_if.items() if link_down(st))
            if down:
                self._set(
                    HealthEvent(
                        vertex,
                        False,
                        "link-down",
                        _label_value(down[0]),
                        f"link down on {', '.join(down)}",
                    )
                )
            else:
                self._conditions.pop((vertex, "link-down"), None)

    # -- derived state -------------------------------------------------------------------

    def _recompute(self) -> bool:
        snap, graph = self._snap, self._graph
        health: dict[str, list[_Hit]] = {}
        if snap is not None and graph is not None:
            for (vertex, _cause), cond in sorted(self._conditions.items()):
                direct = graph.device_of(vertex) or self._lost_name(vertex)
                if direct is not None:
                    health.setdefault(direct, []).append(
                        _Hit(cond.cause, cond.value, cond.reason, cond.fatal, cond.since)
                    )
                for dev, why in graph.behind(vertex):
                    if dev == direct:
                        continue
                    health.setdefault(dev, []).append(
                        _Hit(
                            "upstream-failed",
                            _label_value(vertex.split(":", 1)[-1]),
                            f"{why}: {cond.reason}",
                            cond.fatal,
                            cond.since,
                        )
                    )
        if health == self._health:
            return False
        self._health = health
        self._version += 1
        self._cond.notify_all()
        return True

    def _lost_name(self, vertex: str) -> str | None:
        for name, v in self._lost_vertex.items():
            if v == vertex:
                return name
        return None

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def current(self) -> list[DeviceHealth]:
        with self._cond:
            snap = self._snap
            if snap is None:
                return []
            out = []
            names = [d["name"] for d in snap.devices] + sorted(self._lost)
            for name in names:
                hits = self._health.get(name)
                if not hits:
                    out.append(DeviceHealth(snap.pool, name, "Healthy"))
                    continue
                out.append(
                    DeviceHealth(
                        snap.pool,
                        name,
                        "Unhealthy",
                        "; ".join(h.reason for h in hits)[:1000],
                        any(h.fatal for h in hits),
                    )
                )
            return out

    def wait_change(self, version: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout)
            return self._version

    def taints(self) -> dict[str, list[Taint]]:
        """DRA device name -> its taints (at most 16, fatal first)."""
        with self._cond:
            out: dict[str, list[Taint]] = {}
            for name, hits in self._health.items():
                seen: dict[tuple[str, str], Taint] = {}
                for h in sorted(hits, key=lambda h: (not h.fatal, h.cause, h.value)):
                    taint: Taint = {
                        "key": f"{self.driver}/{h.cause}",
                        "effect": "NoExecute" if h.fatal else "NoSchedule",
                        "timeAdded": _rfc3339(h.since),
                    }
                    if h.value:
                        taint["value"] = h.value
                    seen.setdefault((taint["key"], h.value), taint)
                out[name] = list(seen.values())[:16]
            return out

    def lost_devices(self) -> list[dict[str, Any]]:
        """Devices that disappeared since the driver started, in their last known form:
        kept in the pool (tainted NoExecute) so pods using them are evicted."""
        with self._cond:
            return [dict(self._lost[n]) for n in sorted(self._lost)]


def _nic_netdevs(snap: Snapshot) -> dict[str, list[str]]:
    out = {}
    for v in snap.graph.get("vertices", []):
        if v.get("kind") == "nic" and v["id"] in snap.vertex_devices:
            out[v["id"]] = list((v.get("attrs") or {}).get("netdevs") or [])
    return out


class _Graph:
    """The parts of the topology graph the blast radius needs."""

    def __init__(self, snap: Snapshot) -> None:
        self.devices = dict(snap.vertex_devices)
        self.kind = {v["id"]: v.get("kind", "") for v in snap.graph.get("vertices", [])}
        self.children: dict[str, list[str]] = {}
        self.nvlink: dict[str, set[str]] = {}
        for e in snap.graph.get("edges", []):
            if e.get("kind") == "pcie":
                self.children.setdefault(e["source"], []).append(e["target"])
            elif e.get("kind") == "nvlink":
                self.nvlink.setdefault(e["source"], set()).add(e["target"])
                self.nvlink.setdefault(e["target"], set()).add(e["source"])

    def device_of(self, vertex: str) -> str | None:
        return self.devices.get(vertex)

    def behind(self, vertex: str) -> list[tuple[str, str]]:
        """(device, why) for every device a failure of ``vertex`` takes down with it."""
        out: list[tuple[str, str]] = []
        kind = self.kind.get(vertex, vertex.split(":", 1)[0])
        label = f"behind failed {'PCIe switch' if kind == 'bridge' else kind} "
        label += vertex.split(":", 1)[-1]
        stack, seen = list(self.children.get(vertex, [])), {vertex}
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.devices:
                out.append((self.devices[v], label))
            stack.extend(self.children.get(v, []))
        if kind == "nvswitch":
            for peer in sorted(self.nvlink.get(vertex, ())):
                if peer in self.devices and self.kind.get(peer) == "gpu":
                    out.append((self.devices[peer], f"NVLink to failed NVSwitch {vertex[9:]}"))
        return sorted(set(out))
