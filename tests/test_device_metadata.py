"""KEP-5304 device metadata files written by DriverState through MetadataWriter: paths
(claims by name and from templates), versions, prioritized-list subrequests, the CDI spec
that mounts them, atomic writes, removal, rebuild from the checkpoint, and the flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from driver.config import add_driver_args, load_config
from driver.kubelet import cdi
from driver.kubelet.checkpoint import ClaimRecord, load_checkpoint
from driver.kubelet.device_metadata import (
    CONTAINER_ROOT,
    POD_CLAIM_NAME_ANNOTATION,
    MetadataWriter,
    decode_stream,
    encode_stream,
    group_requests,
    metadata_object,
)
from driver.kubelet.state import ClaimRef, DriverState
from driver.plumbing.checks import ConfigError
from normalize.options import NormalizeOptions
from normalize.snapshot import Snapshot
from tests.driver_support import DRIVER, NODE, FakeClaims, claim, device_names, snapshot

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "schema" / "device-metadata.schema.json").read_text())
CDI_SCHEMA = json.loads((REPO / "tests" / "data" / "cdi-schema.json").read_text())
UID = "7c0e4b1a-2d3f-4a5b-8c9d-0e1f2a3b4c5d"


class SimulatedCrash(BaseException):
    """Stands for kill -9: not an Exception, so no cleanup path catches it."""


def make(
    tmp: Path,
    reader: FakeClaims,
    *,
    versions: tuple[str, ...] = ("v1alpha1",),
    enabled: bool = True,
    fail_at: str = "",
    snap: Snapshot | None = None,
) -> DriverState:
    """DriverState on the fake DGX with its metadata writer under ``tmp/plugins``."""
    root = tmp / "root"
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    snap = snap or snapshot()

    def fail_point(step: str) -> None:
        if step == fail_at:
            raise SimulatedCrash(step)

    writer = MetadataWriter(
        DRIVER, tmp / "plugins", tmp / "cdi", versions=versions, enabled=enabled
    )
    return DriverState(
        DRIVER,
        NODE,
        tmp / "cdi",
        tmp / "state",
        root,
        reader,
        lambda: snap,
        metadata=writer,
        fail_point=fail_point,
    )


def ref(obj: dict[str, Any]) -> ClaimRef:
    m = obj["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


def published(name: str) -> dict[str, Any]:
    attrs: dict[str, Any] = next(d for d in snapshot().devices if d["name"] == name)["attributes"]
    return attrs


def meta_dir(tmp: Path) -> Path:
    return tmp / "plugins" / "dra-device-metadata"


def host_file(tmp: Path, ns: str, name: str, request: str) -> Path:
    return meta_dir(tmp) / f"{ns}_{name}" / request / "metadata.json"


def meta_spec(tmp: Path, uid: str, request: str) -> dict[str, Any]:
    path = tmp / "cdi" / f"{DRIVER}_metadata_{uid}_{request}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def objects(path: Path) -> list[dict[str, Any]]:
    """The file's stream, every object checked against the published schema."""
    found = decode_stream(path.read_text())
    for obj in found:
        jsonschema.validate(obj, SCHEMA)
    return found


def tree(tmp: Path) -> list[str]:
    """Every file under the metadata directory and the CDI directory (temp files too)."""
    out = []
    for base in (meta_dir(tmp), tmp / "cdi"):
        for dirpath, _, names in os.walk(base):
            out += [os.path.relpath(os.path.join(dirpath, n), tmp) for n in names]
    return sorted(out)


@pytest.fixture
def reader() -> FakeClaims:
    return FakeClaims()


