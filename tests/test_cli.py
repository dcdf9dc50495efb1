"""The CLI end to end: every fake machine and every hwloc dump through discover/slices/graph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from discovery.fake import list_machines
from discovery.schema import inventory_json_schema
from normalize.validation import validate_pool, validate_slice
from tests.conftest import hwloc_cases
from toposlice.cli import main

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "docs" / "schema"
MACHINES = ["cloud-vm-1gpu", "cpu-2s", "dgx-h100", "gb200-nvl72-tray", "mi300x-8"]
SLICE_FLAGS = [[], ["--numa-list", "--legacy-aliases"], ["--cpu-grouping", "l3"]]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def items(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of ``slices -o json``: a v1 List, as kubectl prints several."""
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List", doc.keys()
    items: list[dict[str, Any]] = doc["items"]
    return items


def check_slices(slices: list[dict[str, Any]], node: str) -> None:
    assert slices, "always at least one slice"
    assert validate_pool(slices) == []
    for s in slices:
        assert s["spec"]["nodeName"] == node
        assert validate_slice(s) == [], validate_slice(s)
        kubernetes_validate.validate(s, "1.37", strict=True)


def test_committed_inventory_schema_is_current() -> None:
    committed = json.loads((SCHEMAS / "inventory.schema.json").read_text())
    assert committed == inventory_json_schema(), "run hack/gen_schemas.py"


def test_ships_the_issue_machines() -> None:
    assert set(MACHINES) <= set(list_machines())


@pytest.mark.parametrize("machine", MACHINES)
def test_fake_machine_end_to_end(machine: str, capsys: pytest.CaptureFixture[str]) -> None:
    inv = json.loads(run(capsys, "discover", "--fake", machine, "-o", "json"))
    jsonschema.validate(inv, json.loads((SCHEMAS / "inventory.schema.json").read_text()))
    assert inv["source"] == {"fake": machine}
    assert all(p["state"] != "error" for p in inv["probes"]), inv["probes"]
    assert not inv["warnings"], inv["warnings"]

    for flags in SLICE_FLAGS:
        out = run(capsys, "slices", "--fake", machine, "--node-name", "node-a", *flags)
        check_slices(list(yaml.safe_load_all(out)), "node-a")

    graph = json.loads(run(capsys, "graph", "--fake", machine, "-o", "json"))
    jsonschema.validate(graph, json.loads((SCHEMAS / "graph.schema.json").read_text()))
    assert "X" in run(capsys, "graph", "--fake", machine) or (not inv["gpus"] and not inv["nics"])
    assert run(capsys, "graph", "--fake", machine, "-o", "dot").startswith(("graph", "digraph"))
    assert machine in run(capsys, "discover", "--fake", machine)


@pytest.mark.parametrize("case", hwloc_cases())
def test_hwloc_dump_end_to_end(
    case: str, hwloc_roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(hwloc_roots[case])
    inv = json.loads(run(capsys, "discover", "--sysfs-root", root, "-o", "json"))
    jsonschema.validate(inv, json.loads((SCHEMAS / "inventory.schema.json").read_text()))
    for flags in SLICE_FLAGS:
        out = run(capsys, "slices", "--sysfs-root", root, "--node-name", "n1", "-o", "json", *flags)
        check_slices(items(json.loads(out)), "n1")
    # The scoring view an independent checker feeds to fidelity_check.py.
    fid = json.loads(run(capsys, "discover", "--sysfs-root", root, "-o", "fidelity"))
    assert fid["schema"] == "topology-fidelity/v1"
    assert {d["bus_id"] for d in fid["pci_devices"]} == {d["bus_id"] for d in inv["pci_devices"]}


def test_inventory_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "inv.json"
    saved.write_text(run(capsys, "discover", "--fake", "dgx-h100", "-o", "json"))
    direct = run(capsys, "slices", "--fake", "dgx-h100", "--node-name", "n", "-o", "json")
    replay = run(capsys, "slices", "--inventory", str(saved), "--node-name", "n", "-o", "json")
    assert json.loads(direct) == json.loads(replay)
    g1 = run(capsys, "graph", "--fake", "dgx-h100", "-o", "json")
    g2 = run(capsys, "graph", "--inventory", str(saved), "-o", "json")
    assert json.loads(g1) == json.loads(g2)


def test_dgx_slices_carry_standard_attributes(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "slices", "--fake", "dgx-h100", "--node-name", "dgx", "-o", "json")
    devices = {d["name"]: d for s in items(json.loads(out)) for d in s["spec"]["devices"]}
    gpu0 = devices["gpu-0000-1b-00-0"]["attributes"]
    assert gpu0["resource.kubernetes.io/pciBusID"] == {"string": "0000:1b:00.0"}
    assert gpu0["resource.kubernetes.io/numaNode"] == {"int": 0}
    nic0 = devices["nic-0000-18-00-0"]["attributes"]
    # GPU0 and its compute NIC share a root complex: matchAttribute on pcieRoot pairs them.
    assert nic0["resource.kubernetes.io/pcieRoot"] == gpu0["resource.kubernetes.io/pcieRoot"]


def test_cloud_vm_omits_numa_node(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "slices", "--fake", "cloud-vm-1gpu", "--node-name", "vm", "-o", "json")
    slices = items(json.loads(out))
    gpus = [d for s in slices for d in s["spec"]["devices"] if d["name"].startswith("gpu")]
    assert len(gpus) == 1
    assert "resource.kubernetes.io/numaNode" not in gpus[0]["attributes"]
    assert "resource.kubernetes.io/pcieRoot" in gpus[0]["attributes"]


def test_errors_are_clear(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["discover", "--fake", "no-such-machine"]) == 2
    assert "no-such-machine" in capsys.readouterr().err
    bad = tmp_path / "inv.json"
    bad.write_text('{"schema": "something-else"}')
    assert main(["slices", "--inventory", str(bad)]) == 2
    assert "unsupported inventory schema" in capsys.readouterr().err
    # An empty root is not an error: it is an empty inventory with a warning.
    out = json.loads(run(capsys, "discover", "--sysfs-root", str(tmp_path), "-o", "json"))
    assert out["pci_devices"] == [] and out["warnings"]


def test_machines_lists_fake_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(MACHINES) <= set(run(capsys, "machines").split())


def test_root_flag_alias_and_host_root(
    hwloc_roots: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--root`` and its alias ``--sysfs-root`` read the same tree; without either,
    ``$HOST_ROOT`` (a container mounting the host at /host) is the root."""
    root = str(hwloc_roots[hwloc_cases()[0]])
    by_root = run(capsys, "discover", "--root", root, "-o", "json")
    assert run(capsys, "discover", "--sysfs-root", root, "-o", "json") == by_root
    monkeypatch.setenv("HOST_ROOT", root)
    assert run(capsys, "discover", "-o", "json") == by_root
    assert json.loads(by_root)["source"] == {"sysfs_root": root}


def test_invalid_host_name_asks_for_node_name(
    tmp_path: Path, hwloc_roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    root = tmp_path / "root"
    shutil.copytree(hwloc_roots[hwloc_cases()[0]], root, symlinks=True)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "hostname").write_text("GPU-Node-01\n")
    slices = items(json.loads(run(capsys, "slices", "--root", str(root), "-o", "json")))
    assert slices[0]["spec"]["pool"]["name"] == "gpu-node-01"
    (root / "etc" / "hostname").write_text("gpu_node!\n")
    assert main(["slices", "--root", str(root), "-o", "json"]) == 2
    assert "--node-name" in capsys.readouterr().err
