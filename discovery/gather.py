"""``toposlice gather``: pack the files discovery reads (and the NVML answers) into a tarball.

Like hwloc's ``hwloc-gather-topology``, for bug reports and CI -- but the archive holds
exactly what toposlice's discovery reads, found by running discovery once with its
reads recorded (:mod:`discovery.readlog`), so it carries no unrelated files and
nothing a replay needs is missing. Symlinks stay symlinks (the PCI tree, ``class/``
views and drivers are links in sysfs), directories whose entries discovery lists keep
their entry names, and the bytes stored are the bytes discovery got.

Serial-like identifiers (MAC and IPoIB addresses, RDMA node/system GUIDs, GPU UUIDs,
AMD unique ids, ``serial`` lines of cpuinfo) are replaced by consistent pseudonyms of
the same shape unless ``include_serials`` is set.

On a live host a few facts come from libraries rather than files (the hostname, the
link speed/MTU psutil reads through ioctls when sysfs refuses): they are written into
the files a replay reads (``etc/hostname``, the interface's ``speed``/``mtu``). udev's
PCI names are read from its database files like any other file, and only their two
name lines are kept.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import io
import json
import os
import re
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from discovery.model import Inventory
from discovery.nvml_replay import RecordingNvml
from discovery.readlog import ReadLog, record_reads
from discovery.replay import META_FILE, NVML_FILE

__all__ = ["GATHER_FORMAT", "GatherResult", "archive_bytes", "compare_inventories", "gather"]

GATHER_FORMAT = "toposlice.gather/v1"
_MAX_LINK_HOPS = 40
_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2})+$")
_GUID_RE = re.compile(r"^[0-9a-fA-F]{4}(:[0-9a-fA-F]{4}){3}$")
_UUID_RE = re.compile(r"^(GPU-|MIG-)?([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})$")


@dataclass
class GatherResult:
    """An archive and what went into it."""

    data: bytes = b""
    """The ``.tar.gz`` itself."""
    files: int = 0
    links: int = 0
    dirs: int = 0
    size_bytes: int = 0
    nvml: bool = False
    redacted: int = 0
    """Serial-like values replaced by pseudonyms."""
    inventory: Inventory | None = None
    """The inventory discovery produced while the reads were recorded."""


@dataclass
class _Entry:
    kind: str  # "file" | "dir" | "link"
    data: bytes = b""
    target: str = ""


class _Archive:
    """Root-relative entries, with every symlink on the way to a path kept as a link."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.entries: dict[str, _Entry] = {}

    def resolve(self, rel: str, follow_leaf: bool) -> str | None:
        """The real root-relative path of ``rel``, adding each symlink passed on the way.

        None when the path leaves the root (a link pointing outside a dump).
        """
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        cur = ""
        hops = 0
        while parts:
            comp = parts.pop(0)
            if comp == "..":
                if not cur:
                    return None
                cur = os.path.dirname(cur)
                continue
            cand = f"{cur}/{comp}" if cur else comp
            full = os.path.join(self.root, cand)
            if (parts or follow_leaf) and os.path.islink(full):
                hops += 1
                target = self.add_link(cand)
                if target is None or hops > _MAX_LINK_HOPS:
                    return None
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                cur = ""
                continue
            cur = cand
        return cur

    def add_link(self, rel: str) -> str | None:
        """Archive the symlink at ``rel``; its target as a root-relative path (or None)."""
        try:
            target = os.readlink(os.path.join(self.root, rel))
        except OSError:
            return None
        parent = os.path.dirname(rel)
        if os.path.isabs(target):
            resolved = os.path.normpath(target.lstrip("/"))
            target = os.path.relpath(resolved, parent or ".")
        else:
            resolved = os.path.normpath(os.path.join(parent, target))
        if resolved == ".." or resolved.startswith("../") or os.path.isabs(resolved):
            return None
        self._put(rel, _Entry("link", target=target))
        return "" if resolved == "." else resolved

    def add_dir(self, rel: str) -> None:
        real = self.resolve(rel, follow_leaf=True)
        if real is not None and os.path.isdir(os.path.join(self.root, real)):
            self._put(real, _Entry("dir"))

    def add_file(self, rel: str, data: bytes) -> str | None:
        real = self.resolve(rel, follow_leaf=True)
        if real is not None:
            self._put(real, _Entry("file", data=data))
        return real

    def add_listing(self, rel: str) -> None:
        """A directory discovery listed: every entry name (links as links, dirs empty)."""
        real = self.resolve(rel, follow_leaf=True)
        if real is None:
            return
        self._put(real, _Entry("dir"))
        try:
            names = os.listdir(os.path.join(self.root, real))
        except OSError:
            return
        for name in names:
            child = f"{real}/{name}" if real else name
            try:
                mode = os.lstat(os.path.join(self.root, child)).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                self.add_link(child)
            elif stat.S_ISDIR(mode):
                self._put(child, _Entry("dir"))
            elif child not in self.entries:
                # Discovery used only the name: an empty placeholder keeps the listing.
                self._put(child, _Entry("file"))

    def _put(self, rel: str, entry: _Entry) -> None:
        old = self.entries.get(rel)
        if old is not None:
            if old.kind == "file" and entry.kind == "file" and entry.data:
                self.entries[rel] = entry  # read content replaces a listing's placeholder
            return
        self.entries[rel] = entry
        parent = os.path.dirname(rel)
        while parent and parent not in self.entries:
            self.entries[parent] = _Entry("dir")
            parent = os.path.dirname(parent)


