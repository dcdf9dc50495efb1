"""GPU↔NIC alignment: the published nicAffinity / rail attributes, and the scorer's NIC
assignment, which must be optimal (checked against an independent exhaustive search)."""

from __future__ import annotations

import functools
import itertools

import pytest

from normalize.alignment import CLOSE, alignment
from normalize.relations import relation
from scorer.bandwidth import NIC_PATH_DERATE
from scorer.claim import pair_attribute
from scorer.score import _nic_rank, assign_nics, optimal_assignment
from scorer.topology import GpuView, NicView, NodeTopology
from tests.scorer_support import gpu_machines, machine
from toposlice.discover import discover


def _attrs(m: str) -> dict[str, dict[str, dict[str, object]]]:
    out = {}
    for sl in machine(m).slices:
        for d in sl["spec"]["devices"]:
            out[d["name"]] = d["attributes"]
    return out


def test_nic_affinity_groups_on_the_shipped_machines() -> None:
    pcie = _attrs("pcie-8gpu")
    # Two GPUs behind one switch share that switch's NIC: one group of three.
    group = pcie["gpu-0000-18-00-0"]["nicAffinity"]
    assert pcie["gpu-0000-19-00-0"]["nicAffinity"] == group
    assert pcie["nic-0000-1a-00-0"]["nicAffinity"] == group
    assert pcie["gpu-0000-3a-00-0"]["nicAffinity"] != group
    assert pcie["gpu-0000-19-00-0"]["rail"] == pcie["nic-0000-1a-00-0"]["rail"] == {"int": 0}
    mi = _attrs("mi300x-8")
    # No MI300X GPU shares a root with a NIC, yet each socket's GPUs align with its NIC.
    assert (
        mi["gpu-0000-0c-00-0"]["resource.kubernetes.io/pcieRoot"]
        != (mi["nic-0000-01-00-0"]["resource.kubernetes.io/pcieRoot"])
    )
    assert mi["gpu-0000-0c-00-0"]["nicAffinity"] == mi["nic-0000-01-00-0"]["nicAffinity"]
    assert mi["gpu-0000-9f-00-0"]["nicAffinity"] == mi["nic-0000-81-00-0"]["nicAffinity"]
    assert mi["gpu-0000-0c-00-0"]["nicAffinity"] != mi["gpu-0000-9f-00-0"]["nicAffinity"]
    dgx = _attrs("dgx-h100")
    rails = sorted(dgx[n]["rail"]["int"] for n in dgx if n.startswith("gpu-"))  # type: ignore[index]
    assert rails == list(range(8))  # GPU i on rail i, one NIC each
    storage = [n for n in dgx if n.startswith("nic-0000-29") or n.startswith("nic-0000-aa")]
    assert storage and all("nicAffinity" not in dgx[n] for n in storage)
    tray = _attrs("gb200-nvl72-tray")
    assert all("nicAffinity" not in a for a in tray.values())


@pytest.mark.parametrize("name", ["dgx-h100", "pcie-8gpu", "mi300x-8", "cloud-vm-1gpu"])
def test_a_gpus_group_holds_exactly_its_closest_nics(name: str) -> None:
    """Every GPU's closest RDMA NICs (best class below SYS) carry the GPU's group id, and
    no other NIC does — checked with the relation rule, not with the module's own code."""
    inv = discover("/", fake=name)
    al = alignment(inv)
    # RDMA NICs; a machine without any (a cloud VM's ENA) aligns on its plain NICs.
    nics = [n for n in inv.nics if n.rdma_devices and not n.is_vf] or [
        n for n in inv.nics if not n.is_vf
    ]
    for g in inv.gpus:
        classes = {n.bus_id: relation(inv, g, n) for n in nics}
        close = [c for c in classes.values() if c in CLOSE]
        if not close:
            assert g.bus_id not in al.nic_affinity
            continue
        best = min(close, key=CLOSE.index)
        want = {b for b, c in classes.items() if c == best}
        got = {b for b in classes if al.nic_affinity.get(b) == al.nic_affinity[g.bus_id]}
        assert got == want, (name, g.bus_id)


# -- optimal assignment --------------------------------------------------------------


