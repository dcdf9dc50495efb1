"""Prepare and unprepare claims: the state behind the kubelet's NodePrepareResources calls.

For each claim: read the ResourceClaim (its UID must be the one the kubelet sent), take
the allocation results of this driver in this node's pool, look the devices up in the
current :class:`~normalize.snapshot.Snapshot`, write the claim's NCCL topology file and
its CDI spec, and record it in the checkpoint.

Crash safety comes from the order of writes, with one checkpoint write per prepare: the
claim is reserved in memory (``PrepareStarted``, with every file it will own: two claims
racing for one device cannot both win), its files are written under names that carry
the claim UID, and only then is the checkpoint written, recording it
``PrepareCompleted``. Unprepare removes the files before the record. Whatever a kill -9
interrupts, the files of a claim with no completed record are orphans: a restart
removes every spec and topology file no record owns, and the kubelet's retry prepares
the claim again (same file names, same CDI ids). A ``PrepareStarted`` record reaches the
disk only when another claim's commit writes the checkpoint meanwhile; the next call for
it redoes or undoes it.

Every problem with one claim is that claim's error string; nothing here raises to the
gRPC layer. Calls for different claims run concurrently (one lock per claim); the
checkpoint file itself is updated under one short lock.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from discovery.model import Gpu, Inventory, Nic
from discovery.readers import normalize_bdf
from driver.interfaces import ClaimNotFound, ClaimReader
from driver.kubelet import cdi
from driver.kubelet.checkpoint import (
    ClaimRecord,
    LoadStatus,
    PreparedDevice,
    load_checkpoint,
    read_boot_id,
    save_checkpoint,
)
from driver.kubelet.container_edits import (
    OMITTED_NODES_ANNOTATION,
    ClaimDevices,
    claim_edits,
    cpu_edits,
    drop_missing_nodes,
    gpu_edits,
    nic_edits,
)
from driver.kubelet.device_metadata import MetadataWriter, group_requests
from driver.kubelet.vendor_cdi import VendorCdi
from driver.plumbing.atomic import TEMP_SUFFIX, remove_quiet, write_atomic
from normalize.attribute_names import PCI_BUS_ID
from normalize.nccl_topo import build_topology
from normalize.snapshot import Snapshot

log = logging.getLogger("driver.state")

CHECKPOINT_FILE = "checkpoint.json"
TOPO_DIR = "nccl"
_LOCK_STRIPES = 64
#: Seconds a prepare waits for another claim's stripe to release that claim's stale record.
STALE_LOCK_S = 5.0
_TOPO_NAME_SLOT = "toposlice-claim-name"
_TOPO_CACHE_MAX = 256
_UID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet sends per claim."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimError(Exception):
    """A problem with one claim; becomes that claim's error string."""


FailPoint = Callable[[str], None]


def _no_fail(step: str) -> None:
    return None


@dataclass(frozen=True)
class _Plan:
    devices: tuple[PreparedDevice, ...]
    spec: dict[str, Any] | None
    topo_xml: str | None
    metadata: tuple[dict[str, Any], ...] = ()
    """What each request's device metadata file says (checkpointed)."""
    metadata_files: tuple[tuple[Path, bytes], ...] = ()


