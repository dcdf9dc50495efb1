"""Publish the node's pool as resource.k8s.io/v1 ResourceSlices, writing only what changed.

One pool named after the node; every slice owned by the Node (so slices go with it) and
named ``<index hex>-<driver>-<node>-<random>`` as the 1.36+ Go slice controller does. What
the server holds of the slices on this node comes from a watch (driver/plumbing/server_view.py: one
LIST with a field selector on the node, every driver's, so the neighbours are known
without a request of their own (driver/publisher/neighbours.py), then a WATCH
resumed from its resourceVersion, relisting only on ``410 Gone``), never from a LIST per
resync. A reconcile diffs that view against the desired pool and writes the difference:

- nothing differs: no request at all (steady state, restarts with unchanged hardware);
- slices of another pool, with an unparsable name, a duplicate or surplus index, or an
  older generation: deleted (UID + resourceVersion preconditions), never another driver's;
- content changed in exactly one slice of a multi-slice pool: that slice is updated in
  place at the same generation (the Go controller's rule: one write, pool never
  incomplete); any other content change bumps the generation and rewrites every slice
  (a one-slice pool therefore gets generation+1 in one write);
- missing slices (first start, kubelet wiped them, someone deleted one): created.

A watch event on our slices (a deletion or edit behind the driver's back) reconciles at
once; the periodic resync (``resync_seconds``) only compares again, locally. Conflicts
(409) wait briefly for the watch to show the newer version, then retry; 429, 5xx and no
answer back off exponentially with jitter (honouring ``Retry-After``), capped, logged,
forever: an API outage is waited out, not fatal. While the watch is broken the publisher
says it is not synced.

Taints are compared without ``timeAdded`` (the server re-renders timestamps) and an
existing taint keeps its ``timeAdded``.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from driver.plumbing.kube import ApiFailure, collection_lister, failure, request_json, server_url
from driver.plumbing.server_view import ServerView
from driver.publisher.resync_loop import Restart, ResyncLoop, WriteError
from normalize.options import MAX_DEVICES_PER_SLICE
from normalize.slices import API_VERSION, KIND, slice_name_prefix, split_devices

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

Device = dict[str, Any]
Taint = dict[str, str]

log = logging.getLogger("toposlice.publisher")

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class PublishError(WriteError):
    """An API call of the publisher failed."""


@dataclass(frozen=True)
class ReconcileResult:
    writes: int
    generation: int
    slices: int


def _taint_key(t: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))


def _comparable(device: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(device)
    taints = out.pop("taints", None)
    if taints:
        out["taints"] = sorted(_taint_key(t) for t in taints)
    return out


def _frozen(devices: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps([_comparable(d) for d in devices], sort_keys=True)


#: Device fields a server drops when their feature gate is off (resource-api.md §1).
_GATES = {
    "taints": "DRADeviceTaints",
    "consumesCounters": "DRAPartitionableDevices",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "allowMultipleAllocations": "DRAConsumableCapacity",
}


def _keep_time_added(desired: Device, existing: Mapping[str, Any] | None) -> Device:
    """The desired device with each taint's ``timeAdded`` taken from the published one."""
    taints = desired.get("taints")
    if not taints:
        return desired
    old = {_taint_key(t): t.get("timeAdded") for t in (existing or {}).get("taints") or []}
    new = []
    for t in taints:
        t = dict(t)
        if old.get(_taint_key(t)):
            t["timeAdded"] = old[_taint_key(t)]
        new.append(t)
    return {**desired, "taints": new}