def _best_total(topo: NodeTopology, gpus: list[GpuView], nics: list[NicView], per: int) -> float:
    """Exhaustive search (memoised over used-NIC sets): the largest sum of path ranks."""
    slots = [g for g in gpus for _ in range(per)]

    @functools.cache
    def best(i: int, used: int) -> float:
        if i == len(slots):
            return 0.0
        out = -1e9
        for j, n in enumerate(nics):
            if not used >> j & 1:
                out = max(out, _nic_rank(topo, slots[i], n) + best(i + 1, used | 1 << j))
        return out

    return best(0, 0)


def _cases() -> list[tuple[str, int]]:
    out = []
    for m in gpu_machines(8):
        topo = machine(m).topo()
        for k in range(1, len(topo.gpus) + 1):
            if len(topo.nics) >= k:
                out.append((m, k))
    return out


@pytest.mark.parametrize(("name", "k"), _cases())
def test_nic_assignment_is_optimal(name: str, k: int) -> None:
    topo = machine(name).topo()
    subsets = list(itertools.combinations(topo.gpus, k))
    # Every subset on small cases; an even spread of them on the larger ones.
    step = max(1, len(subsets) // 24)
    for gpus in subsets[::step]:
        pairs = assign_nics(topo, list(gpus), topo.nics, 1)
        assert pairs is not None
        assert len({n.vid for _, n in pairs}) == k
        got = sum(_nic_rank(topo, g, n) for g, n in pairs)
        assert got == pytest.approx(_best_total(topo, list(gpus), list(topo.nics), 1))


def test_greedy_pitfall_on_pcie_8gpu() -> None:
    """tp4 on pcie-8gpu: greedy gave NODE×1, PIX×1, SYS×2; the optimum is PIX×2, SYS×2."""
    topo = machine("pcie-8gpu").topo()
    gpus = [g for g in topo.gpus if g.bus_id[5:7] in ("18", "19", "3a", "3b")]
    pairs = assign_nics(topo, gpus, topo.nics, 1)
    assert pairs is not None
    paths = sorted(topo.relation(g.vid, n.vid) for g, n in pairs)
    assert paths == ["PIX", "PIX", "SYS", "SYS"]
    # The emitted pair constraint follows the pair: pcieRoot where shared, none across sockets.
    attrs = sorted(str(pair_attribute(topo.driver, g, [n])) for g, n in pairs)
    assert attrs == ["None", "None"] + ["resource.kubernetes.io/pcieRoot"] * 2


def test_pair_attribute_falls_back_to_nic_affinity_on_mi300x() -> None:
    topo = machine("mi300x-8").topo()
    g = topo.gpus[0]
    nic = next(n for n in topo.nics if n.numa == g.numa)
    assert pair_attribute(topo.driver, g, [nic]) == "toposlice.dev/nicAffinity"


def test_several_nics_per_gpu_and_too_few() -> None:
    topo = machine("dgx-h100").topo()
    gpus = list(topo.gpus[:2])
    pairs = assign_nics(topo, gpus, topo.nics, 2)
    assert pairs is not None and len(pairs) == 4
    got = sum(_nic_rank(topo, g, n) for g, n in pairs)
    assert got == pytest.approx(_best_total(topo, gpus, list(topo.nics), 2))
    assert assign_nics(topo, list(topo.gpus), topo.nics[:3], 1) is None


def test_optimal_assignment_small_matrices() -> None:
    assert optimal_assignment([]) == []
    assert optimal_assignment([[5, 1], [1, 5]]) == [1, 0]
    cost = [[4, 1, 3], [2, 0, 5]]
    cols = optimal_assignment(cost)
    brute = min(
        itertools.permutations(range(3), 2), key=lambda p: sum(cost[i][j] for i, j in enumerate(p))
    )
    assert sum(cost[i][j] for i, j in enumerate(cols)) == sum(
        cost[i][j] for i, j in enumerate(brute)
    )
    with pytest.raises(ValueError):
        optimal_assignment([[1], [2]])
    assert NIC_PATH_DERATE["PIX"] >= NIC_PATH_DERATE["SYS"]
