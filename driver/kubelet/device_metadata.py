"""KEP-5304 device metadata: the JSON file a container reads to learn which devices it got.

Kubernetes 1.36 (alpha) leaves the whole protocol to the driver: nothing in the kubelet
or the API server writes or mounts the file, and on the wire the feature is one more CDI
id in the prepare answer. The Go helper library does it for Go drivers; this module is
the same protocol for ours (../shared/reference/device-metadata.md):

- one file per prepared claim and **base** request name (``gpu/high-mem`` is filed
  under ``gpu``; the full name is inside), at
  ``<plugin data dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json``;
- its content a stream of the same ``DeviceMetadata`` object once per configured API
  version, each followed by a newline (readers take the first version they know);
- bind-mounted read-only through a CDI spec of its own
  (``<cdi root>/<driver>_metadata_<claim uid>_<request>.json``, kind
  ``<driver>/metadata``), at ``/var/run/kubernetes.io/dra-device-attributes/
  resourceclaims/<claim>/<request>/<driver>-metadata.json`` (or
  ``resourceclaimtemplates/<pod claim name>/...`` for a claim made from a template), its
  id added after the driver's own to the first device of the request;
- each device with every attribute it publishes in the ResourceSlice, unchanged;
  generation 1 (nothing updates a file after prepare).

What a request's file says is kept in the checkpoint (:meth:`RequestMetadata.to_dict`),
so a restart rewrites the same bytes without asking the API server, whose claim may be
gone. Files are written like every other file of the driver (temp, rename), before the
checkpoint records the claim prepared; the file and its spec must exist before the
answer, or the runtime fails the container.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from driver.kubelet import cdi
from driver.kubelet.checkpoint import ClaimRecord, PreparedDevice
from driver.plumbing.atomic import TEMP_SUFFIX, remove_quiet, write_atomic

log = logging.getLogger("driver.device_metadata")

GROUP = "metadata.resource.k8s.io"
VERSIONS = ("v1alpha1", "v1beta1")
"""What this writer can write; 1.36 reads v1alpha1, 1.37 v1beta1 (then alpha as well)."""
DEFAULT_VERSIONS = ("v1alpha1",)
KIND = "DeviceMetadata"
DATA_DIR = "dra-device-metadata"
FILE_NAME = "metadata.json"
CONTAINER_ROOT = "/var/run/kubernetes.io/dra-device-attributes"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CDI_CLASS = "metadata"
DIR_MODE = 0o755
FILE_MODE = 0o644


@dataclass(frozen=True)
class MetadataDevice:
    pool: str
    name: str
    attributes: Mapping[str, Any]
    """The device's ``attributes`` exactly as its ResourceSlice publishes them."""


@dataclass(frozen=True)
class RequestMetadata:
    """What one request's file says, apart from the claim's identity and the versions."""

    request: str
    """Base request name: the directory, the CDI device name."""
    name: str
    """Full request reference (``req`` or ``req/sub``): ``requests[].name`` in the file."""
    devices: tuple[MetadataDevice, ...]
    pod_claim_name: str = ""
    generation: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's entry: what the claim's record does not already say (its
        devices, with their request, are in the record). Not the attributes: they are
        the node's published ones, and kept per claim they made every checkpoint write
        grow by a kilobyte per device."""
        out: dict[str, Any] = {"request": self.request, "name": self.name}
        if self.pod_claim_name:
            out["podClaimName"] = self.pod_claim_name
        if self.generation != 1:
            out["generation"] = self.generation
        return out

    @classmethod
    def from_record(
        cls,
        entry: Mapping[str, Any],
        devices: Iterable[PreparedDevice],
        attributes: Callable[[str], Mapping[str, Any] | None],
    ) -> tuple[RequestMetadata, bool]:
        """The request of a checkpoint entry, its devices those of the record filed under
        it, with their attributes as ``attributes`` (the current snapshot) has them; and
        whether every device was found there."""
        request = str(entry["request"])
        found = True
        devs = []
        for d in devices:
            if (d.request_names or ("",))[0] != request:
                continue
            attrs = attributes(d.device)
            found = found and attrs is not None
            devs.append(MetadataDevice(pool=d.pool, name=d.device, attributes=attrs or {}))
        return (
            cls(
                request=request,
                name=str(entry.get("name", request)),
                devices=tuple(devs),
                pod_claim_name=str(entry.get("podClaimName", "")),
                generation=int(entry.get("generation", 1)),
            ),
            found,
        )


@dataclass(frozen=True)
class MetadataFile:
    """One request's file as written."""

    request: str
    host_path: str
    container_path: str
    content: bytes