class SlicePublisher(ResyncLoop):
    """Keeps the node's pool in the API server equal to the desired devices."""

    error_type = PublishError

    def __init__(
        self,
        client: ApiClient,
        driver: str,
        node_name: str,
        *,
        max_devices_per_slice: int = MAX_DEVICES_PER_SLICE,
        resync_seconds: float = 10.0,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        rng: random.Random | None = None,
        on_change: Callable[[], None] | None = None,
        node_uid: str | None = None,
        watch_timeout_s: float = 300.0,
        sync_timeout_s: float = 10.0,
        conflict_wait_s: float = 1.0,
    ) -> None:
        """``node_uid``: the Node's UID when the caller has read it already (the daemon
        has, at start), saving a GET. ``sync_timeout_s``: how long a reconcile waits for
        the first LIST; ``conflict_wait_s``: for the watch to show the version a 409 says
        exists."""
        super().__init__(
            client,
            node_name,
            thread_name="slice-publisher",
            resync_seconds=resync_seconds,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            rng=rng,
        )
        self.driver = driver
        self.max_devices_per_slice = max_devices_per_slice
        self.on_change = on_change
        self._name_re = re.compile(
            rf"^([0-9a-f]{{5,}})-{re.escape(driver)}-{re.escape(node_name)}-[a-z0-9]{{5}}$"
        )
        self._devices: list[Device] | None = None
        self._taints: dict[str, list[Taint]] = {}
        self._dropped: dict[Any, tuple[str, str]] = {}
        """Slice name -> (devices sent, devices the server kept) when those differed."""
        self.writes: Counter[str] = Counter()
        """Write requests sent, by verb (create/update/delete), including failed ones."""
        self.on_write: Callable[[str, int | str | None, bool], None] | None = None
        """Told of every write: (verb, HTTP status or "network" when it failed, ok)."""
        self.generation = 0
        self._node_uid = node_uid
        self.sync_timeout_s = sync_timeout_s
        self.conflict_wait_s = conflict_wait_s
        self.view = ServerView(
            "resourceslices",
            collection_lister(client, SLICES),
            selectors={"field_selector": f"spec.nodeName={node_name}"},
            on_change=self._wake,
            watch_timeout_s=watch_timeout_s,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            rng=self.rng,
            server=server_url(client),
        )

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        self.view.stop()

    def other_slices(self) -> list[dict[str, Any]]:
        """The other drivers' slices of this node, from the watch (no request); raises
        RuntimeError while the watch has not synced (nothing is known of them yet)."""
        if not self.view.start().informer.synced.is_set():
            raise RuntimeError(self.view.last_error or "the slice watch has not synced yet")
        return [
            s for s in self.view.objects() if (s.get("spec") or {}).get("driver") != self.driver
        ]

    # -- desired state -------------------------------------------------------------------

    def set_devices(
        self,
        devices: Sequence[Device],
        taints: Mapping[str, Sequence[Taint]] | None = None,
    ) -> bool:
        """Set the pool's devices (API JSON form) and their taints; True if that changed
        anything, in which case the publishing loop reconciles at once."""
        new_devices = [dict(d) for d in devices]
        new_taints = {k: [dict(t) for t in v] for k, v in (taints or {}).items() if v}
        with self._cond:
            if new_devices == self._devices and new_taints == self._taints:
                return False
            self._devices, self._taints = new_devices, new_taints
            self._changed()
        return True

    def set_taints(self, taints: Mapping[str, Sequence[Taint]]) -> bool:
        with self._cond:
            devices = list(self._devices or [])
        return self.set_devices(devices, taints)

    def desired_chunks(self) -> list[list[Device]] | None:
        with self._cond:
            if self._devices is None:
                return None
            devices = []
            for dev in self._devices:
                taints = self._taints.get(dev["name"])
                devices.append({**dev, "taints": taints} if taints else dev)
        return split_devices(devices, self.max_devices_per_slice)

    # -- one reconcile -------------------------------------------------------------------

    def reconcile(self) -> ReconcileResult:
        """Diff the watched slices against the desired pool, write; retries conflicts.
        Raises :class:`PublishError` otherwise (also while the watch is broken)."""
        chunks = self.desired_chunks()
        if chunks is None:
            raise RuntimeError("reconcile before set_devices")
        self._wait_view()
        result = self._retry_conflicts(lambda: self._reconcile(chunks), "reconcile")
        self.generation = result.generation
        return result

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
    ) -> Any:
        write = {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method)
        if write is not None:
            self.writes[write] += 1
        try:
            result = request_json(self.client, method, path, body, query)
        except Exception as exc:
            f = failure(exc)
            if write is not None and self.on_write is not None:
                self.on_write(write, f.status if f.status is not None else "network", False)
            if f.conflict:
                log.info("%s: conflict, re-reading", what)
                raise Restart() from exc
            raise PublishError(what, f) from exc
        if write is not None and self.on_write is not None:
            self.on_write(write, None, True)
        return result

    def _wait_view(self) -> None:
        """Start the watch if need be, and wait (bounded) for its first LIST."""
        view = self.view.start()
        deadline = time.monotonic() + self.sync_timeout_s
        while not view.wait_synced(0.05):
            # A failed LIST says why at once (the informer retries it with its backoff).
            if view.last_error or time.monotonic() > deadline or self._stop.is_set():
                why = view.last_error or "no answer yet"
                raise PublishError("list slices", ApiFailure(None, None, why))
        if not view.healthy:
            why = view.last_error or "reconnecting"
            raise PublishError("watch slices", ApiFailure(None, None, why))

    def _index(self, obj: Mapping[str, Any]) -> int | None:
        m = self._name_re.match(str((obj.get("metadata") or {}).get("name", "")))
        return int(m.group(1), 16) if m else None

    def _reconcile(self, chunks: list[list[Device]]) -> ReconcileResult:
        items = [
            s
            for s in self.view.objects()
            if (s.get("spec") or {}).get("driver") == self.driver
            and (s.get("spec") or {}).get("nodeName") == self.node_name
        ]
        count = len(chunks)
        owner = self._owner(refresh=False)

        ours = [
            s for s in items if (s.get("spec") or {}).get("pool", {}).get("name") == self.node_name
        ]
        obsolete = [s for s in items if s not in ours]
        generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in ours), default=0)
        by_index: dict[int, dict[str, Any]] = {}
        for s in sorted(ours, key=lambda s: s["metadata"]["name"]):
            idx = self._index(s)
            if (
                idx is None
                or idx >= count
                or idx in by_index
                or int(s["spec"]["pool"].get("generation", 0)) < generation
            ):
                obsolete.append(s)
            else:
                by_index[idx] = s

        writes = 0
        for s in obsolete:
            self._delete(s)
            writes += 1

        changed = [i for i, s in by_index.items() if not self._same(s, chunks[i], count, owner)]
        missing = [i for i in range(count) if i not in by_index]
        if not changed and not missing:
            return ReconcileResult(writes, generation, count)
        if missing:
            owner = self._owner(refresh=True)  # the Node may have been re-created
        in_place = count > 1 and len(changed) == 1 and not missing and generation > 0
        new_gen = generation if in_place else generation + 1
        for i in sorted(by_index) if not in_place else changed:
            self._update(by_index[i], i, count, chunks[i], new_gen, owner)
            writes += 1
        for i in missing:
            self._create(i, count, chunks[i], new_gen, owner)
            writes += 1
        if self.on_change is not None:
            self.on_change()
        return ReconcileResult(writes, new_gen, count)

    def _same(
        self,
        existing: Mapping[str, Any],
        devices: list[Device],
        count: int,
        owner: Mapping[str, Any],
    ) -> bool:
        spec = existing.get("spec") or {}
        pool = spec.get("pool") or {}
        if pool.get("resourceSliceCount") != count or spec.get("nodeName") != self.node_name:
            return False
        if any(k in spec for k in ("nodeSelector", "allNodes", "perDeviceNodeSelection")):
            return False
        refs = (existing.get("metadata") or {}).get("ownerReferences") or []
        if not any(r.get("uid") == owner["uid"] and r.get("kind") == "Node" for r in refs):
            return False
        published = spec.get("devices") or []
        if len(published) == len(devices) and all(
            _comparable(a) == _comparable(b) for a, b in zip(published, devices, strict=True)
        ):
            return True
        # What the server made of our last write of this slice, when it dropped fields.
        name = (existing.get("metadata") or {}).get("name")
        return self._dropped.get(name) == (_frozen(devices), _frozen(published))

    def _check_echo(self, sent: list[Device], stored: Any) -> None:
        """Compare what the server stored with what was sent, as the Go publisher does: a
        field the server dropped (its feature gate is off) is reported once, and that
        slice is not rewritten on every resync for it."""
        if not isinstance(stored, dict):
            return
        name = (stored.get("metadata") or {}).get("name")
        got = (stored.get("spec") or {}).get("devices") or []
        if _frozen(got) == _frozen(sent):
            self._dropped.pop(name, None)
            return
        self._dropped[name] = (_frozen(sent), _frozen(got))
        lost = sorted(
            {k for a, b in zip(sent, got, strict=False) for k in a if k not in b}
            | ({"devices"} if len(got) != len(sent) else set())
        )
        gates = sorted({_GATES.get(k, "?") for k in lost})
        log.error(
            "API server dropped %s from slice %s (feature gates %s disabled?); "
            "not rewriting it for that",
            ", ".join(lost) or "fields",
            name,
            ", ".join(gates),
        )

    def _spec(self, devices: list[Device], count: int, generation: int) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "pool": {"name": self.node_name, "generation": generation, "resourceSliceCount": count},
            "nodeName": self.node_name,
            "devices": devices,
        }

    def _create(
        self, index: int, count: int, devices: list[Device], generation: int, owner: dict[str, Any]
    ) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "generateName": slice_name_prefix(index, count, self.driver, self.node_name),
                "ownerReferences": [owner],
            },
            "spec": self._spec(devices, count, generation),
        }
        stored = self._call("create slice", "POST", SLICES, body)
        self.view.wrote(stored)
        self._check_echo(devices, stored)

    def _update(
        self,
        existing: dict[str, Any],
        index: int,
        count: int,
        devices: list[Device],
        generation: int,
        owner: dict[str, Any],
    ) -> None:
        meta = existing["metadata"]
        old_devices = {d.get("name"): d for d in (existing.get("spec") or {}).get("devices") or []}
        devices = [_keep_time_added(d, old_devices.get(d["name"])) for d in devices]
        refs = [
            r
            for r in meta.get("ownerReferences") or []
            if not (r.get("kind") == "Node" and r.get("apiVersion") == "v1")
        ]
        new_meta = {k: v for k, v in meta.items() if k not in ("managedFields",)}
        new_meta["ownerReferences"] = [owner, *refs]
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": new_meta,
            "spec": self._spec(devices, count, generation),
        }
        try:
            stored = self._call("update slice", "PUT", f"{SLICES}/{quote(meta['name'])}", body)
        except Restart:
            self.view.wait_newer(existing, self.conflict_wait_s)
            raise
        self.view.wrote(stored)
        self._check_echo(devices, stored)

    def _delete(self, existing: Mapping[str, Any]) -> None:
        meta = existing["metadata"]
        pre = {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": pre}
        try:
            self._call("delete slice", "DELETE", f"{SLICES}/{quote(meta['name'])}", body)
        except Restart:
            self.view.wait_newer(dict(existing), self.conflict_wait_s)
            raise
        except PublishError as exc:
            if not exc.failure.not_found:
                raise
        self.view.deleted(dict(existing))

    # -- the loop (driver/publisher/resync_loop.py) -----------------------------------------------

    def _has_desired(self) -> bool:
        return self.desired_chunks() is not None

    def _sync_once(self) -> None:
        result = self.reconcile()
        if result.writes:
            log.info(
                "published pool %s generation %d: %d slice(s), %d write(s)",
                self.node_name,
                result.generation,
                result.slices,
                result.writes,
            )

    def _log_recovered(self, failures: int) -> None:
        log.info("API server answers again after %d failed attempt(s)", failures)

    def _log_failed(self, exc: WriteError, delay: float) -> None:
        level = logging.WARNING if exc.failure.transient else logging.ERROR
        log.log(level, "publishing failed (%s); retrying in %.1f s", exc, delay)

    def _log_unexpected(self, delay: float) -> None:
        log.exception("publishing failed unexpectedly; retrying in %.1f s", delay)
