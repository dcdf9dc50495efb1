"""Vendor CDI devices in a claim's answer (driver/kubelet/vendor_cdi.py, issue #21): lookup by UUID
and by NVML index, YAML and JSON specs, stale specs, a spec naming a node the host lacks,
two GPUs sharing one control node, the spec directories' priority and conflict rules, the
parse cache, the checkpoint, and the node's gap line."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from discovery.vendor_cdi import NVIDIA_KIND, SpecError, parse_spec, spec_dirs
from driver.kubelet import cdi
from driver.kubelet.checkpoint import ClaimRecord, PreparedDevice, load_checkpoint
from driver.kubelet.state import ClaimRef, DriverState
from driver.kubelet.vendor_cdi import VendorCdi
from tests import vendor_specs
from tests.driver_support import FakeClaims, claim, device_names, make_state, snapshot

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "tests" / "data" / "cdi-schema.json").read_text())
UID = "0b9e6c2a-5d1f-4c7e-9a33-2f0d1e7c8b11"


def gpu_names(n: int, machine: str = "dgx-h100") -> list[str]:
    return device_names(snapshot(machine), "gpu-")[:n]


def gpu_of(name: str, machine: str = "dgx-h100") -> Any:
    inv = snapshot(machine).inventory
    return next(
        g for g in inv.gpus if name == "gpu-" + g.bus_id.replace(":", "-").replace(".", "-")
    )


def setup(
    tmp: Path, spec: dict[str, Any] | None, file: str = "nvidia.yaml", machine: str = "dgx-h100"
) -> tuple[DriverState, FakeClaims, Path]:
    """A state whose spec dirs are ``<tmp>/etc-cdi`` and ``<tmp>/run-cdi`` (plus its
    cdi root); ``spec`` written to ``run-cdi/<file>``."""
    etc, run = tmp / "etc-cdi", tmp / "run-cdi"
    etc.mkdir(parents=True, exist_ok=True)
    run.mkdir(parents=True, exist_ok=True)
    if spec is not None:
        vendor_specs.write(run / file, spec)
    vendor = VendorCdi(
        spec_dirs([str(etc), str(run)], str(tmp / "cdi")),
        tmp / "root",
        own_prefixes=("k8s.toposlice.dev-", "toposlice.dev-"),
    )
    reader = FakeClaims()
    state = make_state(tmp, reader, machine=machine, vendor_cdi=vendor)
    return state, reader, run


def prepare(state: DriverState, reader: FakeClaims, devices: list[str], uid: str = UID) -> Any:
    c = reader.add(claim(uid, devices))
    res = state.prepare([ClaimRef("default", c["metadata"]["name"], uid)])[uid]
    assert res.error == ""
    return res


def own_spec(state: DriverState, uid: str = UID) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(state.spec_path(uid).read_text())
    jsonschema.validate(data, SCHEMA)
    return data


def own_nodes(spec: dict[str, Any]) -> list[str]:
    return [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


@pytest.mark.parametrize("file", ["nvidia.yaml", "nvidia.json"])
def test_uuid_id_first_and_no_node_named_twice(tmp_path: Path, file: str) -> None:
    """Two GPUs: each answers ``nvidia.com/gpu=GPU-<uuid>`` then toposlice's id; the GPUs'
    nodes and the control nodes they share (top level of the vendor spec, added once)
    are left out of toposlice's spec, which keeps the environment and the NCCL file."""
    inv = snapshot().inventory
    state, reader, _ = setup(tmp_path, vendor_specs.nvidia_ctk_spec(inv), file)
    names = gpu_names(2)
    res = prepare(state, reader, names)
    for dev, name in zip(res.devices, names, strict=True):
        gpu = gpu_of(name)
        assert dev.cdi_ids == (
            f"{NVIDIA_KIND}={gpu.uuid}",
            cdi.qualified("k8s.toposlice.dev/claim", f"{UID}-{name}"),
        )
        assert dev.vendor_cdi_ids == (f"{NVIDIA_KIND}={gpu.uuid}",)
        assert state.vendor_cdi is not None and state.vendor_cdi.resolves(dev.cdi_ids[0])
    spec = own_spec(state)
    assert own_nodes(spec) == []  # all of them come from the vendor's edits
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert env["NCCL_TOPO_FILE"] and env["TOPOSLICE_GPU_UUIDS"]
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the vendor's "void" stands
    assert spec["containerEdits"]["mounts"][0]["hostPath"] == str(state.topo_path(UID))
    # What the runtime would apply for this container: every node once.
    vendor = state.vendor_cdi.registry() if state.vendor_cdi else None
    assert vendor is not None
    applied: list[str] = []
    seen_specs: set[str] = set()
    for dev in res.devices:
        spec_file, vname = vendor.devices[dev.cdi_ids[0]]
        if spec_file.path not in seen_specs:
            seen_specs.add(spec_file.path)
            applied += [n["path"] for n in spec_file.common["deviceNodes"]]
        applied += [n["path"] for n in spec_file.devices[vname]["deviceNodes"]]
    applied += own_nodes(spec)
    assert sorted(applied) == sorted(set(applied))
    assert applied.count("/dev/nvidiactl") == 1
    # Recorded: a restarted driver answers the same ids from the checkpoint.
    claims, status = load_checkpoint(state.checkpoint_path, state.boot_id)
    assert status == "ok" and claims[UID].devices == res.devices


