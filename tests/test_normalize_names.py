from __future__ import annotations

import random

from normalize import names
from normalize.devices import build_devices
from normalize.options import NormalizeOptions
from normalize.validation import is_dns_label
from tests.inventories import dgx, gb200


def test_name_formats() -> None:
    assert names.gpu_name("0000:1b:00.0") == "gpu-0000-1b-00-0"
    assert names.nic_name("0000:1b:00.1") == "nic-0000-1b-00-1"
    assert names.cpu_numa_name(3) == "cpu-numa3"
    assert names.cpu_l3_name(1, 7) == "cpu-numa1-l3-7"
    assert names.cpu_core_name(1, 0, 12) == "cpu-numa1-core-0-12"
    assert names.nic_name("10000:01:00.0") == "nic-10000-01-00-0"


def test_long_or_odd_names_are_hashed_labels() -> None:
    long = names.to_label("gpu-" + "a" * 100, "id1")
    assert is_dns_label(long) and len(long) <= 63
    assert long != names.to_label("gpu-" + "a" * 100, "id2")
    odd = names.gpu_name("GPU:ZZ/..")
    assert is_dns_label(odd)


def test_unique_names_order_independent() -> None:
    pairs = [("a", "1"), ("a", "2"), ("b", "3"), ("a", "1")]
    out = names.unique_names(pairs)
    assert len(set(out)) == 4 and all(is_dns_label(n) for n in out)
    assert out[2] == "b"
    rev = names.unique_names(list(reversed(pairs)))
    assert rev[1] == "b"
    assert {out[1]} == {rev[2]}  # identity "2" gets the same name in both orders


def test_names_stable_when_lists_shuffled() -> None:
    for make in (dgx, gb200):
        for opts in (NormalizeOptions(), NormalizeOptions(cpu_grouping="core")):
            base = [d["name"] for d in build_devices(make(), opts)]
            for seed in range(3):
                inv = make()
                rng = random.Random(seed)
                for lst in (inv.gpus, inv.nics, inv.pci_devices, inv.cpus, inv.numa_nodes):
                    rng.shuffle(lst)
                for g in inv.gpus:
                    g.index = None
                assert [d["name"] for d in build_devices(inv, opts)] == base


def test_cpu_group_names() -> None:
    l3 = [d["name"] for d in build_devices(dgx(), NormalizeOptions(cpu_grouping="l3"))]
    assert "cpu-numa0-l3-0" in l3 and "cpu-numa1-l3-2" in l3
    core = [d["name"] for d in build_devices(dgx(), NormalizeOptions(cpu_grouping="core"))]
    assert "cpu-numa0-core-0-0" in core and "cpu-numa1-core-1-107" in core
    assert len(core) == len(set(core))