def test_claim_by_name_gets_one_file_per_request_with_exactly_its_devices(
    tmp_path: Path, reader: FakeClaims
) -> None:
    g = device_names(snapshot(), "gpu-")[:2]
    n = device_names(snapshot(), "nic-")[:1]
    extra = [{"request": "net", "driver": DRIVER, "pool": NODE, "device": n[0]}]
    # A result of another driver is not ours to describe.
    extra.append({"request": "net", "driver": "other.example.com", "pool": "p", "device": "x"})
    c = reader.add(claim(UID, g, name="train", namespace="ml", request="gpus", extra_results=extra))
    state = make(tmp_path, reader)
    res = state.prepare([ref(c)])[UID]
    assert res.error == ""

    for request, devices in (("gpus", g), ("net", n)):
        (obj,) = objects(host_file(tmp_path, "ml", "train", request))
        assert obj["kind"] == "DeviceMetadata"
        assert obj["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
        assert obj["metadata"] == {"name": "train", "namespace": "ml", "uid": UID, "generation": 1}
        assert "podClaimName" not in obj
        (req,) = obj["requests"]
        assert req["name"] == request
        assert [(d["driver"], d["pool"], d["name"]) for d in req["devices"]] == [
            (DRIVER, NODE, name) for name in devices
        ]
        for d in req["devices"]:
            assert d["attributes"] == published(d["name"])  # standard and toposlice's
        assert oct(host_file(tmp_path, "ml", "train", request).stat().st_mode & 0o777) == "0o644"

        spec = meta_spec(tmp_path, UID, request)
        jsonschema.validate(spec, CDI_SCHEMA)
        assert spec["kind"] == f"{DRIVER}/metadata"
        (dev,) = spec["devices"]
        assert dev["name"] == f"{UID}_{request}"
        assert dev["containerEdits"] == {
            "mounts": [
                {
                    "hostPath": str(host_file(tmp_path, "ml", "train", request)),
                    "containerPath": f"{CONTAINER_ROOT}/resourceclaims/train/{request}/"
                    f"{DRIVER}-metadata.json",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ]
        }
        assert spec["cdiVersion"] == "0.5.0"  # the device name starts with a digit

    # The metadata id follows the device's own, on the first device of each request only.
    ids = {d.device: d.cdi_ids for d in res.devices}
    assert ids[g[0]][1:] == (f"{DRIVER}/metadata={UID}_gpus",)
    assert len(ids[g[1]]) == 1
    assert ids[n[0]][1:] == (f"{DRIVER}/metadata={UID}_net",)
    for cdi_id in (ids[g[0]][1], ids[n[0]][1]):  # every id returned resolves in a spec
        name = cdi_id.partition("=")[2]
        spec = meta_spec(tmp_path, UID, name.rpartition("_")[2])
        assert {cdi.qualified(spec["kind"], d["name"]) for d in spec["devices"]} == {cdi_id}


def test_template_claim_and_subrequest_paths(tmp_path: Path, reader: FakeClaims) -> None:
    """A claim made from a template is mounted under its pod claim name; a subrequest of a
    prioritized list is filed under its base request, with the full name inside."""
    g = device_names(snapshot(), "gpu-")[:1]
    c = claim(UID, g, name="trainer-0-gpus-x7k2p", namespace="ml", request="accel/h100")
    c["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpus"}
    reader.add(c)
    state = make(tmp_path, reader, versions=("v1beta1", "v1alpha1"))
    res = state.prepare([ref(c)])[UID]
    assert res.error == ""
    assert res.devices[0].request_names == ("accel",)
    assert res.devices[0].cdi_ids[-1] == f"{DRIVER}/metadata={UID}_accel"
    path = host_file(tmp_path, "ml", "trainer-0-gpus-x7k2p", "accel")
    beta, alpha = objects(path)  # in the order asked for
    assert beta["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
    assert alpha["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
    assert {**beta, "apiVersion": ""} == {**alpha, "apiVersion": ""}
    assert beta["podClaimName"] == "gpus"
    assert beta["requests"][0]["name"] == "accel/h100"
    (dev,) = meta_spec(tmp_path, UID, "accel")["devices"]
    assert dev["containerEdits"]["mounts"][0]["containerPath"] == (
        f"{CONTAINER_ROOT}/resourceclaimtemplates/gpus/accel/{DRIVER}-metadata.json"
    )
    assert path.read_text().count("\n") == 2  # one object per line


def test_unprepare_removes_files_and_directories(tmp_path: Path, reader: FakeClaims) -> None:
    g = device_names(snapshot(), "gpu-")
    a = reader.add(claim(UID, g[:1], name="a", namespace="ml"))
    b = reader.add(claim("b-uid", g[1:2], name="b", namespace="ml"))
    state = make(tmp_path, reader)
    state.prepare([ref(a), ref(b)])
    assert state.unprepare([ref(a)]) == {UID: ""}
    assert not (meta_dir(tmp_path) / "ml_a").exists()
    assert host_file(tmp_path, "ml", "b", "req").exists()  # the other claim's stay
    assert state.unprepare([ref(b)]) == {"b-uid": ""}
    assert tree(tmp_path) == []
    assert not meta_dir(tmp_path).exists()  # nothing left for an uninstall to leave


def test_unprepare_without_a_record_removes_by_name(tmp_path: Path, reader: FakeClaims) -> None:
    """A corrupt checkpoint: the start keeps every file (containers of claims still
    prepared may restart), and unprepare, with no record, finds the claim's by name."""
    c = reader.add(claim(UID, device_names(snapshot(), "gpu-")[:1], name="a", namespace="ml"))
    make(tmp_path, reader).prepare([ref(c)])
    files = [p for p in tree(tmp_path) if "metadata" in p]
    assert len(files) == 2
    (tmp_path / "state" / "checkpoint.json").write_text("{not json")
    state = make(tmp_path, reader)
    assert state.load_status == "corrupt" and state.claims() == {}
    assert [p for p in tree(tmp_path) if "metadata" in p] == files
    assert state.unprepare([ref(c)]) == {UID: ""}
    assert [p for p in tree(tmp_path) if "metadata" in p] == []
    assert not meta_dir(tmp_path).exists()


def test_same_named_replacement_keeps_its_file(tmp_path: Path, reader: FakeClaims) -> None:
    """The host path is keyed by namespace and name: when a replacement claim of the same
    name is prepared before the old one is unprepared, unpreparing the old leaves it."""
    g = device_names(snapshot(), "gpu-")
    old = claim(UID, g[:1], name="a", namespace="ml")
    reader.add(old)
    state = make(tmp_path, reader)
    state.prepare([ref(old)])
    new = reader.add(claim("new-uid", g[1:2], name="a", namespace="ml"))
    assert state.prepare([ref(new)])["new-uid"].error == ""
    assert state.unprepare([ref(old)]) == {UID: ""}
    (obj,) = objects(host_file(tmp_path, "ml", "a", "req"))
    assert obj["metadata"]["uid"] == "new-uid"
    assert json.dumps(meta_spec(tmp_path, "new-uid", "req"))


def test_restart_rebuilds_from_the_checkpoint_without_the_api(
    tmp_path: Path, reader: FakeClaims
) -> None:
    g = device_names(snapshot(), "gpu-")[:2]
    c = reader.add(claim(UID, g, name="a", namespace="ml"))
    make(tmp_path, reader, versions=("v1beta1", "v1alpha1")).prepare([ref(c)])
    path = host_file(tmp_path, "ml", "a", "req")
    spec_path = tmp_path / "cdi" / f"{DRIVER}_metadata_{UID}_req.json"
    before = {p: p.read_bytes() for p in (path, spec_path)}
    path.unlink()
    spec_path.write_text("{}")
    gone = FakeClaims()  # the claim is no longer readable: the rebuild must not need it
    state = make(tmp_path, gone, versions=("v1beta1", "v1alpha1"))
    assert gone.reads == 0
    assert {p: p.read_bytes() for p in before} == before
    # Idempotent: a second restart writes nothing.
    inode = path.stat().st_ino
    make(tmp_path, gone, versions=("v1beta1", "v1alpha1"))
    assert path.stat().st_ino == inode
    # And a repeated prepare answers the same ids from the record.
    again = state.prepare([ref(c)])[UID]
    assert again.error == "" and gone.reads == 0
    assert again.devices[0].cdi_ids[-1] == f"{DRIVER}/metadata={UID}_req"


def test_rebuild_without_the_device_in_the_snapshot(tmp_path: Path, reader: FakeClaims) -> None:
    """The attributes come from the published devices: a device gone from them since
    (the restart found other hardware) leaves an existing file as it is, and a missing
    file is written with the device's identity only."""
    g = device_names(snapshot(), "gpu-")[:1]
    c = reader.add(claim(UID, g, name="a", namespace="ml"))
    make(tmp_path, reader).prepare([ref(c)])
    path = host_file(tmp_path, "ml", "a", "req")
    written = path.read_bytes()
    without = dataclasses.replace(
        snapshot(), devices=tuple(d for d in snapshot().devices if d["name"] != g[0])
    )
    make(tmp_path, reader, snap=without)
    assert path.read_bytes() == written
    path.unlink()
    make(tmp_path, reader, snap=without)
    (obj,) = objects(path)
    assert obj["requests"][0]["devices"] == [{"driver": DRIVER, "pool": NODE, "name": g[0]}]


def test_kill_after_files_before_checkpoint_leaves_nothing(
    tmp_path: Path, reader: FakeClaims
) -> None:
    """kill -9 after the metadata files are written but before the checkpoint records the
    claim: the next start removes them (no record owns them); the kubelet's retry
    prepares the claim again with the same names."""
    c = reader.add(claim(UID, device_names(snapshot(), "gpu-")[:1], name="a", namespace="ml"))
    state = make(tmp_path, reader, fail_at="metadata")
    with pytest.raises(SimulatedCrash):
        state.prepare([ref(c)])
    assert host_file(tmp_path, "ml", "a", "req").exists()
    # A temp file a write was killed in the middle of is never read (dot name, .tmp).
    stray = host_file(tmp_path, "ml", "a", "req").with_name(".metadata.json.99-1.tmp")
    stray.write_text('{"kind": "Dev')
    again = make(tmp_path, reader)
    assert tree(tmp_path) == []
    assert again.prepare([ref(c)])[UID].error == ""
    objects(host_file(tmp_path, "ml", "a", "req"))


def test_files_are_replaced_whole(tmp_path: Path, reader: FakeClaims) -> None:
    """A repeated prepare after the file went missing writes it again through a temp file
    and a rename: a new inode, never a partly rewritten one."""
    c = reader.add(claim(UID, device_names(snapshot(), "gpu-")[:1], name="a", namespace="ml"))
    state = make(tmp_path, reader)
    state.prepare([ref(c)])
    path = host_file(tmp_path, "ml", "a", "req")
    keep = tmp_path / "hardlink"
    os.link(path, keep)  # what a container's bind mount pins
    (tmp_path / "cdi" / f"{DRIVER}_metadata_{UID}_req.json").unlink()
    assert state.prepare([ref(c)])[UID].error == ""
    assert path.stat().st_ino != keep.stat().st_ino
    assert keep.read_bytes() == path.read_bytes()


def test_checkpoint_records_metadata_and_old_records_load(
    tmp_path: Path, reader: FakeClaims
) -> None:
    c = reader.add(claim(UID, device_names(snapshot(), "gpu-")[:1], name="a", namespace="ml"))
    make(tmp_path, reader).prepare([ref(c)])
    claims, status = load_checkpoint(tmp_path / "state" / "checkpoint.json", "boot-1")
    assert status == "ok"
    assert claims[UID].metadata == ({"request": "req", "name": "req"},)
    # The attributes are the node's, not the claim's: not copied into every record.
    assert b"pciBusID" not in (tmp_path / "state" / "checkpoint.json").read_bytes()
    # A record written before this field existed has no "metadata" key, and one without
    # metadata is written exactly as before.
    old = ClaimRecord(uid="u", namespace="n", name="x", state="PrepareCompleted")
    assert "metadata" not in old.as_dict
    assert ClaimRecord.from_dict(old.as_dict).metadata == ()


def test_disabled_writes_no_metadata(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim(UID, device_names(snapshot(), "gpu-")[:1], name="a", namespace="ml"))
    res = make(tmp_path, reader, enabled=False).prepare([ref(c)])[UID]
    assert res.error == "" and len(res.devices[0].cdi_ids) == 1
    assert [p for p in tree(tmp_path) if "metadata" in p] == []


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_driver_args(p)
    p.add_argument("--driver")  # one of the shared flags (toposlice/sources.py)
    return p.parse_args(argv)


def config(tmp_path: Path, argv: list[str]) -> Any:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("clusters: []\n")
    args = parse(["--node-name", "n1", "--kubeconfig", str(kubeconfig), *argv])
    return load_config(args, "/", False, NormalizeOptions())


def test_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, [])
    assert cfg.device_metadata is True and cfg.device_metadata_versions == ("v1alpha1",)
    cfg = config(tmp_path, ["--no-device-metadata"])
    assert cfg.device_metadata is False
    cfg = config(tmp_path, ["--device-metadata-versions", "v1beta1,v1alpha1"])
    assert cfg.device_metadata_versions == ("v1beta1", "v1alpha1")
    with pytest.raises(ConfigError, match="unknown version 'v2'"):
        config(tmp_path, ["--device-metadata-versions", "v2"])
    with pytest.raises(ConfigError, match="must start with a letter"):
        config(tmp_path, ["--driver", "1gpu.example.com"])
    config(tmp_path, ["--driver", "1gpu.example.com", "--no-device-metadata"])
    monkeypatch.setenv("DEVICE_METADATA", "false")
    monkeypatch.setenv("DEVICE_METADATA_VERSIONS", "v1beta1")
    cfg = config(tmp_path, [])
    assert cfg.device_metadata is False and cfg.device_metadata_versions == ("v1beta1",)


@pytest.mark.parametrize("versions", [("v1alpha1",), ("v1beta1", "v1alpha1")])
def test_rendered_text_is_the_json_of_the_objects(versions: tuple[str, ...]) -> None:
    """The writer puts the file together from strings, for speed: it must be exactly the
    compact JSON of the objects (names that need escaping included)."""
    g = device_names(snapshot(), "gpu-")[:2] + device_names(snapshot(), "cpu-")[:1]
    c = claim(UID, g, name='we"ird\\name', namespace="ml", request="gpus/four")
    c["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpus"}
    results = c["status"]["allocation"]["devices"]["results"]
    reqs = group_requests(c, results, {n: published(n) for n in g})
    writer = MetadataWriter(DRIVER, "/p", "/c", versions=versions)
    (f,) = writer.render("ml", c["metadata"]["name"], UID, reqs)
    want = encode_stream(
        [metadata_object(DRIVER, "ml", c["metadata"]["name"], UID, reqs[0], v) for v in versions]
    )
    assert f.content == want
    assert writer.render("ml", c["metadata"]["name"], UID, reqs)[0].content == want  # cached


def test_concurrent_prepares_and_unprepares(tmp_path: Path, reader: FakeClaims) -> None:
    """Claims coming and going at once (16 kubelet callers): one claim's unprepare
    removing the emptied metadata directory must not pull it from under another claim's
    prepare that is making its directories in it."""
    import threading

    state = make(tmp_path, reader)
    names = device_names(snapshot(), "gpu-") + device_names(snapshot(), "cpu-")
    errors: list[str] = []

    def worker(k: int) -> None:
        device = names[k % len(names)]
        for i in range(20):
            c = reader.add(claim(f"u-{k}-{i}", [device], name=f"c-{k}-{i}", namespace="ml"))
            res = state.prepare([ref(c)])[f"u-{k}-{i}"]
            if res.error:
                errors.append(res.error)
            if state.unprepare([ref(c)])[f"u-{k}-{i}"]:
                errors.append("unprepare")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert tree(tmp_path) == [] and not meta_dir(tmp_path).exists()


def test_unprepare_waits_for_a_prepare_making_its_directories(
    tmp_path: Path, reader: FakeClaims, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race itself, made to happen: right after a prepare has made the metadata
    directory (and before its claim's directory in it), another claim's unprepare tries
    to remove the emptied metadata directory. It has to wait; without the lock the
    prepare failed with FileNotFoundError (seen at 16 callers in bench/kube_api.py)."""
    import threading
    import time

    g = device_names(snapshot(), "gpu-")
    state = make(tmp_path, reader)
    assert state.metadata is not None
    other = host_file(tmp_path, "ml", "gone", "req")
    real_mkdir = os.mkdir
    pruners: list[threading.Thread] = []

    def mkdir(path: Any, mode: int = 0o777, **kw: Any) -> None:
        real_mkdir(path, mode, **kw)
        if Path(path) == meta_dir(tmp_path) and not pruners:
            pruner = threading.Thread(target=state.metadata.prune, args=([other],))
            pruners.append(pruner)
            pruner.start()
            time.sleep(0.1)  # the unprepare's turn

    monkeypatch.setattr(os, "mkdir", mkdir)
    c = reader.add(claim(UID, g[:1], name="a", namespace="ml"))
    assert state.prepare([ref(c)])[UID].error == ""
    pruners[0].join(5)
    objects(host_file(tmp_path, "ml", "a", "req"))