def test_a_gpu_without_a_vendor_device_keeps_its_own_nodes(tmp_path: Path) -> None:
    """Only the second GPU is in the vendor spec: the first keeps its node and the control
    nodes (a container given only its request still gets them), and the claim keeps
    NVIDIA_VISIBLE_DEVICES (not every GPU is covered)."""
    inv = snapshot().inventory
    names = gpu_names(2)
    spec = vendor_specs.nvidia_ctk_spec(inv)
    first = gpu_of(names[0])
    spec["devices"] = [
        d for d in spec["devices"] if d["name"] not in (first.uuid, str(first.index), "all")
    ]
    state, reader, _ = setup(tmp_path, spec)
    res = prepare(state, reader, names)
    assert len(res.devices[0].cdi_ids) == 1 and res.devices[0].vendor_cdi_ids == ()
    assert res.devices[1].cdi_ids[0] == f"{NVIDIA_KIND}={gpu_of(names[1]).uuid}"
    mine = own_spec(state)
    by_name = {d["name"]: d["containerEdits"] for d in mine["devices"]}
    first_nodes = {n["path"] for n in by_name[f"{UID}-{names[0]}"]["deviceNodes"]}
    assert {f"/dev/nvidia{first.minor}", "/dev/nvidiactl"} <= first_nodes
    assert "deviceNodes" not in by_name[f"{UID}-{names[1]}"]
    env = dict(e.split("=", 1) for e in mine["containerEdits"]["env"])
    assert "NVIDIA_VISIBLE_DEVICES" in env
    gap = state.vendor_cdi.gap(inv) if state.vendor_cdi else None
    assert gap is not None and gap.missing == 1 and "stale" in gap.message


def test_lookup_by_nvml_index_when_the_spec_names_no_uuids(tmp_path: Path) -> None:
    inv = snapshot().inventory
    spec = vendor_specs.nvidia_ctk_spec(inv, names=("index",))
    state, reader, _ = setup(tmp_path, spec)
    name = gpu_names(1)[0]
    res = prepare(state, reader, [name])
    assert res.devices[0].cdi_ids[0] == f"{NVIDIA_KIND}={gpu_of(name).index}"


def test_an_index_whose_node_is_another_gpus_is_not_used(tmp_path: Path) -> None:
    """NVML order may differ from ours: index 0 pointing at /dev/nvidia5 is stale."""
    inv = snapshot().inventory
    spec = vendor_specs.nvidia_ctk_spec(inv, names=("index",))
    for d in spec["devices"]:
        if d["name"] != "all":
            d["containerEdits"] = {"deviceNodes": [{"path": "/dev/nvidia7"}]}
    state, reader, _ = setup(tmp_path, spec)
    name = next(n for n in gpu_names(8) if gpu_of(n).minor != 7)
    res = prepare(state, reader, [name])
    assert res.devices[0].vendor_cdi_ids == ()
    assert state.vendor_cdi is not None
    assert "stale" in state.vendor_cdi.find(inv, gpu_of(name)).problem


