"""The on-disk record of prepared claims.

Unprepare gets only namespace/name/uid from the kubelet (the claim may already be gone
from the API), and the kubelet may call either of two driver instances during a rolling
update, so what was prepared lives on disk, not in memory. The layout follows the NVIDIA
driver's: one JSON file, written atomically, with a checksum of its content and the
Linux boot id (a reboot discards it: no container of that boot exists any more).

Each claim moves ``PrepareStarted`` (reserved, naming every file the claim will own; on
disk only when another claim's write happens meanwhile) -> ``PrepareCompleted`` (written
once its files are); unprepare removes the files, then drops the entry (a completed
entry whose files are gone is prepared again by the next prepare). After kill -9 at any
point the next call finds an entry that says what to redo or undo, or no entry and only
orphan files named after the claim UID, which the next start removes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from driver.plumbing.atomic import write_atomic

log = logging.getLogger("driver.checkpoint")

CHECKPOINT_VERSION = 1
ClaimState = Literal["PrepareStarted", "PrepareCompleted"]
LoadStatus = Literal["ok", "missing", "corrupt", "rebooted"]


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as returned to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    admin_access: bool = False
    """Admin access and shares may overlap other claims on one device."""
    vendor_cdi_ids: tuple[str, ...] = ()
    """Which of ``cdi_ids`` are the GPU vendor's (driver/kubelet/vendor_cdi.py): written only when
    there are some, so records without them read and write as before."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request_names": list(self.request_names),
            "pool": self.pool,
            "device": self.device,
            "cdi_ids": list(self.cdi_ids),
            "share_id": self.share_id,
            "admin_access": self.admin_access,
        }
        if self.vendor_cdi_ids:
            out["vendor_cdi_ids"] = list(self.vendor_cdi_ids)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreparedDevice:
        return cls(
            request_names=tuple(d.get("request_names", ())),
            pool=str(d["pool"]),
            device=str(d["device"]),
            cdi_ids=tuple(d.get("cdi_ids", ())),
            share_id=d.get("share_id"),
            admin_access=bool(d.get("admin_access", False)),
            vendor_cdi_ids=tuple(str(x) for x in d.get("vendor_cdi_ids", ())),
        )


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    files: tuple[str, ...] = field(default=())
    """Every file this claim owns (CDI spec, NCCL topology), so undo needs no recomputation."""
    metadata: tuple[dict[str, Any], ...] = ()
    """What each request's device metadata file says (driver/kubelet/device_metadata.py), so a
    restart can rewrite it without the API server. Absent from older checkpoints."""

    @cached_property
    def as_dict(self) -> dict[str, Any]:
        """JSON form (written by hand: ``dataclasses.asdict`` was a tenth of a prepare)."""
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "devices": [d.to_dict() for d in self.devices],
            "files": list(self.files),
            **({"metadata": list(self.metadata)} if self.metadata else {}),
        }

    @cached_property
    def canonical(self) -> str:
        """Canonical JSON of :attr:`as_dict`, computed once per record: the whole
        checkpoint is written on every change, but only changed records are serialized."""
        return _canonical(self.as_dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimRecord:
        state = d["state"]
        if state not in ("PrepareStarted", "PrepareCompleted"):
            raise ValueError(f"unknown claim state {state!r}")
        return cls(
            uid=str(d["uid"]),
            namespace=str(d["namespace"]),
            name=str(d["name"]),
            state=state,
            devices=tuple(PreparedDevice.from_dict(x) for x in d.get("devices", ())),
            files=tuple(str(x) for x in d.get("files", ())),
            metadata=tuple(dict(x) for x in d.get("metadata", ())),
        )


def read_boot_id(root: Path) -> str:
    """``<root>/proc/sys/kernel/random/boot_id``; empty when unreadable (then a reboot cannot
    be told apart, and the checkpoint is kept)."""
    try:
        return (root / "proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _canonical(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load_checkpoint(path: Path, boot_id: str) -> tuple[dict[str, ClaimRecord], LoadStatus]:
    """The recorded claims and how loading went. A corrupt file is moved aside (kept for
    people to look at) and treated as empty; so is one from another boot."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, "missing"
    try:
        doc = json.loads(raw)
        data = doc["data"]
        if doc.get("checksum") != _checksum(_canonical(data)):
            raise ValueError("checksum mismatch")
        if data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"unknown checkpoint version {data.get('version')!r}")
        claims = {uid: ClaimRecord.from_dict(rec) for uid, rec in data["claims"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        aside = path.with_name(path.name + ".corrupt")
        path.replace(aside)
        log.error("checkpoint %s is corrupt (%s); moved to %s, starting empty", path, exc, aside)
        return {}, "corrupt"
    recorded_boot = data.get("bootId", "")
    if boot_id and recorded_boot and recorded_boot != boot_id:
        log.warning(
            "checkpoint %s is from boot %s (now %s): discarded", path, recorded_boot, boot_id
        )
        return {}, "rebooted"
    return claims, "ok"


def save_checkpoint(
    path: Path,
    boot_id: str,
    claims: dict[str, ClaimRecord],
    *,
    sync: bool = True,
    sync_dir: bool | None = None,
) -> None:
    # Exactly _canonical({"version": ..., "bootId": ..., "claims": {...}}) (keys sorted,
    # no spaces), put together from each record's cached text; the checksum covers these
    # bytes and load_checkpoint recomputes it from the parsed data.
    records = ",".join(f"{json.dumps(uid)}:{claims[uid].canonical}" for uid in sorted(claims))
    text = (
        f'{{"bootId":{json.dumps(boot_id)},"claims":{{{records}}},"version":{CHECKPOINT_VERSION}}}'
    )
    doc = f'{{"checksum":"{_checksum(text)}","data":{text}}}\n'
    write_atomic(path, doc.encode(), mode=0o600, sync=sync, sync_dir=sync_dir)
