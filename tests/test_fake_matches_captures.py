"""Each GPU fake machine reproduces its captured topology matrix cell for cell.

The captures are copied as data into tests/data/topo/ from
../shared/reference/real-machines.md; the fake machines were built from them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from discovery.readers import format_cpulist
from normalize.graph import build_graph
from normalize.relations import relation_matrix
from toposlice.discover import discover

DATA = Path(__file__).parent / "data" / "topo"


def parse_nvidia_smi(text: str) -> tuple[list[str], dict[tuple[str, str], str], dict[str, str]]:
    """(labels, {(row, col): cell}, NIC legend) from ``nvidia-smi topo -m`` output."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    header = lines[0].split()
    labels = [h for h in header if h.startswith(("GPU", "NIC")) and h[3:].isdigit()]
    cells: dict[tuple[str, str], str] = {}
    legend: dict[str, str] = {}
    for line in lines[1:]:
        tokens = line.split()
        if tokens and tokens[0] in labels:
            for col, cell in zip(labels, tokens[1 : 1 + len(labels)], strict=True):
                cells[(tokens[0], col)] = cell
        elif len(tokens) == 2 and tokens[0].rstrip(":") in labels:
            legend[tokens[0].rstrip(":")] = tokens[1]
    return labels, cells, legend


@pytest.mark.parametrize("machine", ["dgx-h100", "gb200-nvl72-tray"])
def test_nvidia_smi_matrix_cell_for_cell(machine: str) -> None:
    labels, cells, legend = parse_nvidia_smi((DATA / f"{machine}.txt").read_text())
    assert len(cells) == len(labels) ** 2
    rel = relation_matrix(discover(fake=machine))
    assert rel.labels == labels
    for nic, rdma in legend.items():
        assert rel.legend[nic] == rdma
    mismatches = [
        f"{a}->{b}: captured {want}, got {rel.relation(a, b)}"
        for (a, b), want in cells.items()
        if rel.relation(a, b) != want
    ]
    assert not mismatches, "\n".join(mismatches)


def gpu_affinity_columns(text: str) -> dict[str, list[str]]:
    """GPU row -> [CPU Affinity, NUMA Affinity, GPU NUMA ID] (when the capture has them)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    n = len([h for h in lines[0].split() if h.startswith(("GPU", "NIC")) and h[3:].isdigit()])
    out = {}
    for line in lines[1:]:
        tokens = line.split()
        if tokens and tokens[0].startswith("GPU"):
            out[tokens[0]] = tokens[1 + n :]
    return out


@pytest.mark.parametrize("machine", ["dgx-h100", "gb200-nvl72-tray"])
def test_affinity_columns(machine: str) -> None:
    captured = gpu_affinity_columns((DATA / f"{machine}.txt").read_text())
    rel = relation_matrix(discover(fake=machine))
    for label, (cpus, numa, gpu_numa) in captured.items():
        i = rel.labels.index(label)
        assert rel.cpu_affinity[i] == cpus, label
        assert ("N/A" if rel.gpu_numa_id[i] is None else str(rel.gpu_numa_id[i])) == gpu_numa
        # On GB200 nvidia-smi's NUMA Affinity also lists the socket's empty placeholder
        # nodes ("0,3-9,11-17"); the scalar is the CPU node the kernel gives.
        assert format_cpulist(rel.numa_affinity_nodes[i]) == numa, label
        assert str(rel.numa_affinity[i]) == numa.split(",")[0].split("-")[0], label


def test_dgx_h100_gpu_is_pxb_not_pix_to_its_own_nic() -> None:
    rel = relation_matrix(discover(fake="dgx-h100"))
    assert rel.relation("GPU0", "NIC0") == "PXB"
    assert rel.legend["NIC0"] == "mlx5_0"


def _amd_tables(text: str) -> dict[str, dict[tuple[str, str], str]]:
    """``amd-smi topology`` tables: {"WEIGHT": {(row bdf, col bdf): cell}, ...}."""
    tables: dict[str, dict[tuple[str, str], str]] = {}
    name: str | None = None
    cols: list[str] = []
    for line in text.splitlines():
        if line.endswith(" TABLE:"):
            name, cols = line[: -len(" TABLE:")].strip(), []
            tables[name] = {}
        elif name is not None and not cols and line.strip().startswith("0000:"):
            cols = line.split()
        elif name is not None and cols and line.startswith("0000:"):
            tokens = line.split()
            for col, cell in zip(cols, tokens[1:], strict=True):
                tables[name][(tokens[0], col)] = cell
    return {k: v for k, v in tables.items() if v}


def test_mi300x_amd_smi_topology_cell_for_cell() -> None:
    tables = _amd_tables((DATA / "mi300x-8.txt").read_text())
    assert {"ACCESS", "WEIGHT", "HOPS", "LINK TYPE", "NUMA BW"} <= set(tables)
    inv = discover(fake="mi300x-8")
    rel = relation_matrix(inv)
    graph = build_graph(inv)
    edges = {
        frozenset((e["source"][4:], e["target"][4:])): e["attrs"]
        for e in graph["edges"]
        if e["kind"] == "xgmi"
    }
    by_bus = dict(zip(rel.bus_ids, rel.labels, strict=True))
    for (a, b), link_type in tables["LINK TYPE"].items():
        ours = rel.relation(by_bus[a], by_bus[b])
        assert {"SELF": "X", "XGMI": "XGMI"}[link_type] == ours, (a, b)
        if a == b:
            assert tables["WEIGHT"][(a, b)] == "0" and tables["HOPS"][(a, b)] == "0"
            continue
        attrs = edges[frozenset((a, b))]
        assert str(attrs["weight"]) == tables["WEIGHT"][(a, b)], (a, b)
        assert str(attrs["hops"]) == tables["HOPS"][(a, b)], (a, b)
        bw = f"{attrs['min_bandwidth_mbps']}-{attrs['max_bandwidth_mbps']}"
        assert bw == tables["NUMA BW"][(a, b)], (a, b)
        assert tables["ACCESS"][(a, b)] == "ENABLED"


def test_cloud_vm_gpu_has_no_numa_but_a_root() -> None:
    inv = discover(fake="cloud-vm-1gpu")
    (gpu,) = inv.gpus
    dev = inv.pci(gpu.bus_id)
    assert dev is not None and dev.numa_node is None and dev.pcie_root == "pci0000:00"
    assert relation_matrix(inv).labels[0] == "GPU0"