def test_stale_spec_prepare_succeeds_without_vendor_id(tmp_path: Path) -> None:
    """A spec generated on another machine (other UUIDs): nothing of it is used; the gap
    names it stale for every GPU with its kernel driver bound."""
    other = snapshot("pcie-8gpu").inventory
    state, reader, _ = setup(tmp_path, vendor_specs.nvidia_ctk_spec(other))
    names = gpu_names(2)
    res = prepare(state, reader, names)
    assert all(d.vendor_cdi_ids == () and len(d.cdi_ids) == 1 for d in res.devices)
    assert "/dev/nvidiactl" in own_nodes(own_spec(state))
    inv = snapshot().inventory
    assert state.vendor_cdi is not None
    gap = state.vendor_cdi.gap(inv)
    assert gap.missing == 8
    assert "nvidia.com/gpu spec is stale" in gap.message and "8 of 8 GPU(s)" in gap.message


def test_no_spec_at_all_is_the_gap(tmp_path: Path) -> None:
    state, reader, run = setup(tmp_path, None)
    res = prepare(state, reader, gpu_names(1))
    assert len(res.devices[0].cdi_ids) == 1
    assert state.vendor_cdi is not None
    gap = state.vendor_cdi.gap(snapshot().inventory)
    assert gap.missing == 8 and f"no nvidia.com/gpu spec in {tmp_path / 'etc-cdi'}" in gap.message
    assert "CUDA fails at cuInit" in gap.message
    # The spec appears (the toolkit's refresh service ran): found without a restart.
    vendor_specs.write(run / "nvidia.yaml", vendor_specs.nvidia_ctk_spec(snapshot().inventory))
    assert state.vendor_cdi.gap(snapshot().inventory).missing == 0


def test_a_gpu_with_no_kernel_driver_bound_is_no_gap(tmp_path: Path) -> None:
    """vfio-pci (passthrough) or no driver: no vendor spec is expected for it."""
    import copy

    inv = copy.deepcopy(snapshot().inventory)
    for gpu in inv.gpus:
        pci = inv.pci(gpu.bus_id)
        assert pci is not None
        pci.driver = "vfio-pci"
    state, _, _ = setup(tmp_path, None)
    assert state.vendor_cdi is not None and state.vendor_cdi.gap(inv).missing == 0


def test_a_spec_naming_a_node_the_host_lacks_is_not_used(tmp_path: Path) -> None:
    """The runtime stats every node given by path only; one missing on the host refuses
    the container. Fully specified nodes (type and numbers) are created instead."""
    inv = snapshot().inventory
    spec = vendor_specs.nvidia_ctk_spec(
        inv, control_nodes=("/dev/nvidiactl", "/dev/nvidia-modeset")
    )
    state, reader, run = setup(tmp_path, spec)
    name = gpu_names(1)[0]
    res = prepare(state, reader, [name])
    assert res.devices[0].vendor_cdi_ids == ()
    assert state.vendor_cdi is not None
    gap = state.vendor_cdi.gap(inv)
    assert "names /dev/nvidia-modeset, which the host lacks" in gap.message
    spec["containerEdits"]["deviceNodes"][1].update({"type": "c", "major": 195, "minor": 254})
    vendor_specs.write(run / "nvidia.yaml", spec)
    state.unprepare([ClaimRef("default", f"claim-{UID}", UID)])
    res = prepare(state, reader, [name], uid="b-2")
    assert res.devices[0].vendor_cdi_ids == (f"{NVIDIA_KIND}={gpu_of(name).uuid}",)


