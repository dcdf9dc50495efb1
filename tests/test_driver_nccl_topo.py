"""The NCCL topology file: exactly the claim's GPUs and NICs, the host's switch tree, and
the spelling NCCL's own small parser needs."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from discovery.model import Inventory, NvLink
from discovery.readers import parse_cpumask
from driver.kubelet.state import ClaimRef
from normalize.nccl_topo import build_topology
from tests.driver_support import FakeClaims, claim, make_state, snapshot

_ATTR = re.compile(r'\s([A-Za-z_]+)="[^"]*"')


def check_nccl_syntax(text: str) -> None:
    """nccl-topology.md section 2: what NCCL's parser refuses or misreads."""
    assert "<?xml" not in text
    assert "\t" not in text
    assert " />" not in text
    for line in text.splitlines():
        stripped = line.strip()
        assert stripped.startswith("<") and stripped.endswith(">"), line
        assert stripped.count("<") == 1, f"one tag per line: {line}"
        assert " =" not in stripped and "= " not in stripped, line
        assert "  " not in stripped, f"double space between attributes: {line}"
        assert len(_ATTR.findall(stripped)) <= 16, line


def endpoints(root: ET.Element, class_prefix: str = "") -> list[str]:
    """Bus ids of non-switch pci elements (with a class prefix: of that class only)."""
    return [
        p.get("busid", "")
        for p in root.iter("pci")
        if p.get("class") != "0x060400" and p.get("class", "").startswith(class_prefix)
    ]


def parent_map(root: ET.Element) -> dict[ET.Element, ET.Element]:
    return {child: parent for parent in root.iter() for child in parent}


@pytest.mark.parametrize("machine", ["dgx-h100", "gb200-nvl72-tray", "mi300x-8", "cloud-vm-1gpu"])
def test_claim_subset(machine: str) -> None:
    inv = snapshot(machine).inventory
    gpus = sorted(inv.gpus, key=lambda g: g.bus_id)[::2][:3]
    nics = sorted(inv.nics, key=lambda n: n.bus_id)[-2:]
    text = build_topology(inv, gpus, nics, "claim-x")
    check_nccl_syntax(text)
    root = ET.fromstring(text)
    assert root.tag == "system" and root.get("version") == "1"
    want_nics = {n.bus_id[:-1] + "0" for n in nics}  # NCCL matches IB NICs at function 0
    assert sorted(endpoints(root)) == sorted({g.bus_id for g in gpus} | want_nics)
    assert set(endpoints(root, "0x02")) == want_nics
    assert len(list(root.iter())) <= 256
    parents = parent_map(root)
    for p in root.iter("pci"):
        assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", p.get("busid", ""))
    for gpu in gpus:
        el = next(p for p in root.iter("pci") if p.get("busid") == gpu.bus_id)
        chain = []
        node = parents[el]
        while node.tag == "pci":
            assert node.get("class") == "0x060400"
            chain.append(node.get("busid"))
            node = parents[node]
        assert node.tag == "cpu"
        # Every switch element is a bridge above the GPU in the host tree.
        pci = inv.pci(gpu.bus_id)
        assert pci is not None
        assert set(chain) <= set(pci.upstream_bridges)
        numa = pci.numa_node if pci.numa_node is not None else pci.locality_numa_node
        assert node.get("numaid") == str(-1 if numa is None else numa)
        numa_node = inv.numa(int(node.get("numaid", "-1")))
        if numa_node is not None and numa_node.cpus:
            assert parse_cpumask(node.get("affinity")) == sorted(numa_node.cpus)


def test_dgx_switch_tree_matches_nccl_dump_shape() -> None:
    """A DGX H100 GPU sits two Broadcom switch levels below its root port, as NCCL's own
    dumps show; its NVLinks go to the four NVSwitches."""
    inv = snapshot("dgx-h100").inventory
    gpu = min(inv.gpus, key=lambda g: g.bus_id)
    root = ET.fromstring(build_topology(inv, [gpu], [], "x"))
    parents = parent_map(root)
    el = next(p for p in root.iter("pci") if p.get("busid") == gpu.bus_id)
    depth = 0
    node = parents[el]
    while node.tag == "pci":
        depth += 1
        node = parents[node]
    assert depth == 2
    links = root.findall(".//gpu/nvlink")
    switches = {nv.bus_id for nv in inv.nvswitches}
    assert {nv.get("target") for nv in links} == switches
    assert all(nv.get("tclass") == "0x068000" for nv in links)
    assert sum(int(nv.get("count", "0")) for nv in links) == len(gpu.nvlinks)
    assert root.find(".//gpu").get("sm") == "90"  # type: ignore[union-attr]


def test_direct_nvlinks_only_to_claim_gpus() -> None:
    inv = Inventory.from_dict(snapshot("dgx-h100").inventory.to_dict())
    g0, g1, g2 = sorted(inv.gpus, key=lambda g: g.bus_id)[:3]
    g0.nvlinks = [
        NvLink(link=0, remote_bus_id=g1.bus_id.upper(), remote_type="gpu"),
        NvLink(link=1, remote_bus_id=g1.bus_id, remote_type="gpu"),
        NvLink(link=2, remote_bus_id=g2.bus_id, remote_type="gpu"),
    ]
    root = ET.fromstring(build_topology(inv, [g0, g1], [], "x"))
    el = next(p for p in root.iter("pci") if p.get("busid") == g0.bus_id)
    links = el.findall("gpu/nvlink")
    assert [(nv.get("target"), nv.get("count")) for nv in links] == [(g1.bus_id, "2")]
    assert links[0].get("tclass", "").startswith("0x03")


def test_whole_machine_fits_nccl_limits() -> None:
    for machine in ("dgx-h100", "gb200-nvl72-tray", "mi300x-8"):
        inv = snapshot(machine).inventory
        text = build_topology(inv, inv.gpus, inv.nics, "all")
        check_nccl_syntax(text)
        root = ET.fromstring(text)
        assert len(list(root.iter())) <= 256
        assert {g.bus_id for g in inv.gpus} <= set(endpoints(root))


def test_prepared_claim_mounts_its_own_topology(tmp_path: Path) -> None:
    snap = snapshot("dgx-h100")
    reader = FakeClaims()
    names = [d["name"] for d in snap.devices if d["name"].startswith(("gpu-", "nic-"))]
    picked = [names[1], names[5], names[-1]]
    reader.add(claim("u-1", picked))
    state = make_state(tmp_path, reader)
    assert state.prepare([ClaimRef("default", "claim-u-1", "u-1")])["u-1"].error == ""
    root = ET.fromstring(state.topo_path("u-1").read_text())
    by_name = {v: k.split(":", 1)[1] for k, v in snap.vertex_devices.items()}
    picked_bus = {by_name[n] for n in picked}
    got = set(endpoints(root))
    assert got == {b[:-1] + "0" for b in picked_bus}  # NICs at function 0
