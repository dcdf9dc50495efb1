"""``toposlice nccl-topo``: the file claims get, checked against the graph's relations.

NCCL derives its path classes from the tree (nccl-topology.md section 6): endpoints under
one switch element (or one element: functions of one device) are PIX, crossing two or
more switch elements PXB, through a ``cpu`` element PHB, across ``cpu`` elements SYS;
NVLink counts to NVSwitches add up over the one merged NVS node. The relation matrix
(``toposlice graph``) has two finer classes NCCL's format cannot hold, so the comparison
projects them: NODE (another host bridge of the same NUMA node) is PHB for NCCL, and SYS
between devices whose kernel NUMA node is the same (other PCI domain, or a GPU whose own
memory node differs: GB200) is PHB too. Every other class must be equal, pair by pair.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from discovery.fake import list_machines
from discovery.model import Gpu, Inventory, Nic
from driver.kubelet.state import ClaimRef
from normalize.cpugroups import device_numa
from normalize.nccl_topo import nccl_bus_id, nic_bus_id
from normalize.relations import (
    matrix_nics,
    numa_identity,
    ordered_gpus,
    pcie_relation,
    relation_matrix,
)
from tests.driver_support import NODE, FakeClaims, claim, make_state, snapshot
from tests.test_driver_nccl_topo import check_nccl_syntax
from toposlice.cli import main
from toposlice.sources import add_source_args, load_inventory

SWITCH = "0x060400"


def run_cli(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def implied_paths(root: ET.Element) -> dict[str, tuple[ET.Element, ET.Element, list[ET.Element]]]:
    """Endpoint bus id -> (its element, its cpu element, switch elements above it, top first)."""
    parents = {child: parent for parent in root.iter() for child in parent}
    out = {}
    for el in root.iter("pci"):
        if el.get("class") == SWITCH:
            continue
        chain = []
        node = parents[el]
        while node.tag == "pci":
            chain.append(node)
            node = parents[node]
        assert node.tag == "cpu"
        out[el.get("busid", "")] = (el, node, chain[::-1])
    return out


def implied_class(
    paths: dict[str, tuple[ET.Element, ET.Element, list[ET.Element]]], a: str, b: str
) -> str:
    el_a, cpu_a, sw_a = paths[a]
    el_b, cpu_b, sw_b = paths[b]
    if el_a is el_b:
        return "PIX"
    if cpu_a is not cpu_b:
        return "SYS"
    common = 0
    while common < min(len(sw_a), len(sw_b)) and sw_a[common] is sw_b[common]:
        common += 1
    if common == 0:
        return "PHB"
    return "PIX" if len(sw_a) == len(sw_b) == common else "PXB"


def implied_nvlinks(root: ET.Element, a: str, b: str) -> int:
    """NVLinks of A to B plus min(A's, B's) links into the merged NVSwitch node."""

    def links(bus: str) -> tuple[dict[str, int], int]:
        el = next(p for p in root.iter("pci") if p.get("busid") == bus)
        direct: dict[str, int] = {}
        switch = 0
        for nv in el.findall("gpu/nvlink"):
            if nv.get("tclass") == "0x068000":
                switch += int(nv.get("count", "0"))
            else:
                direct[nv.get("target", "")] = direct.get(nv.get("target", ""), 0) + int(
                    nv.get("count", "0")
                )
        return direct, switch

    da, sa = links(a)
    _db, sb = links(b)
    return da.get(b, 0) + (min(sa, sb) if sa and sb else 0)


def nccl_projection(inv: Inventory, a: Gpu | Nic, b: Gpu | Nic) -> str:
    """The graph's PCIe class of A and B on NCCL's scale (module docstring)."""
    pa, pb = inv.pci(a.bus_id), inv.pci(b.bus_id)
    cls = pcie_relation(
        a.bus_id,
        pa,
        numa_identity(pa, a if isinstance(a, Gpu) else None),
        b.bus_id,
        pb,
        numa_identity(pb, b if isinstance(b, Gpu) else None),
    )
    if cls in ("PIX", "PXB", "PHB"):
        return cls
    if cls == "NODE":
        return "PHB"
    na = device_numa(pa) if pa is not None else None
    nb = device_numa(pb) if pb is not None else None
    return "PHB" if (-1 if na is None else na) == (-1 if nb is None else nb) else "SYS"


def endpoint_id(dev: Gpu | Nic) -> str:
    bus = nccl_bus_id(dev.bus_id)
    assert bus is not None
    return nic_bus_id(bus, dev.is_vf) if isinstance(dev, Nic) else bus


def check_relations(inv: Inventory, text: str) -> int:
    """Every GPU/NIC pair of the matrix: the file's class equals the projected graph
    class, and NV<n> equals the file's NVLink count. Returns the pairs checked."""
    check_nccl_syntax(text)
    root = ET.fromstring(text)
    paths = implied_paths(root)
    matrix = relation_matrix(inv)
    devices: list[Gpu | Nic] = [*ordered_gpus(inv), *matrix_nics(inv)]
    assert matrix.bus_ids == [d.bus_id for d in devices]
    checked = 0
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            if i == j:
                continue
            ea, eb = endpoint_id(a), endpoint_id(b)
            graph = matrix.matrix[i][j]
            if graph.startswith("NV"):
                assert implied_nvlinks(root, ea, eb) == int(graph[2:]), (a.bus_id, b.bus_id)
            assert implied_class(paths, ea, eb) == nccl_projection(inv, a, b), (
                a.bus_id,
                b.bus_id,
                graph,
            )
            checked += 1
    return checked