def base_request(request: str) -> str:
    """``gpu/high-mem`` (a prioritized-list subrequest) -> ``gpu``."""
    return request.split("/", 1)[0]


def group_requests(
    claim: Mapping[str, Any],
    results: Iterable[Mapping[str, Any]],
    attributes: Mapping[str, Mapping[str, Any]],
) -> tuple[RequestMetadata, ...]:
    """One entry per base request among ``results`` (this driver's allocation results, in
    their order), its devices in result order. Pure: the claim's annotation, the results
    and the published attributes by device name."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    pod_claim = str(annotations.get(POD_CLAIM_NAME_ANNOTATION) or "")
    names: dict[str, str] = {}
    devices: dict[str, list[MetadataDevice]] = {}
    for r in results:
        full = str(r.get("request", ""))
        base = base_request(full)
        names.setdefault(base, full)
        name = str(r.get("device", ""))
        devices.setdefault(base, []).append(
            MetadataDevice(
                pool=str(r.get("pool", "")), name=name, attributes=attributes.get(name) or {}
            )
        )
    return tuple(
        RequestMetadata(
            request=base, name=names[base], devices=tuple(devs), pod_claim_name=pod_claim
        )
        for base, devs in devices.items()
    )


def metadata_object(
    driver: str, namespace: str, name: str, uid: str, req: RequestMetadata, version: str
) -> dict[str, Any]:
    """The ``DeviceMetadata`` object of one version (field order as the Go writer's)."""
    devices = []
    for d in req.devices:
        dev: dict[str, Any] = {"driver": driver, "pool": d.pool, "name": d.name}
        if d.attributes:
            # Sorted, as Go's encoder writes a map: the same bytes whether the attributes
            # come from the slice or from the checkpoint (which sorts its keys).
            dev["attributes"] = dict(sorted(d.attributes.items()))
        devices.append(dev)
    obj: dict[str, Any] = {
        "kind": KIND,
        "apiVersion": f"{GROUP}/{version}",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": req.generation,
        },
    }
    if req.pod_claim_name:
        obj["podClaimName"] = req.pod_claim_name
    obj["requests"] = [{"name": req.name, "devices": devices}]
    return obj


def encode_stream(objects: Sequence[Mapping[str, Any]]) -> bytes:
    """The file: each object as compact JSON followed by a newline. Not the Go writer's
    indentation: a reader decodes a stream of values whatever the whitespace, and the
    indenting encoder is several times slower than the C one."""
    return "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in objects).encode()


