from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from discovery.model import Inventory
from normalize.graph import build_graph
from normalize.options import NormalizeOptions
from normalize.slices import build_slices
from tests.inventories import amd, dgx, gb200, snc
from toposlice.render import graph_table, graph_to_dot

SCHEMA = json.loads(
    (Path(__file__).resolve().parent.parent / "docs/schema/graph.schema.json").read_text()
)


def _validate(graph: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(json.dumps(graph)))


@pytest.mark.parametrize("make", [dgx, gb200, amd, snc, Inventory])
def test_graph_validates_against_schema(make: Any) -> None:
    _validate(build_graph(make()))
    _validate(build_graph(make(), NormalizeOptions(cpu_grouping="l3")))


def _edges(g: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in g["edges"] if e["kind"] == kind]


def test_dgx_graph_shape() -> None:
    g = build_graph(dgx())
    ids = {v["id"]: v for v in g["vertices"]}
    assert g["schema"] == "toposlice.graph/v1" and g["node"] == "dgx-01"
    for vid in ("machine", "package:0", "numa:1", "pcie_root:pci0000:17", "bridge:0000:17:01.0"):
        assert vid in ids
    assert ids["gpu:0000:1a:00.0"]["label"] == "GPU0"
    assert ids["gpu:0000:1a:00.0"]["attrs"]["dra_device"] == "gpu-0000-1a-00-0"
    assert ids["cpu_group:cpu-numa0"]["attrs"]["dra_device"] == "cpu-numa0"
    pcie = {(e["source"], e["target"]): e["attrs"] for e in _edges(g, "pcie")}
    assert ("pcie_root:pci0000:17", "bridge:0000:17:01.0") in pcie
    leaf = pcie[("bridge:0000:19:00.0", "gpu:0000:1a:00.0")]
    assert leaf["gen"] == 5 and leaf["width"] == 16
    assert leaf["bandwidth_gbps"] == pytest.approx(63.015, abs=0.01)
    nv = [e for e in _edges(g, "nvlink") if e["source"] == "gpu:0000:1a:00.0"]
    assert {e["target"] for e in nv} == {f"nvswitch:0000:0{k}:00.0" for k in range(5, 9)}
    assert sum(e["attrs"]["links"] for e in nv) == 18
    assert nv[0]["attrs"]["bandwidth_gbps"] == pytest.approx(nv[0]["attrs"]["links"] * 25.0)
    assert nv[0]["attrs"]["version"] == "4.0.0"
    dist = _edges(g, "numa_distance")
    assert dist == [
        {"source": "numa:0", "target": "numa:1", "kind": "numa_distance", "attrs": {"distance": 21}}
    ]
    attach = {(e["source"], e["target"]) for e in _edges(g, "attach")}
    assert ("pcie_root:pci0000:99", "numa:1") in attach
    contains = {(e["source"], e["target"]) for e in _edges(g, "contains")}
    assert {
        ("machine", "package:0"),
        ("package:0", "numa:0"),
        ("numa:0", "cpu_group:cpu-numa0"),
    } <= contains
    assert g["relations"]["labels"] == [d["label"] for d in g["devices"]]
    assert g["relations"]["matrix"][0][1] == "NV18"


def test_dra_names_join_with_slices() -> None:
    inv = gb200()
    g = build_graph(inv)
    published = {d["name"] for s in build_slices(inv, "n") for d in s["spec"]["devices"]}
    in_graph = {v["attrs"]["dra_device"] for v in g["vertices"] if "dra_device" in v["attrs"]}
    assert in_graph == published


def test_only_bridges_on_device_paths() -> None:
    inv = dgx()
    from discovery.model import PciDevice

    inv.pci_devices.append(PciDevice(bus_id="0000:70:01.0", is_bridge=True, pcie_root="pci0000:70"))
    inv.pci_devices.append(
        PciDevice(
            bus_id="0000:71:00.0",
            class_code="0x0108",
            pcie_root="pci0000:70",
            upstream_bridges=["0000:70:01.0"],
        )
    )
    g = build_graph(inv)
    ids = {v["id"] for v in g["vertices"]}
    assert "bridge:0000:70:01.0" not in ids and "pcie_root:pci0000:70" not in ids


def test_gb200_memory_and_amd_xgmi_edges() -> None:
    g = build_graph(gb200())
    assert ("gpu:0008:01:00.0", "numa:2") in {
        (e["source"], e["target"]) for e in _edges(g, "memory")
    }
    assert any(v["id"] == "nvswitch:fabric" for v in g["vertices"])
    g = build_graph(amd())
    assert len(_edges(g, "xgmi")) == 28  # 8 GPUs all-to-all
    assert g["relations"]["matrix"][0][1] == "XGMI"


def test_table_and_dot() -> None:
    g = build_graph(dgx())
    table = graph_table(g)
    assert "GPU0\t X \tNV18" in table
    assert "gpu-0000-1a-00-0" in table and "cpu-numa1" in table
    dot = graph_to_dot(g)
    assert dot.startswith('digraph "dgx-01" {') and dot.rstrip().endswith("}")
    assert '"gpu:0000:1a:00.0"' in dot and "NV" in dot
    assert "(no relation matrix: no GPUs or RDMA NICs" in graph_table(build_graph(Inventory()))