class _Redactor:
    """Consistent same-shape pseudonyms for serial-like values (keyed, not reversible)."""

    def __init__(self) -> None:
        self.key = os.urandom(16)
        self.count = 0

    def _digest(self, value: str) -> bytes:
        self.count += 1
        return hmac.new(self.key, value.encode(), hashlib.sha256).digest()

    def mac(self, text: str) -> str:
        octets = text.split(":")
        if not _MAC_RE.match(text) or all(int(o, 16) == 0 for o in octets):
            return text
        digest = self._digest(text.lower())
        if len(octets) == 20:
            # IPoIB: QPN and GID prefix stay, the port GUID (last 8 bytes) is replaced.
            fresh = octets[:12] + [f"{b:02x}" for b in digest[:8]]
        else:
            raw = bytearray(digest[: len(octets)])
            raw[0] = (raw[0] & 0xFC) | 0x02  # locally administered unicast
            fresh = [f"{b:02x}" for b in raw]
        return ":".join(fresh)

    def guid(self, text: str) -> str:
        if not _GUID_RE.match(text) or set(text) <= {"0", ":"}:
            return text
        h = self._digest(text.lower())[:8].hex()
        return ":".join(h[i : i + 4] for i in range(0, 16, 4))

    def uuid(self, text: str) -> str:
        m = _UUID_RE.match(text)
        if not m:
            return text
        h = self._digest(text.lower()).hex()
        body = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        return f"{m.group(1) or ''}{body}"

    def file(self, real: str, data: bytes) -> bytes:
        """The redacted content of one archived file (by what the path says it is)."""
        name = os.path.basename(real)
        text = data.decode("utf-8", "replace")
        if name == "address" and "/net/" in f"/{real}":
            return _keep_newline(data, self.mac(text.strip()))
        if name in ("node_guid", "sys_image_guid") and "/infiniband/" in f"/{real}":
            return _keep_newline(data, self.guid(text.strip()))
        if name == "properties" and "/topology/nodes/" in real:
            return self._kfd_properties(text).encode()
        if real == "proc/cpuinfo":
            lines = [ln for ln in text.split("\n") if "serial" not in ln.split(":", 1)[0].lower()]
            return "\n".join(lines).encode()
        return data

    def _kfd_properties(self, text: str) -> str:
        out = []
        for line in text.split("\n"):
            parts = line.split()
            if len(parts) == 2 and parts[0] == "unique_id" and parts[1] not in ("0", ""):
                value = int.from_bytes(self._digest(parts[1])[:8], "big") | 1
                line = f"unique_id {value}"
            out.append(line)
        return "\n".join(out)

    def nvml_calls(self, calls: list[dict[str, Any]]) -> None:
        for entry in calls:
            if entry.get("fn") == "nvmlDeviceGetUUID" and isinstance(entry.get("result"), str):
                entry["result"] = self.uuid(entry["result"])
            elif entry.get("fn") == "nvmlDeviceGetUUID" and isinstance(entry.get("result"), dict):
                raw = entry["result"].get("b")
                if isinstance(raw, str):
                    text = bytes.fromhex(raw).decode("utf-8", "replace")
                    entry["result"] = {"b": self.uuid(text).encode().hex()}


def _keep_newline(data: bytes, value: str) -> bytes:
    return (value + ("\n" if data.endswith(b"\n") else "")).encode()


def _record(
    root: str, discover: Callable[[str, Any], Inventory], nvml: RecordingNvml | None
) -> tuple[Inventory, ReadLog]:
    discover(root, None)  # a first run imports every module the second one needs
    with record_reads(root) as log:
        inv = discover(root, nvml)
    return inv, log


def _live_facts(log: ReadLog, recorded: Inventory, live: Inventory) -> None:
    """Write what a live host learns from libraries into the files a replay reads."""
    if live.hostname:
        log.contents["etc/hostname"] = (live.hostname + "\n").encode()
    by_name = {i.name: i for i in recorded.net_interfaces}
    for iface in live.net_interfaces:
        seen = by_name.get(iface.name)
        if seen is None:
            continue
        if iface.speed_mbps is not None and seen.speed_mbps != iface.speed_mbps:
            log.contents[f"sys/class/net/{iface.name}/speed"] = f"{iface.speed_mbps}\n".encode()
        if iface.mtu is not None and seen.mtu != iface.mtu:
            log.contents[f"sys/class/net/{iface.name}/mtu"] = f"{iface.mtu}\n".encode()


_UDEV_KEYS = (b"E:ID_VENDOR_FROM_DATABASE=", b"E:ID_MODEL_FROM_DATABASE=")


