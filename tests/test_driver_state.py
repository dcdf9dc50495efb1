"""DriverState: prepare/unprepare semantics, CDI specs, checkpoint, crash repair, concurrency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from driver.kubelet import cdi
from driver.kubelet.checkpoint import load_checkpoint
from driver.kubelet.container_edits import NCCL_TOPO_CONTAINER_PATH
from driver.kubelet.state import ClaimRef, DriverState
from tests.driver_support import (
    FakeClaims,
    claim,
    device_names,
    make_state,
    snapshot,
)

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "tests" / "data" / "cdi-schema.json").read_text())


class SimulatedCrash(BaseException):
    """Stands for kill -9: not an Exception, so no cleanup path catches it."""


def crash_at(step: str) -> Callable[[str], None]:
    def fail_point(at: str) -> None:
        if at == step:
            raise SimulatedCrash(at)

    return fail_point


def ref(obj: dict[str, Any], uid: str | None = None) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], uid or meta["uid"])


def gpus(n: int = 2, machine: str = "dgx-h100") -> list[str]:
    return device_names(snapshot(machine), "gpu-")[:n]


def nics(n: int = 1, machine: str = "dgx-h100") -> list[str]:
    return device_names(snapshot(machine), "nic-")[:n]


def disk(state: DriverState) -> dict[str, list[str]]:
    """Everything the state owns on disk (temp files included)."""
    return {
        "cdi": sorted(os.listdir(state.cdi_root)),
        "topo": sorted(os.listdir(state.topo_dir)),
    }


def load_spec(state: DriverState, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(state.spec_path(uid).read_text())
    return data


@pytest.fixture
def reader() -> FakeClaims:
    return FakeClaims()


def test_prepare_writes_valid_spec_defining_every_cdi_id(
    tmp_path: Path, reader: FakeClaims
) -> None:
    c = reader.add(claim("0b9e6c2a-5d1f-4c7e-9a33-2f0d1e7c8b11", gpus(2) + nics(1)))
    state = make_state(tmp_path, reader)
    res = state.prepare([ref(c)])[c["metadata"]["uid"]]
    assert res.error == ""
    assert [d.device for d in res.devices] == gpus(2) + nics(1)
    uid = c["metadata"]["uid"]
    assert disk(state) == {"cdi": [f"k8s.toposlice.dev-claim_{uid}.json"], "topo": [f"{uid}.xml"]}
    spec = load_spec(state, uid)
    jsonschema.validate(spec, SCHEMA)
    # A name starting with a digit needs cdiVersion >= 0.5.0; nothing here needs more.
    assert spec["cdiVersion"] == "0.5.0"
    defined = {cdi.qualified(spec["kind"], d["name"]) for d in spec["devices"]}
    returned = {i for d in res.devices for i in d.cdi_ids}
    assert returned <= defined and returned
    for d in spec["devices"]:
        assert any(d["containerEdits"].values())
    common = spec["containerEdits"]
    env = dict(e.split("=", 1) for e in common["env"])
    assert env["NCCL_TOPO_FILE"] == NCCL_TOPO_CONTAINER_PATH
    assert common["mounts"][0]["hostPath"] == str(state.topo_path(uid))
    inv = snapshot().inventory
    gpu_objs = [
        g for g in inv.gpus if f"gpu-{g.bus_id.replace(':', '-').replace('.', '-')}" in gpus(2)
    ]
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == [g.uuid for g in gpu_objs]
    nic_obj = next(
        n for n in inv.nics if n.bus_id.replace(":", "-").replace(".", "-") in nics(1)[0]
    )
    assert env["NCCL_IB_HCA"] == "=" + ",".join(nic_obj.rdma_devices)
    nodes = {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
    assert {f"/dev/nvidia{g.minor}" for g in gpu_objs} | {"/dev/nvidiactl"} <= nodes
    assert any(p.startswith("/dev/infiniband/uverbs") for p in nodes)
    assert "annotations" not in spec  # every node exists: nothing left out


def test_spec_names_only_device_nodes_that_exist(tmp_path: Path, reader: FakeClaims) -> None:
    """containerd refuses a container whose CDI device node is missing on the host
    ("failed to stat CDI host device"): fake devices have none, so their specs must name
    none; a real node missing one (e.g. nvidia-uvm not loaded) names the rest."""
    c = reader.add(claim("f-1", gpus(2) + nics(1)))
    state = make_state(tmp_path / "fake", reader, dev_nodes=False)
    assert state.prepare([ref(c)])["f-1"].error == ""
    spec = load_spec(state, "f-1")
    jsonschema.validate(spec, SCHEMA)
    assert all("deviceNodes" not in d["containerEdits"] for d in spec["devices"])
    assert all(d["containerEdits"]["env"] for d in spec["devices"])
    omitted = spec["annotations"]["toposlice.dev/omitted-device-nodes"].split(",")
    assert "/dev/nvidiactl" in omitted and any("uverbs" in p for p in omitted)
    assert spec["cdiVersion"] == "0.6.0"  # spec annotations need 0.6.0
    assert "NCCL_TOPO_FILE" in "".join(spec["containerEdits"]["env"])

    partial = make_state(tmp_path / "partial", reader)
    (partial.dev_root / "dev/nvidia-uvm-tools").unlink()
    assert partial.prepare([ref(c)])["f-1"].error == ""
    spec = load_spec(partial, "f-1")
    nodes = {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
    assert "/dev/nvidia-uvm-tools" not in nodes and "/dev/nvidiactl" in nodes
    assert spec["annotations"] == {"toposlice.dev/omitted-device-nodes": "/dev/nvidia-uvm-tools"}


def test_repeated_prepare_returns_same_ids_and_one_file(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    state = make_state(tmp_path, reader)
    first = state.prepare([ref(c)])["u-1"]
    mtime = state.spec_path("u-1").stat().st_mtime_ns
    second = state.prepare([ref(c), ref(c)])["u-1"]
    assert first == second and first.error == ""
    assert state.spec_path("u-1").stat().st_mtime_ns == mtime
    assert disk(state)["cdi"] == [state.spec_path("u-1").name]
    # A restarted driver answers the same from its checkpoint.
    again = make_state(tmp_path, reader).prepare([ref(c)])["u-1"]
    assert again == first


def test_unprepare_removes_files_and_unknown_claim_succeeds(
    tmp_path: Path, reader: FakeClaims
) -> None:
    c = reader.add(claim("u-1", gpus(1) + nics(1)))
    state = make_state(tmp_path, reader)
    state.prepare([ref(c)])
    assert state.prepared_devices() == {gpus(1)[0]: "u-1", nics(1)[0]: "u-1"}
    errors = state.unprepare([ref(c), ClaimRef("default", "never", "u-unknown")])
    assert errors == {"u-1": "", "u-unknown": ""}
    assert disk(state) == {"cdi": [], "topo": []}
    assert state.prepared_devices() == {}
    assert load_checkpoint(state.checkpoint_path, state.boot_id)[0] == {}
    assert state.unprepare([ref(c)]) == {"u-1": ""}


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("uid-mismatch", "claim got replaced"),
        ("missing", "not found"),
        ("other-pool", "is not in this node's pool"),
        ("unknown-device", "is not in pool"),
        ("not-allocated", "not allocated"),
        ("api-error", "reading the ResourceClaim failed"),
        ("bad-uid", "invalid claim UID"),
    ],
)
def test_bad_claims_are_per_claim_errors_and_leave_nothing(
    tmp_path: Path, reader: FakeClaims, case: str, expect: str
) -> None:
    good = reader.add(claim("good", gpus(1)))
    uid = "bad"
    if case == "uid-mismatch":
        bad = reader.add(claim("other-uid", gpus(1)[1:] or nics(1), name="bad"))
    elif case == "missing":
        bad = claim(uid, nics(1))
    elif case == "other-pool":
        bad = reader.add(claim(uid, [nics(1)[0]], pool="n2"))
    elif case == "unknown-device":
        bad = reader.add(claim(uid, [nics(1)[0], "gpu-0000-ff-00-0"]))
    elif case == "not-allocated":
        bad = reader.add(claim(uid, nics(1), allocated=False))
    elif case == "bad-uid":
        bad = reader.add(claim("../../etc", nics(1)))
        uid = "../../etc"
    else:
        bad = reader.add(claim(uid, nics(1)))
    state = make_state(tmp_path, reader)
    if case == "api-error":
        reader.error = RuntimeError("connection refused")
        res = state.prepare([ref(bad, uid)])
        reader.error = None
        res.update(state.prepare([ref(good)]))
    else:
        res = state.prepare([ref(bad, uid), ref(good)])
    assert expect in res[uid].error, res[uid].error
    assert res[uid].devices == ()
    assert res["good"].error == ""
    assert disk(state) == {"cdi": [state.spec_path("good").name], "topo": ["good.xml"]}
    assert set(state.claims()) == {"good"}


def test_claims_of_other_drivers_are_ignored(tmp_path: Path, reader: FakeClaims) -> None:
    other = {"request": "x", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}
    c = reader.add(claim("u-1", nics(1), extra_results=[other]))
    res = make_state(tmp_path, reader).prepare([ref(c)])["u-1"]
    assert [d.device for d in res.devices] == nics(1)


def test_a_claim_gone_from_the_api_gives_its_devices_up(tmp_path: Path, reader: FakeClaims) -> None:
    """Pod and claim deleted together: the scheduler hands the GPU to a new claim before
    the kubelet unprepared the old one. The old record goes, files and all; while the old
    claim is still there, the new one is refused as before."""
    a = reader.add(claim("a", gpus(1)))
    b = reader.add(claim("b", gpus(1)))
    state = make_state(tmp_path, reader)
    assert state.prepare([ref(a)])["a"].error == ""
    assert "already prepared" in state.prepare([ref(b)])["b"].error
    del reader.claims[("default", "claim-a")]
    assert state.prepare([ref(b)])["b"].error == ""
    assert set(state.claims()) == {"b"}
    assert disk(state) == {"cdi": [state.spec_path("b").name], "topo": ["b.xml"]}
    assert state.unprepare([ref(a)])["a"] == ""  # the kubelet's late unprepare: a no-op


def test_device_prepared_for_another_claim_is_refused_unless_shared(
    tmp_path: Path, reader: FakeClaims
) -> None:
    a = reader.add(claim("a", gpus(1)))
    b = reader.add(claim("b", gpus(1)))
    state = make_state(tmp_path, reader)
    assert state.prepare([ref(a)])["a"].error == ""
    assert "already prepared for claim default/claim-a" in state.prepare([ref(b)])["b"].error
    shared = reader.add(
        claim(
            "c",
            [],
            extra_results=[
                {
                    "request": "r",
                    "driver": "toposlice.dev",
                    "pool": "n1",
                    "device": gpus(1)[0],
                    "adminAccess": True,
                }
            ],
        )
    )
    assert state.prepare([ref(shared)])["c"].error == ""


def test_subrequest_names_are_reduced_to_the_request(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim("u-1", nics(1), request="net/fast"))
    res = make_state(tmp_path, reader).prepare([ref(c)])["u-1"]
    assert res.devices[0].request_names == ("net",)


def test_cpu_only_claim_has_no_topology_file(tmp_path: Path, reader: FakeClaims) -> None:
    cpu = device_names(snapshot(), "cpu-")[:1]
    c = reader.add(claim("u-cpu", cpu))
    state = make_state(tmp_path, reader)
    assert state.prepare([ref(c)])["u-cpu"].error == ""
    assert disk(state)["topo"] == []
    spec = load_spec(state, "u-cpu")
    jsonschema.validate(spec, SCHEMA)
    assert "mounts" not in spec["containerEdits"]


def test_amd_gpus_get_kfd_and_render_nodes(tmp_path: Path, reader: FakeClaims) -> None:
    names = gpus(2, "mi300x-8")
    c = reader.add(claim("u-amd", names))
    state = make_state(tmp_path, reader, machine="mi300x-8")
    assert state.prepare([ref(c)])["u-amd"].error == ""
    spec = load_spec(state, "u-amd")
    jsonschema.validate(spec, SCHEMA)
    for dev in spec["devices"]:
        paths = [n["path"] for n in dev["containerEdits"]["deviceNodes"]]
        assert paths[0] == "/dev/kfd" and paths[1].startswith("/dev/dri/renderD")
    renders = {d["containerEdits"]["deviceNodes"][1]["path"] for d in spec["devices"]}
    assert len(renders) == 2


def test_concurrent_calls(tmp_path: Path, reader: FakeClaims) -> None:
    snap = snapshot()
    names = [d["name"] for d in snap.devices]
    claims = [reader.add(claim(f"c{i:02d}", [names[i]])) for i in range(16)]
    # Two claims want one device: exactly one of them may win.
    claims.append(reader.add(claim("dup", [names[0]])))
    state = make_state(tmp_path, reader)
    results: dict[str, str] = {}
    barrier = threading.Barrier(len(claims))

    def run(c: dict[str, Any]) -> None:
        barrier.wait()
        for _ in range(3):
            out = state.prepare([ref(c)])
            results.update({k: v.error for k, v in out.items()})

    threads = [threading.Thread(target=run, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [u for u in ("c00", "dup") if results[u] == ""]
    assert len(winners) == 1
    assert all(results[f"c{i:02d}"] == "" for i in range(1, 16))
    recorded = load_checkpoint(state.checkpoint_path, state.boot_id)[0]
    assert set(recorded) == {f"c{i:02d}" for i in range(1, 16)} | set(winners)
    assert len(disk(state)["cdi"]) == 16
    assert all(r.state == "PrepareCompleted" for r in recorded.values())

    def unrun(c: dict[str, Any]) -> None:
        state.unprepare([ref(c)])

    threads = [threading.Thread(target=unrun, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert disk(state) == {"cdi": [], "topo": []}
    assert load_checkpoint(state.checkpoint_path, state.boot_id)[0] == {}


@pytest.mark.parametrize("step", ["intent", "topology", "spec"])
def test_crash_during_prepare_is_repaired_by_the_next_call(
    tmp_path: Path, reader: FakeClaims, step: str
) -> None:
    c = reader.add(claim("u-1", gpus(2) + nics(1)))
    expected = make_state(tmp_path / "ref", reader).prepare([ref(c)])["u-1"]

    with pytest.raises(SimulatedCrash):
        make_state(tmp_path, reader, fail_point=crash_at(step)).prepare([ref(c)])
    # The checkpoint is written once per prepare, at the commit: the crash left no record
    # of u-1, only files named after its UID, which the restart removes as orphans.
    assert "u-1" not in load_checkpoint(tmp_path / "state/checkpoint.json", "boot-1")[0]
    restarted = make_state(tmp_path, reader)
    assert disk(restarted) == {"cdi": [], "topo": []}
    again = restarted.prepare([ref(c)])["u-1"]
    assert again.error == ""
    assert [d.cdi_ids for d in again.devices] == [d.cdi_ids for d in expected.devices]
    assert disk(restarted) == {"cdi": [restarted.spec_path("u-1").name], "topo": ["u-1.xml"]}
    assert restarted.claims()["u-1"].state == "PrepareCompleted"


@pytest.mark.parametrize("step", ["intent", "topology", "spec"])
def test_crash_with_an_intent_on_disk_is_repaired_by_the_next_call(
    tmp_path: Path, reader: FakeClaims, step: str
) -> None:
    """Another claim's commit writes the checkpoint while u-1 is half-way: u-1 reaches the
    disk as ``PrepareStarted``; after the crash its files are kept and completed."""
    c = reader.add(claim("u-1", gpus(2) + nics(1)))
    expected = make_state(tmp_path / "ref", reader).prepare([ref(c)])["u-1"]
    holder: list[DriverState] = []

    def other_commits_then_crash(at: str) -> None:
        if at != step or len(holder) > 1:
            return  # the other claim's own steps pass
        holder.append(holder[0])
        state = holder[0]
        other = next(
            f"u-{i}"
            for i in range(2, 200)
            if state._claim_lock(f"u-{i}") is not state._claim_lock("u-1")
        )
        o = reader.add(claim(other, gpus(4)[3:]))
        assert state.prepare([ref(o)])[other].error == ""
        raise SimulatedCrash(at)

    holder.append(make_state(tmp_path, reader, fail_point=other_commits_then_crash))
    with pytest.raises(SimulatedCrash):
        holder[0].prepare([ref(c)])
    assert load_checkpoint(tmp_path / "state/checkpoint.json", "boot-1")[0]["u-1"].state == (
        "PrepareStarted"
    )
    restarted = make_state(tmp_path, reader)
    again = restarted.prepare([ref(c)])["u-1"]
    assert again.error == ""
    assert [d.cdi_ids for d in again.devices] == [d.cdi_ids for d in expected.devices]
    assert restarted.spec_path("u-1").name in disk(restarted)["cdi"]
    assert "u-1.xml" in disk(restarted)["topo"]
    assert restarted.claims()["u-1"].state == "PrepareCompleted"


def test_crash_during_prepare_of_a_vanished_claim_leaves_nothing(
    tmp_path: Path, reader: FakeClaims
) -> None:
    c = reader.add(claim("u-1", gpus(1)))

    with pytest.raises(SimulatedCrash):
        make_state(tmp_path, reader, fail_point=crash_at("spec")).prepare([ref(c)])
    reader.claims.clear()
    restarted = make_state(tmp_path, reader)
    assert "not found" in restarted.prepare([ref(c)])["u-1"].error
    assert disk(restarted) == {"cdi": [], "topo": []}
    assert restarted.claims() == {}


def test_crash_during_unprepare_is_repaired(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    make_state(tmp_path, reader).prepare([ref(c)])

    with pytest.raises(SimulatedCrash):
        make_state(tmp_path, reader, fail_point=crash_at("unprepare-files")).unprepare([ref(c)])
    restarted = make_state(tmp_path, reader)
    # The record survived; its files are gone, so it is not reported as prepared twice.
    assert restarted.unprepare([ref(c)]) == {"u-1": ""}
    assert disk(restarted) == {"cdi": [], "topo": []}
    assert restarted.claims() == {}


def test_crash_after_unprepare_files_then_prepare_rewrites(
    tmp_path: Path, reader: FakeClaims
) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    first = make_state(tmp_path, reader).prepare([ref(c)])["u-1"]

    with pytest.raises(SimulatedCrash):
        make_state(tmp_path, reader, fail_point=crash_at("unprepare-files")).unprepare([ref(c)])
    restarted = make_state(tmp_path, reader)
    assert restarted.prepare([ref(c)])["u-1"] == first
    assert restarted.spec_path("u-1").exists() and restarted.topo_path("u-1").exists()


_KILL_SCRIPT = """
import os, signal, sys
from collections.abc import Callable
from pathlib import Path
from tests.driver_support import FakeClaims, claim, make_state
from driver.kubelet.state import ClaimRef
reader = FakeClaims()
c = reader.add(claim("u-kill", sys.argv[2].split(",")))
def die(step):
    if step == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)