def test_dev_root_host_paths_are_checked_under_the_host_dev(tmp_path: Path) -> None:
    """``hostPath`` under another dev root (a driver container's) is not under /dev: the
    plugin cannot see it and takes it as present."""
    inv = snapshot().inventory
    spec = vendor_specs.nvidia_ctk_spec(inv, dev_root="/run/nvidia/driver")
    state, reader, _ = setup(tmp_path, spec)
    res = prepare(state, reader, gpu_names(1))
    assert res.devices[0].vendor_cdi_ids


def test_amd_found_by_render_node(tmp_path: Path) -> None:
    inv = snapshot("mi300x-8").inventory
    state, reader, _ = setup(tmp_path, vendor_specs.amd_ctk_spec(inv), "amd.json", "mi300x-8")
    names = gpu_names(2, "mi300x-8")
    res = prepare(state, reader, names)
    ids = [d.cdi_ids[0] for d in res.devices]
    assert all(i.startswith("amd.com/gpu=") for i in ids) and len(set(ids)) == 2
    assert own_nodes(own_spec(state)) == []  # kfd and render nodes come from amd-ctk's
    # Without amd-ctk's spec nothing is missing (ROCm's user space is in the image and
    # toposlice's spec names the nodes): no gap, only no vendor id.
    bare, reader, _ = setup(tmp_path / "bare", None, machine="mi300x-8")
    res = prepare(bare, reader, names)
    assert all(len(d.cdi_ids) == 1 for d in res.devices)
    assert {"/dev/kfd"} < set(own_nodes(own_spec(bare)))
    assert bare.vendor_cdi is not None and bare.vendor_cdi.gap(inv).missing == 0


def test_later_directory_wins_and_same_directory_conflicts_drop_both(tmp_path: Path) -> None:
    inv = snapshot().inventory
    name = gpu_names(1)[0]
    gpu = gpu_of(name)
    state, reader, run = setup(tmp_path, None)
    assert state.vendor_cdi is not None
    good = vendor_specs.nvidia_ctk_spec(inv)
    stale = vendor_specs.nvidia_ctk_spec(inv)
    for d in stale["devices"]:
        d["containerEdits"] = {"deviceNodes": [{"path": "/dev/nvidia-gone"}]}
    vendor_specs.write(tmp_path / "etc-cdi" / "nvidia.yaml", stale)
    vendor_specs.write(run / "nvidia.yaml", good)  # /var/run/cdi wins over /etc/cdi
    assert state.vendor_cdi.find(inv, gpu).device is not None
    vendor_specs.write(run / "nvidia-copy.json", good)  # same directory: both dropped
    found = state.vendor_cdi.find(inv, gpu)
    assert found.device is None
    errors = state.vendor_cdi.errors()
    assert any("conflicting device" in e for e in errors.values())
    assert str(run / "nvidia.yaml") in errors and str(run / "nvidia-copy.json") in errors
    res = prepare(state, reader, [name])
    assert res.devices[0].vendor_cdi_ids == ()


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda s: s.update(extra=1), "unknown field 'extra'"),
        (lambda s: s.update(cdiVersion="0.3.0"), "must be at least v0.5.0"),
        (lambda s: s.update(cdiVersion="9.9.9"), "invalid cdiVersion"),
        (lambda s: s.update(kind="nvidia.com"), "invalid CDI kind"),
        (lambda s: s["devices"][0].update(name="bad name"), "invalid CDI device name"),
        (lambda s: s["devices"][0].update(containerEdits={}), "empty device edits"),
        (lambda s: s["devices"].append(dict(s["devices"][0])), "duplicate device"),
        (lambda s: s["containerEdits"]["env"].append("=x"), "invalid environment variable"),
        (lambda s: s.update(devices=[]), "no devices"),
    ],
)
def test_a_spec_the_runtime_refuses_is_skipped(tmp_path: Path, edit: Any, problem: str) -> None:
    spec = vendor_specs.nvidia_ctk_spec(snapshot().inventory)
    edit(spec)
    with pytest.raises(SpecError, match=problem):
        parse_spec(json.dumps(spec).encode(), "x.json")
    state, reader, run = setup(tmp_path, spec)
    assert state.vendor_cdi is not None
    assert problem in state.vendor_cdi.errors()[str(run / "nvidia.yaml")]
    assert prepare(state, reader, gpu_names(1)).devices[0].vendor_cdi_ids == ()