def _build(log: ReadLog, redactor: _Redactor | None) -> _Archive:
    arc = _Archive(log.root)
    for rel in sorted(log.opened_dirs):
        arc.add_dir(rel)
    for rel in sorted(log.listed):
        arc.add_listing(rel)
    for rel in sorted(log.links):
        parent = os.path.dirname(rel)
        real_parent = arc.resolve(parent, follow_leaf=True) if parent else ""
        if real_parent is not None:
            arc.add_link(f"{real_parent}/{os.path.basename(rel)}" if real_parent else rel)
    for rel in sorted(log.attempted - set(log.contents)):
        # A failed read still needs its directory (``cpuN`` without an ``online`` file).
        arc.add_dir(os.path.dirname(rel))
    for rel, data in sorted(log.contents.items()):
        if rel.startswith("run/udev/data/"):
            data = b"".join(ln + b"\n" for ln in data.splitlines() if ln.startswith(_UDEV_KEYS))
        real = arc.resolve(rel, follow_leaf=True)
        if real is None:
            continue
        if redactor is not None:
            data = redactor.file(real, data)
        arc.add_file(real, data)
    return arc


def archive_bytes(entries: dict[str, _Entry]) -> bytes:
    """Deterministic ``.tar.gz`` (sorted, mtime 0, root-owned): the same reads always
    give the same bytes."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for rel in sorted(entries):
                entry = entries[rel]
                info = tarfile.TarInfo(rel)
                info.mtime = 0
                if entry.kind == "dir":
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tf.addfile(info)
                elif entry.kind == "link":
                    info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, entry.target
                    tf.addfile(info)
                else:
                    info.mode, info.size = 0o644, len(entry.data)
                    tf.addfile(info, io.BytesIO(entry.data))
    return buf.getvalue()


def gather(
    root: str,
    discover: Callable[[str, Any], Inventory],
    *,
    include_serials: bool = False,
    nvml: Callable[[], Any] | None = None,
    live_inventory: Inventory | None = None,
) -> GatherResult:
    """The archive (``GatherResult.data``) of what ``discover(root, nvml)`` reads.

    ``discover`` runs backends and probes on a non-live root (the caller owns the
    orchestration; discovery/ does not import the probes). ``nvml`` loads the
    pynvml-compatible module to record, on first use (the host's pynvml, a fake NVML);
    when it raises, replays report NVML unavailable with the same message.
    ``live_inventory`` is what the running host gives with its libraries: its hostname
    and psutil link facts are written into the files a replay reads.
    """
    root = os.path.abspath(root)
    recorder = RecordingNvml(nvml) if nvml is not None else None
    inv, log = _record(root, discover, recorder)
    if live_inventory is not None:
        _live_facts(log, inv, live_inventory)
    redactor = None if include_serials else _Redactor()
    arc = _build(log, redactor)
    meta = {
        "format": GATHER_FORMAT,
        "root": root,
        "serials": "included" if include_serials else "redacted",
    }
    arc.entries[META_FILE] = _Entry("file", data=(json.dumps(meta, sort_keys=True) + "\n").encode())
    result = GatherResult(inventory=inv)
    if recorder is not None and recorder.used:
        data = recorder.to_json()
        if redactor is not None:
            redactor.nvml_calls(data["calls"])
        arc.entries[NVML_FILE] = _Entry(
            "file", data=(json.dumps(data, sort_keys=True, indent=1) + "\n").encode()
        )
        result.nvml = True
    result.data = archive_bytes(arc.entries)
    result.size_bytes = len(result.data)
    for entry in arc.entries.values():
        if entry.kind == "file":
            result.files += 1
        elif entry.kind == "link":
            result.links += 1
        else:
            result.dirs += 1
    result.redacted = redactor.count if redactor is not None else 0
    return result


#: Inventory fields that hold the identifiers ``gather`` redacts by default.
REDACTED_FIELDS: dict[str, tuple[str, ...]] = {
    "net_interfaces": ("address",),
    "rdma_devices": ("node_guid", "sys_image_guid"),
    "nics": ("node_guid",),
    "gpus": ("uuid",),
}


def compare_inventories(
    host: dict[str, Any], replay: dict[str, Any], *, redacted: bool = False
) -> list[str]:
    """Top-level inventory sections where a replay differs from the host (``source`` aside).

    With ``redacted`` the identifier fields a default gather replaces are left out.
    """
    diffs = []
    for key in sorted(set(host) | set(replay)):
        if key == "source":
            continue
        a, b = host.get(key), replay.get(key)
        if redacted and key in REDACTED_FIELDS and isinstance(a, list) and isinstance(b, list):
            a = [_without(x, REDACTED_FIELDS[key]) for x in a]
            b = [_without(x, REDACTED_FIELDS[key]) for x in b]
        if a != b:
            diffs.append(key)
    return diffs


def _without(item: Any, keys: tuple[str, ...]) -> Any:
    return {k: v for k, v in item.items() if k not in keys} if isinstance(item, dict) else item