@pytest.mark.parametrize("machine", list_machines())
def test_whole_node_relations_equal_the_graph(machine: str) -> None:
    text = run_cli(["nccl-topo", "--fake", machine])
    inv = snapshot(machine).inventory
    pairs = check_relations(inv, text)
    n = len(ordered_gpus(inv)) + len(matrix_nics(inv))
    assert pairs == n * (n - 1)


def test_hwloc_dumps_with_gpus(hwloc_roots: dict[str, Path]) -> None:
    checked = 0
    for _case, root in sorted(hwloc_roots.items()):
        p = argparse.ArgumentParser()
        add_source_args(p)
        inv = load_inventory(p.parse_args(["--sysfs-root", str(root)]))
        if not inv.gpus:
            continue
        text = run_cli(["-q", "nccl-topo", "--sysfs-root", str(root)])
        check_relations(inv, text)
        checked += 1
    assert checked >= 1  # nvidiagpunumanodes holds six GPUs


def test_projection_is_only_lossy_where_nccl_cannot_tell() -> None:
    """On the DGX the graph has NODE pairs (other root complexes of one socket) and the
    file shows PHB; PIX/PXB/SYS pairs are kept exactly."""
    inv = snapshot("dgx-h100").inventory
    matrix = relation_matrix(inv)
    seen = {c for row in matrix.matrix for c in row}
    assert {"NODE", "PXB", "SYS"} <= seen
    root = ET.fromstring(run_cli(["nccl-topo", "--fake", "dgx-h100"]))
    paths = implied_paths(root)
    devices: list[Gpu | Nic] = [*ordered_gpus(inv), *matrix_nics(inv)]
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            graph = matrix.matrix[i][j]
            if i != j and graph in ("PIX", "PXB", "SYS"):
                assert implied_class(paths, endpoint_id(a), endpoint_id(b)) == graph


def test_subset_by_label_name_and_bus_id_is_what_a_claim_gets(tmp_path: Path) -> None:
    """One writer: the command's output for a claim's devices is byte for byte the file
    the CDI prepare path writes for that claim."""
    snap = snapshot("dgx-h100")
    names = [d["name"] for d in snap.devices if d["name"].startswith(("gpu-", "nic-"))]
    picked = [names[1], names[5], names[-1]]
    reader = FakeClaims()
    reader.add(claim("u-1", picked))
    state = make_state(tmp_path, reader)
    assert state.prepare([ClaimRef("default", "claim-u-1", "u-1")])["u-1"].error == ""
    prepared = state.topo_path("u-1").read_text()
    base = ["nccl-topo", "--fake", "dgx-h100", "--node-name", NODE, "--name", "claim-u-1"]
    assert run_cli([*base, "--devices", ",".join(picked)]) == prepared
    by_name = {v: k.split(":", 1)[1] for k, v in snap.vertex_devices.items()}
    buses = ",".join(by_name[n].upper() for n in picked)
    assert run_cli([*base, "--devices", buses]) == prepared
    out = tmp_path / "topo.xml"
    run_cli([*base, "--devices", ",".join(picked), "--output-file", str(out)])
    assert out.read_text() == prepared


def test_labels_follow_toposlice_graph(capsys: pytest.CaptureFixture[str]) -> None:
    inv = snapshot("dgx-h100").inventory
    root = ET.fromstring(run_cli(["nccl-topo", "--fake", "dgx-h100", "--devices", "GPU0,nic3"]))
    gpu0 = ordered_gpus(inv)[0].bus_id
    nic3 = endpoint_id(matrix_nics(inv)[3])
    assert sorted(implied_paths(root)) == sorted({gpu0, nic3})
    assert main(["nccl-topo", "--fake", "dgx-h100", "--devices", "GPU99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'GPU99' is not a GPU or NIC of this node" in err[0]