def test_yaml_names_must_be_strings(tmp_path: Path) -> None:
    """``name: 0`` unquoted is a number in YAML; the Go library refuses it (nvidia-ctk
    quotes it)."""
    text = (
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n"
        "devices:\n- name: 0\n  containerEdits:\n    env: [A=1]\n"
    )
    with pytest.raises(SpecError, match="not a string"):
        parse_spec(text.encode(), "nvidia.yaml")


def test_specs_are_parsed_once_and_again_on_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = snapshot().inventory
    state, reader, run = setup(tmp_path, vendor_specs.nvidia_ctk_spec(inv))
    calls: list[str] = []
    real = VendorCdi._read

    def counting(path: str, priority: int) -> Any:
        calls.append(path)
        return real(path, priority)

    monkeypatch.setattr(VendorCdi, "_read", staticmethod(counting))
    for i in range(5):
        prepare(state, reader, gpu_names(1), uid=f"u-{i}")
        state.unprepare([ClaimRef("default", f"claim-u-{i}", f"u-{i}")])
    assert calls == [str(run / "nvidia.yaml")]  # toposlice's own spec files are not read
    other = vendor_specs.nvidia_ctk_spec(snapshot("pcie-8gpu").inventory)
    path = vendor_specs.write(run / "nvidia.yaml", other)
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    res = prepare(state, reader, gpu_names(1), uid="u-9")
    assert res.devices[0].vendor_cdi_ids == () and len(calls) == 2


def test_restart_answers_the_same_ids_and_reprepares_when_the_id_is_gone(
    tmp_path: Path,
) -> None:
    inv = snapshot().inventory
    state, reader, run = setup(tmp_path, vendor_specs.nvidia_ctk_spec(inv))
    names = gpu_names(2)
    first = prepare(state, reader, names)
    again, reader2, _ = setup(tmp_path, None)  # same dirs and checkpoint: a restart
    reader2.claims = reader.claims
    res = again.prepare([ClaimRef("default", f"claim-{UID}", UID)])[UID]
    assert res.devices == first.devices
    (run / "nvidia.yaml").unlink()  # regenerated without them (or removed)
    res = again.prepare([ClaimRef("default", f"claim-{UID}", UID)])[UID]
    assert res.error == "" and all(d.vendor_cdi_ids == () for d in res.devices)


def test_checkpoint_field_is_additive() -> None:
    """Records without vendor ids serialize exactly as before; old records load."""
    old = {
        "request_names": ["r"],
        "pool": "n1",
        "device": "gpu-0",
        "cdi_ids": ["k8s.toposlice.dev/claim=u-gpu-0"],
        "share_id": None,
        "admin_access": False,
    }
    dev = PreparedDevice.from_dict(old)
    assert dev.vendor_cdi_ids == () and dev.to_dict() == old
    new = PreparedDevice.from_dict({**old, "vendor_cdi_ids": ["nvidia.com/gpu=GPU-1"]})
    assert new.to_dict()["vendor_cdi_ids"] == ["nvidia.com/gpu=GPU-1"]
    rec = ClaimRecord("u", "ns", "n", "PrepareCompleted", (new,))
    assert ClaimRecord.from_dict(rec.as_dict) == rec


def test_spec_dirs_default_and_dedup(tmp_path: Path) -> None:
    assert spec_dirs(None, "/var/run/cdi") == ("/etc/cdi", "/var/run/cdi")
    assert spec_dirs(None, str(tmp_path)) == ("/etc/cdi", "/var/run/cdi", str(tmp_path))
    assert spec_dirs([str(tmp_path), "/etc/cdi"], "/etc/cdi") == (str(tmp_path), "/etc/cdi")