state = make_state(Path(sys.argv[1]), reader, fail_point=die)
state.prepare([ClaimRef("default", "claim-u-kill", "u-kill")])
"""


@pytest.mark.parametrize("step", ["topology", "spec"])
def test_kill_9_during_prepare(tmp_path: Path, reader: FakeClaims, step: str) -> None:
    devices = gpus(1) + nics(1)
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT, str(tmp_path), ",".join(devices), step],
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    c = reader.add(claim("u-kill", devices))
    state = make_state(tmp_path, reader)
    res = state.prepare([ref(c)])["u-kill"]
    assert res.error == ""
    spec = load_spec(state, "u-kill")
    assert {i for d in res.devices for i in d.cdi_ids} == {
        cdi.qualified(spec["kind"], d["name"]) for d in spec["devices"]
    }
    assert disk(state) == {"cdi": [state.spec_path("u-kill").name], "topo": ["u-kill.xml"]}


def test_restart_removes_orphans_and_temp_files_only_of_this_driver(
    tmp_path: Path, reader: FakeClaims
) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    state = make_state(tmp_path, reader)
    state.prepare([ref(c)])
    orphan = state.spec_path("u-orphan")
    orphan.write_text("{}")
    temp = state.cdi_root / f".{state.spec_path('u-2').name}.abc123.tmp"
    temp.write_text("half")
    (state.topo_dir / "u-orphan.xml").write_text("<system/>")
    foreign = [state.cdi_root / "nvidia.com-gpu.yaml", state.cdi_root / ".other.tmp"]
    for f in foreign:
        f.write_text("x")
    restarted = make_state(tmp_path, reader)
    assert sorted(disk(restarted)["cdi"]) == sorted(
        [state.spec_path("u-1").name, "nvidia.com-gpu.yaml", ".other.tmp"]
    )
    assert disk(restarted)["topo"] == ["u-1.xml"]


def test_corrupt_checkpoint_is_set_aside_and_files_kept(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    state = make_state(tmp_path, reader)
    first = state.prepare([ref(c)])["u-1"]
    raw = state.checkpoint_path.read_bytes()
    state.checkpoint_path.write_bytes(raw.replace(b"PrepareCompleted", b"PrepareCompletex"))
    restarted = make_state(tmp_path, reader)
    assert restarted.load_status == "corrupt"
    assert (tmp_path / "state/checkpoint.json.corrupt").exists()
    assert restarted.spec_path("u-1").exists()  # a restarting container may still need it
    assert restarted.prepare([ref(c)])["u-1"] == first
    assert make_state(tmp_path, reader).load_status == "ok"


def test_checksum_detects_a_changed_value(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    state = make_state(tmp_path, reader)
    state.prepare([ref(c)])
    doc = json.loads(state.checkpoint_path.read_text())
    doc["data"]["claims"]["u-1"]["namespace"] = "evil"
    state.checkpoint_path.write_text(json.dumps(doc))
    assert load_checkpoint(state.checkpoint_path, "boot-1") == ({}, "corrupt")


def test_reboot_discards_checkpoint_and_stale_specs(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    make_state(tmp_path, reader, boot_id="boot-1").prepare([ref(c)])
    rebooted = make_state(tmp_path, reader, boot_id="boot-2")
    assert rebooted.load_status == "rebooted"
    assert rebooted.claims() == {}
    assert disk(rebooted) == {"cdi": [], "topo": []}
    assert rebooted.prepare([ref(c)])["u-1"].error == ""
    assert make_state(tmp_path, reader, boot_id="boot-2").load_status == "ok"


def test_spec_missing_on_disk_is_rewritten(tmp_path: Path, reader: FakeClaims) -> None:
    c = reader.add(claim("u-1", gpus(1)))
    state = make_state(tmp_path, reader)
    first = state.prepare([ref(c)])["u-1"]
    state.spec_path("u-1").unlink()
    assert state.prepare([ref(c)])["u-1"] == first
    assert state.spec_path("u-1").exists()


def test_min_cdi_version() -> None:
    kind = cdi.kind_for("toposlice.dev")
    assert cdi.build_spec(kind, {"a": {"env": ["A=1"]}})["cdiVersion"] == "0.3.0"
    assert cdi.build_spec(kind, {"1a": {"env": ["A=1"]}})["cdiVersion"] == "0.5.0"
    mounts = {"mounts": [{"hostPath": "/x", "containerPath": "/y", "type": "bind"}]}
    assert cdi.build_spec(kind, {"a": mounts})["cdiVersion"] == "0.4.0"
    with pytest.raises(ValueError, match="empty containerEdits"):
        cdi.build_spec(kind, {"a": {"env": []}})
    with pytest.raises(ValueError, match="invalid CDI device name"):
        cdi.build_spec(kind, {"a/b": {"env": ["A=1"]}})
    with pytest.raises(ValueError, match="invalid CDI kind"):
        cdi.check_kind("9vendor/claim")


def test_only_the_checkpoint_is_fsynced_unless_state_can_outlive_a_reboot(
    tmp_path: Path, reader: FakeClaims, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    c = reader.add(claim("u-1", gpus(1)))
    state = make_state(tmp_path / "a", reader)
    assert state.sync is False
    synced.clear()
    state.prepare([ref(c)])
    # One checkpoint write per prepare: its temp file fsynced before the rename. Not the
    # directory, nor the spec and topology files: only a power loss could lose them, and
    # that is a reboot, which discards them with the checkpoint.
    assert len(synced) == 1 and Path(synced[0]).name.startswith(".checkpoint.json."), synced
    synced.clear()
    state.unprepare([ref(c)])
    assert len(synced) == 1 and Path(synced[0]).name.startswith(".checkpoint.json."), synced
    unknown_boot = make_state(tmp_path / "b", reader, boot_id=None)
    assert unknown_boot.sync is True
    synced.clear()
    unknown_boot.prepare([ref(c)])
    # topology, spec, checkpoint, and their directories (the renames must survive too)
    assert len(synced) >= 4
    assert str(unknown_boot.state_dir) in synced and str(unknown_boot.cdi_root) in synced


def test_topology_text_reused_across_claims_equals_a_fresh_build(
    tmp_path: Path, reader: FakeClaims
) -> None:
    """The NCCL file of a claim whose devices an earlier claim had comes from the cached
    text with its own name, byte for byte what a driver with no cache writes."""
    devices = gpus(2) + nics(1)
    a = reader.add(claim("u-a", devices))
    b = reader.add(claim("u-b", devices))
    warm = make_state(tmp_path / "warm", reader)
    warm.prepare([ref(a)])
    warm.unprepare([ref(a)])
    assert not warm.prepare([ref(b)])["u-b"].error
    cold = make_state(tmp_path / "cold", reader)
    assert not cold.prepare([ref(b)])["u-b"].error
    text = warm.topo_path("u-b").read_text()
    assert text == cold.topo_path("u-b").read_text()
    assert 'name="claim-u-b"' in text and "u-a" not in text


def test_releasing_a_stale_claim_of_the_same_lock_stripe_does_not_hang(
    tmp_path: Path, reader: FakeClaims, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim locks are striped by the UID's hash: the stale claim and the new one may
    share a stripe (1 in 64, a different 1 in 64 every process). Releasing it then used to
    take the held lock again and hang the prepare for ever."""
    import threading

    import driver.kubelet.state as state_mod

    a = reader.add(claim("a", gpus(1)))
    b = reader.add(claim("b", gpus(1)))
    state = make_state(tmp_path, reader)
    one = threading.Lock()
    monkeypatch.setattr(state, "_claim_lock", lambda _uid: one)  # every claim on one stripe
    assert state.prepare([ref(a)])["a"].error == ""
    del reader.claims[("default", "claim-a")]
    out: dict[str, str] = {}
    t = threading.Thread(
        target=lambda: out.update(b=state.prepare([ref(b)])["b"].error), daemon=True
    )
    t.start()
    t.join(10)
    assert not t.is_alive(), "prepare hung on its own claim lock"
    assert out == {"b": ""} and set(state.claims()) == {"b"}

    # A stripe another call holds is waited for at most STALE_LOCK_S: then the record
    # stays and this prepare is refused (the kubelet retries), instead of waiting for ever.
    c = reader.add(claim("c", gpus(1)))
    del reader.claims[("default", "claim-b")]
    monkeypatch.setattr(state_mod, "STALE_LOCK_S", 0.2)
    busy = threading.Lock()
    locks = {"b": busy}
    monkeypatch.setattr(state, "_claim_lock", lambda uid: locks.get(uid, one))
    with busy:
        assert "already prepared" in state.prepare([ref(c)])["c"].error
    assert state.prepare([ref(c)])["c"].error == ""  # free again: released, then prepared
