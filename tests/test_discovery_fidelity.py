"""Discovery agrees with hwloc's truth on every public dump (and on this VM when it matches)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from discovery.fidelity import to_fidelity
from discovery.host import discover_host
from hack.hwloc_fixtures import case_file
from tests.conftest import HWLOC, hwloc_cases, load_truth

CASES = hwloc_cases()


def _scorer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity_check", HWLOC / "fidelity_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _got(root: Path, case: str) -> dict[str, Any]:
    inv, _ = discover_host(str(root), live=False)
    return to_fidelity(inv, case)


@pytest.mark.parametrize("case", CASES)
def test_fidelity_scores_perfect(case: str, hwloc_roots: dict[str, Path]) -> None:
    truth = load_truth(case)
    res = _scorer().compare(truth, _got(hwloc_roots[case], case))
    for field in (
        "numa_nodes",
        "cpu_to_numa",
        "pci_devices",
        "pcie_root",
        "pci_numa_node",
        "pci_bridges",
        "net_interfaces",
        "infiniband",
        "pci_ids",
        "gpus",
        "numa_distances",
    ):
        rate = res[field]["rate"]
        assert rate in (None, 1.0), f"{case}: {field} = {res[field]}"


@pytest.mark.parametrize("case", CASES)
def test_fields_match_truth_directly(case: str, hwloc_roots: dict[str, Path]) -> None:
    """The same agreement, spelled out: node ids, CPU sets, bus ids, roots, kernel NUMA."""
    truth = load_truth(case)
    got = _got(hwloc_roots[case], case)
    assert {n["id"]: n["cpus"] for n in got["numa_nodes"]} == {
        n["id"]: n["cpus"] for n in truth["numa_nodes"]
    }
    ignore = set(truth.get("pci_ignore") or [])
    gp = {d["bus_id"]: d for d in got["pci_devices"] if d["bus_id"] not in ignore}
    tp = {d["bus_id"]: d for d in truth["pci_devices"]}
    assert set(gp) == set(tp)
    for bdf, td in tp.items():
        gd = gp[bdf]
        if td.get("pcie_root") is not None:
            assert gd["pcie_root"] == td["pcie_root"], bdf
        else:
            assert gd["pcie_root"] is None, bdf
        assert gd["numa_node"] == td["numa_node"], bdf
        if "sysfs_numa_node" in td:
            # The kernel's own value is what resource.kubernetes.io/numaNode publishes.
            want = -1 if td["sysfs_numa_node"] is None else td["sysfs_numa_node"]
            assert gd["sysfs_numa_node"] == want, bdf
        assert gd["is_bridge"] == td["is_bridge"], bdf
    names = lambda items: {(x["name"], x["bus_id"]) for x in items}  # noqa: E731
    assert names(got["net_interfaces"]) == names(truth["net_interfaces"])
    assert names(got["infiniband"]) == names(truth["infiniband"])
    assert got["pus"] == truth["pus"]
    assert got["packages"] == truth["packages"]


def test_live_host_matches_truth_when_same_machine() -> None:
    truth_path = HWLOC / "live-session-vm.json"
    if not truth_path.exists() or not os.path.isdir("/sys/bus/pci/devices"):
        pytest.skip("no live truth or no sysfs")
    truth = load_truth("live-session-vm")
    live_pci = set(os.listdir("/sys/bus/pci/devices"))
    if live_pci != {d["bus_id"] for d in truth["pci_devices"]} or os.cpu_count() != truth["pus"]:
        pytest.skip("this host is not shaped like the VM the live truth was taken on")
    inv, _ = discover_host("/", live=True)
    res = _scorer().compare(truth, to_fidelity(inv, "live-session-vm"))
    assert _scorer().fidelity(res) == 1.0, res


def test_every_shipped_case_is_the_tarball_its_truth_names() -> None:
    """tests/data/hwloc holds each case's dump byte for byte as its truth records it."""
    shipped = hwloc_cases(HWLOC)
    assert shipped, f"{HWLOC}/cases.txt lists no case"
    assert (HWLOC / "COPYING").is_file() and (HWLOC / "live-session-vm.json").is_file()
    for case in shipped:
        source = json.loads((HWLOC / f"{case}.json").read_text(encoding="utf-8"))["source"]
        digest = hashlib.sha256((HWLOC / f"{case}.tar.bz2").read_bytes()).hexdigest()
        assert digest == source["tarball_sha256"], case
        assert source["tarball"] == f"tests/hwloc/linux/{case}.tar.bz2", case


def test_every_case_has_a_tarball_and_a_truth() -> None:
    assert CASES[: len(hwloc_cases(HWLOC))] == hwloc_cases(HWLOC)
    for case in CASES:
        assert case_file(case, ".tar.bz2").is_file(), case
        assert load_truth(case)["case"] == case