def decode_stream(text: str) -> list[dict[str, Any]]:
    """Every object of a metadata file, in order (what a reader loops over)."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    at, end = 0, len(text)
    while True:
        while at < end and text[at].isspace():
            at += 1
        if at >= end:
            return out
        obj, at = decoder.raw_decode(text, at)
        out.append(obj)


def check_versions(versions: Sequence[str]) -> tuple[str, ...]:
    """ValueError with the offending name for an unknown, repeated or empty list."""
    if not versions:
        raise ValueError(f"give one or more of {','.join(VERSIONS)}")
    bad = [v for v in versions if v not in VERSIONS]
    if bad:
        raise ValueError(f"unknown version {bad[0]!r}: give one or more of {','.join(VERSIONS)}")
    if len(set(versions)) != len(versions):
        raise ValueError("a version is named twice")
    return tuple(versions)


class MetadataWriter:
    """Owns ``<data dir>/dra-device-metadata/`` and ``<cdi root>/<driver>_metadata_*.json``.

    ``enabled`` says whether prepare writes new files; whatever the flag, files that
    checkpoint records own are rebuilt at start and removed at unprepare, and files no
    record owns are removed at start.

    Prepare renders a file from strings (each device's JSON built once per published
    attributes, the claim's names put around it) and makes paths with string joins:
    ``json.dumps`` of the attributes and ``pathlib`` were most of this module's share of
    a prepare."""

    def __init__(
        self,
        driver: str,
        data_dir: str | os.PathLike[str],
        cdi_root: str | os.PathLike[str],
        *,
        versions: Sequence[str] = DEFAULT_VERSIONS,
        enabled: bool = True,
        sync: bool = False,
    ) -> None:
        self.driver = driver
        self.kind = f"{driver}/{CDI_CLASS}"
        cdi.check_kind(self.kind)
        self.root = Path(data_dir).absolute() / DATA_DIR
        self.cdi_root = Path(cdi_root).absolute()
        self.versions = check_versions(versions)
        self.enabled = enabled
        self.sync = sync
        self.spec_prefix = f"{driver}_{CDI_CLASS}_"
        self._root = str(self.root)
        self._cdi = str(self.cdi_root)
        self._driver_json = json.dumps(driver)
        self._device_json: dict[tuple[str, str], tuple[Mapping[str, Any], str]] = {}
        self._dirs = threading.Lock()
        """Creating a claim's directories and removing the emptied metadata directory
        take turns: between making ``dra-device-metadata/`` and the claim's directory in
        it, another claim's unprepare would otherwise find it empty and remove it."""

    # -- names ------------------------------------------------------------------------

    def claim_dir(self, namespace: str, name: str) -> Path:
        return Path(f"{self._root}/{namespace}_{name}")

    def host_path(self, namespace: str, name: str, request: str) -> str:
        return f"{self._root}/{namespace}_{name}/{request}/{FILE_NAME}"

    def container_path(self, claim_name: str, req: RequestMetadata) -> str:
        if req.pod_claim_name:
            where = f"resourceclaimtemplates/{req.pod_claim_name}"
        else:
            where = f"resourceclaims/{claim_name}"
        return f"{CONTAINER_ROOT}/{where}/{req.request}/{self.driver}-metadata.json"

    def device_name(self, uid: str, request: str) -> str:
        return f"{uid}_{request}"

    def cdi_id(self, uid: str, request: str) -> str:
        return cdi.qualified(self.kind, self.device_name(uid, request))

    def spec_path(self, uid: str, request: str) -> str:
        return f"{self._cdi}/{self.spec_prefix}{uid}_{request}.json"

    # -- prepare ----------------------------------------------------------------------

    def with_ids(
        self, uid: str, reqs: Sequence[RequestMetadata], devices: Sequence[PreparedDevice]
    ) -> tuple[PreparedDevice, ...]:
        """``devices`` with each request's metadata id after the first device's own ids."""
        pending = {r.request for r in reqs}
        out = []
        for dev in devices:
            req = dev.request_names[0] if dev.request_names else ""
            if req in pending:
                pending.discard(req)
                dev = replace(dev, cdi_ids=(*dev.cdi_ids, self.cdi_id(uid, req)))
            out.append(dev)
        return tuple(out)

    def render(
        self, namespace: str, name: str, uid: str, reqs: Sequence[RequestMetadata]
    ) -> list[MetadataFile]:
        """Each request's file. The same text as ``encode_stream`` of
        :func:`metadata_object` per version (tests/test_device_metadata.py holds them
        equal), put together from strings."""
        out = []
        ident = (
            f'"metadata":{{"name":{json.dumps(name)},"namespace":{json.dumps(namespace)},'
            f'"uid":{json.dumps(uid)},"generation":'
        )
        for req in reqs:
            cdi.check_device_name(self.device_name(uid, req.request))
            devices = ",".join(self._device(d) for d in req.devices)
            pod = f',"podClaimName":{json.dumps(req.pod_claim_name)}' if req.pod_claim_name else ""
            body = (
                f"{ident}{int(req.generation)}}}{pod},"
                f'"requests":[{{"name":{json.dumps(req.name)},"devices":[{devices}]}}]}}\n'
            )
            text = "".join(
                f'{{"kind":"{KIND}","apiVersion":"{GROUP}/{v}",{body}' for v in self.versions
            )
            out.append(
                MetadataFile(
                    request=req.request,
                    host_path=self.host_path(namespace, name, req.request),
                    container_path=self.container_path(name, req),
                    content=text.encode(),
                )
            )
        return out

    def _device(self, d: MetadataDevice) -> str:
        """One device's JSON, cached while its published attributes are the same object
        (one snapshot): rendering the attributes was the largest cost of a file."""
        key = (d.pool, d.name)
        hit = self._device_json.get(key)
        if hit is not None and hit[0] is d.attributes:
            return hit[1]
        text = (
            f'{{"driver":{self._driver_json},"pool":{json.dumps(d.pool)},'
            f'"name":{json.dumps(d.name)}'
        )
        if d.attributes:
            # Sorted, as Go's encoder writes a map: the same bytes for the same attributes
            # in any order.
            attrs = json.dumps(d.attributes, sort_keys=True, separators=(",", ":"))
            text += f',"attributes":{attrs}'
        text += "}"
        if len(self._device_json) >= _DEVICE_CACHE_MAX:
            self._device_json.clear()
        self._device_json[key] = (d.attributes, text)
        return text

    def spec_bytes(self, uid: str, f: MetadataFile) -> bytes:
        """The CDI spec that mounts ``f`` read-only (cdiVersion: the minimum its device
        name needs, cdi.md section 4)."""
        device = self.device_name(uid, f.request)
        spec = {
            "cdiVersion": "0.5.0" if device[:1].isdigit() else "0.3.0",
            "kind": self.kind,
            "devices": [
                {
                    "name": device,
                    "containerEdits": {
                        "mounts": [
                            {
                                "hostPath": f.host_path,
                                "containerPath": f.container_path,
                                "options": ["ro", "nosuid", "nodev", "bind"],
                            }
                        ]
                    },
                }
            ],
        }
        return json.dumps(spec).encode() + b"\n"

    def writes(self, uid: str, files: Sequence[MetadataFile]) -> list[tuple[Path, bytes]]:
        """(path, content) to write, each metadata file before the spec that mounts it."""
        out = []
        for f in files:
            out.append((Path(f.host_path), f.content))
            out.append((Path(self.spec_path(uid, f.request)), self.spec_bytes(uid, f)))
        return out

    def write(self, files: Iterable[tuple[Path, bytes]]) -> None:
        for path, data in files:
            directory = os.path.dirname(path)
            if directory != self._cdi:
                with self._dirs:
                    _mkdirs(directory)
            write_atomic(path, data, mode=FILE_MODE, sync=self.sync)

    # -- unprepare --------------------------------------------------------------------

    def owned_paths(self, namespace: str, name: str, uid: str) -> list[Path]:
        """The claim's files found by name alone (no record: a lost checkpoint)."""
        paths = [
            self.cdi_root / e
            for e in _listdir(self.cdi_root)
            if e.startswith(f"{self.spec_prefix}{uid}_") and e.endswith(".json")
        ]
        claim_dir = self.claim_dir(namespace, name)
        paths += [claim_dir / r / FILE_NAME for r in _listdir(claim_dir)]
        return paths

    def prune(self, removed: Iterable[str | os.PathLike[str]]) -> None:
        """Remove the request and claim directories left empty by ``removed``, and the
        metadata directory itself once no claim has one: an uninstall that follows the
        last unprepare leaves nothing of it (prepare makes it again)."""
        prefix = self._root + "/"
        dirs: set[str] = set()
        for p in removed:
            text = os.fspath(p)
            if text.startswith(prefix) and text.count("/", len(prefix)) == 2:
                request_dir = os.path.dirname(text)
                dirs.add(request_dir)
                dirs.add(os.path.dirname(request_dir))
        if not dirs:
            return
        with self._dirs:
            for d in sorted(dirs, key=len, reverse=True):
                try:
                    os.rmdir(d)
                except OSError:  # not empty (another request, another claim), or gone
                    pass
            try:
                os.rmdir(self._root)
            except OSError:
                pass

    # -- start ------------------------------------------------------------------------

    def reconcile(
        self,
        records: Mapping[str, ClaimRecord],
        attributes: Callable[[str], Mapping[str, Any] | None],
        *,
        keep_orphans: bool,
    ) -> None:
        """At start: remove temp files, then (unless ``keep_orphans``: the checkpoint was
        corrupt) every metadata file and spec no record owns, then rewrite from the
        checkpoint each completed claim's files that are missing or differ."""
        tree = list(self._tree())
        for path in tree:
            if path.name.endswith(TEMP_SUFFIX):
                remove_quiet(path)
        for entry in _listdir(self.cdi_root):
            if entry.startswith(f".{self.spec_prefix}") and entry.endswith(TEMP_SUFFIX):
                remove_quiet(self.cdi_root / entry)
        owned = {f for rec in records.values() for f in rec.files}
        if not keep_orphans:
            orphans = [p for p in tree if p.name == FILE_NAME and str(p) not in owned]
            orphans += [
                self.cdi_root / e
                for e in _listdir(self.cdi_root)
                if e.startswith(self.spec_prefix)
                and e.endswith(".json")
                and str(self.cdi_root / e) not in owned
            ]
            for path in orphans:
                log.info("removing orphan device metadata file %s", path)
                remove_quiet(path)
            self.prune(p for p in tree if not p.exists())
        for rec in records.values():
            if rec.state == "PrepareCompleted" and rec.metadata:
                self.rebuild(rec, attributes)

    def rebuild(
        self, rec: ClaimRecord, attributes: Callable[[str], Mapping[str, Any] | None]
    ) -> int:
        """Rewrite the record's metadata files and specs that are missing or differ from
        what the checkpoint and the published attributes say; how many were written. A
        request with a device no longer published keeps its file (identity only if the
        file is gone)."""
        written = 0
        for entry in rec.metadata:
            try:
                req, complete = RequestMetadata.from_record(entry, rec.devices, attributes)
                (f,) = self.render(rec.namespace, rec.name, rec.uid, [req])
            except (KeyError, TypeError, ValueError) as exc:
                log.error(
                    "claim %s/%s: unreadable device metadata record: %s",
                    rec.namespace,
                    rec.name,
                    exc,
                )
                continue
            for path, data in self.writes(rec.uid, [f]):
                if str(path) not in rec.files:
                    log.warning(
                        "claim %s/%s: device metadata %s is not among the claim's files "
                        "(plugin or CDI directory changed?); left alone",
                        rec.namespace,
                        rec.name,
                        path,
                    )
                    continue
                try:
                    if path.read_bytes() == data or not complete:
                        continue
                except OSError:
                    pass
                self.write([(path, data)])
                written += 1
        if written:
            log.info(
                "claim %s/%s: rebuilt %d device metadata file(s) from the checkpoint",
                rec.namespace,
                rec.name,
                written,
            )
        return written

    def _tree(self) -> Iterable[Path]:
        """Every file two levels under the claim directories (``<claim>/<request>/*``)."""
        for claim in _listdir(self.root):
            for request in _listdir(self.root / claim):
                for entry in _listdir(self.root / claim / request):
                    yield self.root / claim / request / entry


_DEVICE_CACHE_MAX = 4096


def _mkdirs(directory: str) -> None:
    """``mkdir -p`` with mode 0755; one syscall when the directory is there."""
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(directory, DIR_MODE, exist_ok=True)


def _listdir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