def test_daemon_says_the_gap_once_per_node(tmp_path: Path) -> None:
    """No vendor spec on a node whose GPUs have their kernel driver bound: one Warning
    Event on the Node, the gauge, /readyz ``degraded:``, however many rediscoveries and
    prepares; the spec appearing clears it (gauge 0, readyz plain ok)."""
    import copy
    import urllib.request

    from driver.daemon import Daemon
    from driver.kubelet.vendor_cdi import EVENT_REASON
    from tests.kubeapi import KubeAPIServer
    from tests.kubelet import register, wait_for
    from tests.test_driver_daemon import DRIVER, NODE, config
    from tests.test_nvml_gap import _readyz

    inv = snapshot().inventory
    run = tmp_path / "run-cdi"
    run.mkdir()
    with KubeAPIServer() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        cfg = config(tmp_path, kubeconfig, http_addr="127.0.0.1:0")
        cfg = dataclasses.replace(cfg, cdi_spec_dirs=(str(run), cfg.cdi_root))
        daemon = Daemon(cfg, lambda: copy.deepcopy(inv))
        daemon.start()
        try:

            def events() -> list[dict[str, Any]]:
                found = api.store.select("events", "default", None, None)[0]
                return [e for e in found if e["reason"] == EVENT_REASON]

            def metric() -> str:
                with urllib.request.urlopen(f"{daemon.http.url}/metrics", timeout=5) as resp:
                    text = resp.read().decode()
                return next(
                    line
                    for line in text.splitlines()
                    if line.startswith("toposlice_vendor_cdi_missing_gpus ")
                )

            assert wait_for(events, timeout=10)
            (ev,) = events()
            assert ev["type"] == "Warning" and ev["involvedObject"]["name"] == NODE
            assert "no vendor CDI device for 8 of 8 GPU(s)" in ev["message"]
            assert daemon.status().details["degraded"] == ev["message"]
            daemon.rediscover()
            daemon.rediscover()
            assert len(events()) == 1
            assert metric() == "toposlice_vendor_cdi_missing_gpus 8.0"
            register(tmp_path / "reg" / f"{DRIVER}-reg.sock")
            assert wait_for(lambda: _readyz(daemon), timeout=10)
            assert _readyz(daemon) == f"ok, degraded: {ev['message']}\n"
            # Nodes under a driver container's dev root: not looked up in this host's /dev.
            spec = vendor_specs.nvidia_ctk_spec(inv, dev_root="/run/nvidia/driver")
            vendor_specs.write(run / "nvidia.yaml", spec)
            daemon.rediscover()
            assert metric() == "toposlice_vendor_cdi_missing_gpus 0.0"
            assert "degraded" not in daemon.status().details and _readyz(daemon) == "ok\n"
            assert len(events()) == 1
        finally:
            daemon.stop(grace=0)


def test_gpus_toposlice_does_not_publish_need_no_vendor_device(tmp_path: Path) -> None:
    """Beside NVIDIA's DRA driver (``--publish nic,cpu``, or GPUs left to it): that driver
    writes its CDI spec per claim, so no gap, no Event, gauge 0."""
    import copy

    from driver.daemon import Daemon
    from driver.kubelet.vendor_cdi import EVENT_REASON
    from tests.kubeapi import KubeAPIServer
    from tests.test_driver_daemon import NODE, config

    inv = snapshot().inventory
    with KubeAPIServer() as api:
        api.add_node(NODE)
        cfg = config(tmp_path, api.write_kubeconfig(tmp_path / "kubeconfig"))
        cfg = dataclasses.replace(cfg, publish=frozenset({"nic", "cpu"}))
        daemon = Daemon(cfg, lambda: copy.deepcopy(inv))
        daemon.start()
        try:
            assert daemon.vendor_cdi_gap == ""
            daemon.rediscover()
            assert daemon.vendor_cdi_gap == "" and "degraded" not in daemon.status().details
            found = api.store.select("events", "default", None, None)[0]
            assert not [e for e in found if e["reason"] == EVENT_REASON]
        finally:
            daemon.stop(grace=0)