class DriverState:
    """Owns ``<cdi_root>/k8s.<driver>-claim_<uid>.json``, ``<state_dir>/checkpoint.json``
    and ``<state_dir>/nccl/<uid>.xml``; nothing else on disk."""

    def __init__(
        self,
        driver_name: str,
        node_name: str,
        cdi_root: str | os.PathLike[str],
        state_dir: str | os.PathLike[str],
        root_path: str | os.PathLike[str],
        claim_reader: ClaimReader,
        snapshot_fn: Callable[[], Snapshot | None],
        *,
        fail_point: FailPoint = _no_fail,
        sync: bool | None = None,
        sync_checkpoint: bool = True,
        vendor_cdi: VendorCdi | None = None,
        metadata: MetadataWriter | None = None,
    ) -> None:
        self.driver = driver_name
        self.pool = node_name
        self.kind = cdi.kind_for(driver_name)
        cdi.check_kind(self.kind)
        self.cdi_root = Path(cdi_root)
        self.state_dir = Path(state_dir)
        self.topo_dir = self.state_dir / TOPO_DIR
        self.checkpoint_path = self.state_dir / CHECKPOINT_FILE
        self.reader = claim_reader
        self.snapshot_fn = snapshot_fn
        self._fail = fail_point
        for d in (self.cdi_root, self.state_dir, self.topo_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.boot_id = read_boot_id(Path(root_path))
        self.dev_root = Path(root_path)
        """Device nodes are looked up under here (``<root>/dev/...``): a CDI spec names only
        those that exist (the runtime refuses a container whose node is missing)."""
        self.sync = not self.boot_id if sync is None else sync
        """fsync every write? Not needed when the boot id is known: power loss means a
        reboot, a reboot discards the checkpoint and every file it owns, and against a
        killed process the atomic rename alone is enough. Without a boot id the state
        may outlive a reboot, so then every write is made durable."""
        self.sync_checkpoint = sync_checkpoint
        self.vendor_cdi = vendor_cdi
        """The GPU vendor's CDI devices put first in each GPU's ids
        (driver/kubelet/vendor_cdi.py)."""
        self.other_slices: Callable[[], Sequence[Mapping[str, Any]]] | None = None
        """The other drivers' slices of this node (the publisher's watch), to find the GPUs
        of another driver (NVIDIA's) in a claim toposlice prepares NICs of: the NCCL file
        names them too. None, or raising: the file holds toposlice's devices only."""
        self.metadata = metadata
        """KEP-5304 device metadata files (driver/kubelet/device_metadata.py); None: none."""
        if metadata is not None:
            metadata.sync = self.sync
        self._lock = threading.Lock()
        """Guards ``_claims`` and ``_version`` (held briefly, never across I/O)."""
        self._flush_lock = threading.Lock()
        self._version = 0
        self._durable = 0
        self._claim_locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        claims, status = load_checkpoint(self.checkpoint_path, self.boot_id)
        self.load_status: LoadStatus = status
        self._claims: dict[str, ClaimRecord] = claims
        self._lookup: tuple[Snapshot | None, dict[str, Any], dict[str, str]] = (None, {}, {})
        self._topo_texts: tuple[Snapshot | None, dict[tuple[tuple[str, ...], ...], str]] = (
            None,
            {},
        )
        self._reconcile()

    # -- public API -------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """One result per claim UID (a repeated UID gets one entry)."""
        out: dict[str, PrepareResult] = {}
        for ref in claims:
            try:
                devices = self._prepare_one(ref)
            except ClaimError as exc:
                out[ref.uid] = PrepareResult(error=f"{_label(ref)}: {exc}")
            except Exception as exc:  # a bug or an I/O error: still a per-claim answer
                log.exception("prepare %s failed", _label(ref))
                out[ref.uid] = PrepareResult(error=f"{_label(ref)}: internal error: {exc}")
            else:
                out[ref.uid] = PrepareResult(devices=devices)
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error ("" = done). Unknown claims succeed."""
        out: dict[str, str] = {}
        for ref in claims:
            try:
                self._unprepare_one(ref)
            except Exception as exc:
                log.exception("unprepare %s failed", _label(ref))
                out[ref.uid] = f"{_label(ref)}: {exc}"
            else:
                out[ref.uid] = ""
        return out

    def prepared_devices(self) -> dict[str, str]:
        """DRA device name -> UID of the (completed) claim it is prepared for."""
        claims = self._claims
        return {
            dev.device: rec.uid
            for rec in claims.values()
            if rec.state == "PrepareCompleted"
            for dev in rec.devices
        }

    def claims(self) -> dict[str, ClaimRecord]:
        """The checkpoint's records (a copy)."""
        return dict(self._claims)

    # -- paths ------------------------------------------------------------------------

    def spec_path(self, uid: str) -> Path:
        return self.cdi_root / cdi.spec_file_name(self.kind, uid)

    def topo_path(self, uid: str) -> Path:
        return self.topo_dir / f"{uid}.xml"

    def _owned_paths(self, uid: str) -> list[Path]:
        return [self.spec_path(uid), self.topo_path(uid)]

    # -- prepare ----------------------------------------------------------------------

    def _claim_lock(self, uid: str) -> threading.Lock:
        """Calls for one claim run one at a time; a fixed set of locks keeps memory flat
        however many claims come and go."""
        return self._claim_locks[hash(uid) % _LOCK_STRIPES]

    def _prepare_one(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        if not _UID.match(ref.uid):
            raise ClaimError(f"invalid claim UID {ref.uid!r}")
        with self._claim_lock(ref.uid):
            rec = self._claims.get(ref.uid)
            if rec is not None and rec.state == "PrepareCompleted":
                if all(Path(f).exists() for f in rec.files) and self._vendor_ids_resolve(rec):
                    return rec.devices
                log.warning("claim %s: files or vendor CDI ids gone, preparing again", _label(ref))
            try:
                plan = self._plan(ref)
                files = []
                if plan.topo_xml is not None:
                    files.append(str(self.topo_path(ref.uid)))
                if plan.spec is not None:
                    files.append(str(self.spec_path(ref.uid)))
                files += [str(p) for p, _ in plan.metadata_files]
                self._release_stale(ref.uid, plan.devices)
                intent = ClaimRecord(
                    uid=ref.uid,
                    namespace=ref.namespace,
                    name=ref.name,
                    state="PrepareStarted",
                    devices=plan.devices,
                    files=tuple(files),
                    metadata=plan.metadata,
                )
                self._reserve(intent)
            except ClaimError:
                if rec is not None:  # a crash left a half-prepared claim: leave nothing
                    self._undo(rec)
                raise
            stale = [p for p in (rec.files if rec else ()) if p not in intent.files]
            self._fail("intent")
            try:
                for p in stale:
                    remove_quiet(Path(p))
                if plan.topo_xml is not None:
                    topo = plan.topo_xml.encode()
                    write_atomic(self.topo_path(ref.uid), topo, mode=0o644, sync=self.sync)
                self._fail("topology")
                if plan.spec is not None:
                    cdi.write_spec(self.spec_path(ref.uid), plan.spec, sync=self.sync)
                self._fail("spec")
                if self.metadata is not None and plan.metadata_files:
                    self.metadata.write(plan.metadata_files)
                self._fail("metadata")
                self._put(replace(intent, state="PrepareCompleted"))
            except Exception:
                self._undo(intent)
                raise
            return plan.devices

    def _plan(self, ref: ClaimRef) -> _Plan:
        """Everything prepare will write, computed before anything is written."""
        try:
            claim = self.reader.get_claim(ref.namespace, ref.name)
        except ClaimNotFound as exc:
            raise ClaimError(f"ResourceClaim not found: {exc}") from None
        except Exception as exc:
            raise ClaimError(f"reading the ResourceClaim failed: {exc}") from None
        meta = claim.get("metadata") or {}
        if meta.get("uid") != ref.uid:
            raise ClaimError(
                f"claim got replaced: the API server has UID {meta.get('uid')!r}, "
                f"the kubelet asked for {ref.uid!r}"
            )
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimError("claim is not allocated")
        results = [
            r
            for r in ((allocation.get("devices") or {}).get("results") or [])
            if r.get("driver") == self.driver
        ]
        if not results:
            return _Plan(devices=(), spec=None, topo_xml=None)
        snap = self.snapshot_fn()
        if snap is None:
            raise ClaimError("no device inventory yet (discovery has not finished)")
        by_name, vertex_of = self._lookups(snap)
        claim_devices = ClaimDevices()
        seen: set[str] = set()
        prepared: list[PreparedDevice] = []
        edits: dict[str, cdi.ContainerEdits] = {}
        for r in results:
            pool, name = r.get("pool", ""), r.get("device", "")
            if pool != self.pool:
                raise ClaimError(f"device {pool}/{name} is not in this node's pool {self.pool!r}")
            if name not in by_name:
                raise ClaimError(f"device {name!r} is not in pool {self.pool!r}")
            cdi_name = f"{ref.uid}-{name}"
            if name not in seen:
                seen.add(name)
                edits[cdi_name] = self._device_edits(
                    snap.inventory, name, vertex_of.get(name, ""), by_name[name], claim_devices
                )
            share = r.get("shareID")
            prepared.append(
                PreparedDevice(
                    request_names=(str(r.get("request", "")).split("/")[0],),
                    pool=pool,
                    device=name,
                    cdi_ids=(cdi.qualified(self.kind, cdi_name),),
                    share_id=str(share) if share else None,
                    admin_access=bool(r.get("adminAccess")),
                )
            )
        topo_xml = None
        if claim_devices.gpus or claim_devices.nics:
            gpus = [g for _, g in claim_devices.gpus]
            gpus += self._foreign_gpus(snap, allocation, {g.bus_id for g in gpus})
            topo_xml = self._topology(snap, gpus, [n for _, n in claim_devices.nics], ref)
        topo_host = str(self.topo_path(ref.uid)) if topo_xml is not None else None
        common = claim_edits(ref.uid, claim_devices, topo_host)
        if self.vendor_cdi is not None and claim_devices.gpus:
            prepared = self.vendor_cdi.attach(
                snap.inventory, claim_devices.gpus, ref.uid, edits, common, prepared
            )
        omitted = drop_missing_nodes(edits, self._node_exists)
        notes = {OMITTED_NODES_ANNOTATION: ",".join(omitted)} if omitted else None
        try:
            spec = cdi.build_spec(self.kind, edits, common, notes)
        except ValueError as exc:
            raise ClaimError(str(exc)) from None
        devices = tuple(prepared)
        meta = self.metadata
        if meta is None or not meta.enabled:
            return _Plan(devices=devices, spec=spec, topo_xml=topo_xml)
        attributes = {n: by_name[n].get("attributes") or {} for n in seen}
        reqs = group_requests(claim, results, attributes)
        try:
            files = meta.render(ref.namespace, ref.name, ref.uid, reqs)
        except ValueError as exc:  # a name CDI refuses
            raise ClaimError(f"device metadata: {exc}") from None
        return _Plan(
            devices=meta.with_ids(ref.uid, reqs, devices),
            spec=spec,
            topo_xml=topo_xml,
            metadata=tuple(r.to_dict() for r in reqs),
            metadata_files=tuple(meta.writes(ref.uid, files)),
        )

    def _foreign_gpus(
        self, snap: Snapshot, allocation: Mapping[str, Any], have: set[str]
    ) -> list[Gpu]:
        """The claim's GPUs another driver on this node allocated (NVIDIA's ``gpu-3``), as
        this host's GPUs: matched by the standard ``pciBusID`` that driver publishes. A
        device not found in its slices, or a bus id this host has no GPU at, is left out
        (logged): the file then describes what toposlice can vouch for."""
        if self.other_slices is None:
            return []
        wanted = {
            (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
            for r in ((allocation.get("devices") or {}).get("results") or [])
            if r.get("driver") != self.driver
        }
        if not wanted:
            return []
        try:
            slices = list(self.other_slices())
        except Exception as exc:  # the watch not synced yet: no foreign GPUs in the file
            log.warning("NCCL topology without other drivers' GPUs: %s", exc)
            return []
        by_bus = {normalize_bdf(g.bus_id) or g.bus_id: g for g in snap.inventory.gpus}
        out: list[Gpu] = []
        found: set[tuple[str, str, str]] = set()
        for sl in slices:
            spec = sl.get("spec") or {}
            driver, pool = (
                str(spec.get("driver", "")),
                str((spec.get("pool") or {}).get("name", "")),
            )
            for d in spec.get("devices") or []:
                key = (driver, pool, str(d.get("name", "")))
                if key not in wanted or key in found:
                    continue
                found.add(key)
                bus = ((d.get("attributes") or {}).get(PCI_BUS_ID) or {}).get("string")
                gpu = by_bus.get(normalize_bdf(bus) or bus) if isinstance(bus, str) else None
                if gpu is not None and gpu.bus_id not in have:
                    have.add(gpu.bus_id)
                    out.append(gpu)
        missing = sorted(f"{d}/{n}" for d, _, n in wanted - found)
        if missing:
            log.info("NCCL topology: not in any slice of this node: %s", ", ".join(missing))
        return out

    def _topology(self, snap: Snapshot, gpus: list[Gpu], nics: list[Nic], ref: ClaimRef) -> str:
        """The claim's NCCL topology file: built once per snapshot and set of devices with a
        placeholder name, which each claim's name then replaces (the rest of the text
        depends only on the inventory and the devices)."""
        cached, texts = self._topo_texts
        if cached is not snap:
            texts = {}
            self._topo_texts = (snap, texts)
        key = (tuple(g.bus_id for g in gpus), tuple(n.bus_id for n in nics))
        text = texts.get(key)
        if text is None:
            text = build_topology(snap.inventory, gpus, nics, _TOPO_NAME_SLOT)
            if len(texts) < _TOPO_CACHE_MAX:
                texts[key] = text
        slot = f"name={quoteattr(_TOPO_NAME_SLOT)}"
        return text.replace(slot, f"name={quoteattr(f'claim-{ref.uid}')}", 1)

    def _vendor_ids_resolve(self, rec: ClaimRecord) -> bool:
        """A recorded vendor id the runtime can no longer resolve (its spec regenerated
        without it) would fail every container start: then the claim is prepared again."""
        ids = [i for d in rec.devices for i in d.vendor_cdi_ids]
        if not ids or self.vendor_cdi is None:
            return True
        return all(self.vendor_cdi.resolves(i) for i in ids)

    def _published_attributes(self, device: str) -> dict[str, Any] | None:
        """A device's attributes in the current snapshot (None: not published)."""
        snap = self.snapshot_fn()
        if snap is None:
            return None
        found = self._lookups(snap)[0].get(device)
        return None if found is None else found.get("attributes") or {}

    def _node_exists(self, path: str) -> bool:
        return os.path.exists(self.dev_root / path.lstrip("/"))

    def _lookups(self, snap: Snapshot) -> tuple[dict[str, Any], dict[str, str]]:
        """Device name -> device and -> vertex id, built once per snapshot."""
        cached, by_name, vertex_of = self._lookup
        if cached is not snap:
            by_name = {d["name"]: d for d in snap.devices}
            vertex_of = {name: vid for vid, name in snap.vertex_devices.items()}
            self._lookup = (snap, by_name, vertex_of)
        return by_name, vertex_of

    def _device_edits(
        self,
        inv: Inventory,
        name: str,
        vertex: str,
        device: dict[str, Any],
        out: ClaimDevices,
    ) -> cdi.ContainerEdits:
        kind, _, key = vertex.partition(":")
        if kind == "gpu":
            gpu = _find(inv.gpus, key)
            if gpu is not None:
                out.gpus.append((name, gpu))
                return gpu_edits(inv, name, gpu)
        elif kind == "nic":
            nic = _find(inv.nics, key)
            if nic is not None:
                out.nics.append((name, nic))
                return nic_edits(inv, name, nic)
        cpu_list = ((device.get("attributes") or {}).get("cpuList") or {}).get("string", "")
        out.cpus.append((name, cpu_list))
        return cpu_edits(name, cpu_list)

    def _release_stale(self, uid: str, devices: Iterable[PreparedDevice]) -> None:
        """Unprepare the records of claims that hold one of ``devices`` but that the API
        server no longer has (deleted, replaced, deallocated) while the kubelet has not
        unprepared them yet: a pod and its claim deleted together leave that window, and
        the scheduler may already have given the devices to this claim. Where the API
        cannot say, the record stays and :meth:`_check_overlap` refuses as before."""
        mine = {d.device for d in devices if not _shared(d)}
        for rec in list(self._claims.values()):
            held = {d.device for d in rec.devices if not _shared(d)}
            if rec.uid == uid or not mine & held or self._still_allocated(rec):
                continue
            log.warning(
                "claim %s/%s (%s) is gone from the API server but still prepared here; "
                "unpreparing it: its devices now belong to claim %s",
                rec.namespace,
                rec.name,
                rec.uid,
                uid,
            )
            # The caller holds ``uid``'s stripe. The stale claim may hash to the same one
            # (taking it again would wait for ever: the locks are not re-entrant), or to
            # one a concurrent prepare holds while it waits for ours: never wait unbounded.
            lock = self._claim_lock(rec.uid)
            if lock is self._claim_lock(uid):
                self._undo(rec)
            elif lock.acquire(timeout=STALE_LOCK_S):
                try:
                    if self._claims.get(rec.uid) is rec:
                        self._undo(rec)
                finally:
                    lock.release()
            else:
                log.warning(
                    "claim %s is busy; leaving its record (this prepare is refused and "
                    "retried by the kubelet)",
                    rec.uid,
                )

    def _still_allocated(self, rec: ClaimRecord) -> bool:
        try:
            claim = self.reader.get_claim(rec.namespace, rec.name)
        except ClaimNotFound:
            return False
        except Exception:
            return True  # cannot tell: keep it
        meta = claim.get("metadata") or {}
        allocation = (claim.get("status") or {}).get("allocation")
        return bool(meta.get("uid") == rec.uid and allocation)

    def _check_overlap(self, uid: str, devices: Iterable[PreparedDevice]) -> None:
        """A device prepared for another claim is refused unless both sides share it
        (admin access or a multi-allocation share id). Called under ``_lock``, together
        with recording the intent, so two claims racing for one device cannot both win."""
        mine = {d.device: d for d in devices}
        for rec in self._claims.values():
            if rec.uid == uid:
                continue
            for other in rec.devices:
                d = mine.get(other.device)
                if d is None or _shared(d) or _shared(other):
                    continue
                raise ClaimError(
                    f"device {other.device!r} is already prepared for claim "
                    f"{rec.namespace}/{rec.name} ({rec.uid})"
                )

    # -- unprepare --------------------------------------------------------------------

    def _unprepare_one(self, ref: ClaimRef) -> None:
        if not _UID.match(ref.uid):
            return  # never ours: nothing to undo
        with self._claim_lock(ref.uid):
            rec = self._claims.get(ref.uid)
            if rec is None:
                # Not recorded (never prepared, already unprepared, or a lost checkpoint):
                # still remove files under this claim's names.
                paths = self._owned_paths(ref.uid)
                if self.metadata is not None:
                    taken = {f for r in self._claims.values() for f in r.files}
                    found = self.metadata.owned_paths(ref.namespace, ref.name, ref.uid)
                    paths += [p for p in found if str(p) not in taken]
                for p in paths:
                    remove_quiet(p)
                if self.metadata is not None:
                    self.metadata.prune(paths)
                return
            self._undo(rec)

    def _undo(self, rec: ClaimRecord) -> None:
        """Remove the claim's files, then its record. Interrupted in between, the record
        stays: unprepare removes the files again, prepare sees them missing and redoes."""
        # A same-named claim prepared meanwhile shares the metadata path (it is keyed by
        # namespace and name): its files stay.
        taken = {f for r in self._claims.values() if r.uid != rec.uid for f in r.files}
        paths = {*map(Path, rec.files), *self._owned_paths(rec.uid)}
        for p in paths:
            if str(p) not in taken:
                remove_quiet(p)
        if self.metadata is not None:
            self.metadata.prune(paths)
        self._fail("unprepare-files")
        self._drop(rec.uid)

    # -- checkpoint -------------------------------------------------------------------

    def _reserve(self, rec: ClaimRecord) -> None:
        """Record ``rec`` in memory only, refusing devices another claim holds. It reaches
        the disk with the next checkpoint write (normally this claim's own commit)."""
        with self._lock:
            self._check_overlap(rec.uid, rec.devices)
            claims = dict(self._claims)
            claims[rec.uid] = rec
            self._claims = claims
            self._version += 1

    def _put(self, rec: ClaimRecord) -> None:
        """Record ``rec`` and return once it is on disk."""
        with self._lock:
            claims = dict(self._claims)
            claims[rec.uid] = rec
            self._claims = claims
            self._version += 1
            version = self._version
        self._flush(version)

    def _drop(self, uid: str) -> None:
        with self._lock:
            if uid not in self._claims:
                return
            claims = dict(self._claims)
            del claims[uid]
            self._claims = claims
            self._version += 1
            version = self._version
        self._flush(version)

    def _flush(self, version: int) -> None:
        """Group commit: whoever holds the flush lock writes the newest state, which covers
        every change made before it; callers whose change is already covered return at
        once. Concurrent calls share one fsync instead of queueing for one each."""
        with self._flush_lock:
            if self._durable >= version:
                return
            with self._lock:
                claims, newest = self._claims, self._version
            self._save(claims)
            self._durable = newest

    def _save(self, claims: dict[str, ClaimRecord]) -> None:
        """Write the checkpoint: temp file, fsync, rename. The directory is fsynced too only
        when state may outlive a reboot (no boot id): otherwise losing the rename means a
        power loss, which is a reboot, which discards the checkpoint whichever one is
        found. It was one journal commit in two per prepare and per unprepare."""
        save_checkpoint(
            self.checkpoint_path,
            self.boot_id,
            claims,
            sync=self.sync or self.sync_checkpoint,
            sync_dir=self.sync,
        )

    def _reconcile(self) -> None:
        """At start: remove leftover temp files and the spec/topology files no record owns
        (interrupted prepares keep theirs: the kubelet's retry completes them). After a
        corrupt checkpoint, files are kept: containers of still-prepared claims may restart
        and need their spec."""
        spec_prefix = cdi.spec_file_prefix(self.kind)
        for directory, temp_prefix in ((self.cdi_root, f".{spec_prefix}"), (self.topo_dir, ".")):
            for entry in _listdir(directory):
                if entry.startswith(temp_prefix) and entry.endswith(TEMP_SUFFIX):
                    remove_quiet(directory / entry)
        if self.metadata is not None:
            self.metadata.reconcile(
                self._claims, self._published_attributes, keep_orphans=self.load_status == "corrupt"
            )
        if self.load_status == "corrupt":
            self._save(self._claims)
            return
        owned = {f for rec in self._claims.values() for f in rec.files}
        owned |= {str(p) for uid in self._claims for p in self._owned_paths(uid)}
        for entry in _listdir(self.cdi_root):
            if entry.startswith(spec_prefix) and entry.endswith(".json"):
                path = self.cdi_root / entry
                if str(path) not in owned:
                    log.info("removing orphan CDI spec %s", path)
                    remove_quiet(path)
        for entry in _listdir(self.topo_dir):
            path = self.topo_dir / entry
            if entry.endswith(".xml") and str(path) not in owned:
                remove_quiet(path)
        if self.load_status != "ok":
            self._save(self._claims)


def _label(ref: ClaimRef) -> str:
    return f"claim {ref.namespace}/{ref.name} ({ref.uid})"


def _shared(d: PreparedDevice) -> bool:
    return d.admin_access or d.share_id is not None


def _find(items: Sequence[Gpu] | Sequence[Nic], bus_id: str) -> Any:
    for item in items:
        if item.bus_id == bus_id:
            return item
    return None


def _listdir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
