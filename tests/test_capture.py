"""``toposlice machines capture``: the captured YAML generates a machine with the same
inventory (up to the documented fields), ResourceSlices and relation matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from discovery.fake import fake_host, list_machines, load_yaml
from discovery.model import Inventory
from normalize.graph import build_graph
from normalize.options import NormalizeOptions
from normalize.slices import build_slices
from tests.conftest import hwloc_cases
from toposlice.capture import NOT_CAPTURED, capture_differences, capture_yaml
from toposlice.cli import main
from toposlice.discover import discover


def _regenerate(inv: Inventory, label: str) -> tuple[str, Inventory]:
    text = capture_yaml(inv, label)
    spec = load_yaml(text, source=f"{label}.yaml")
    with fake_host(spec) as host:
        return text, discover(str(host.root), nvml=host.nvml)


def _same_outputs(original: Inventory, replayed: Inventory) -> None:
    opts = NormalizeOptions()
    assert build_slices(replayed, "node-a", opts) == build_slices(original, "node-a", opts)
    graph_a, graph_b = build_graph(original, opts), build_graph(replayed, opts)
    assert graph_b["relations"] == graph_a["relations"]
    assert graph_b == graph_a


@pytest.mark.parametrize("name", list_machines())
def test_shipped_machine_round_trips(name: str) -> None:
    with fake_host(name) as host:
        original = discover(str(host.root), nvml=host.nvml)
    text, replayed = _regenerate(original, name)
    assert capture_differences(original, replayed) == []
    # Every field but the documented ones is equal, the relation matrix too.
    a, b = original.to_dict(), replayed.to_dict()
    for key in set(a) - set(NOT_CAPTURED[""]):
        if key not in NOT_CAPTURED:
            assert a[key] == b[key], key
    _same_outputs(original, replayed)
    assert text.startswith(f"# {name}: captured by `toposlice machines capture`")


@pytest.mark.parametrize("case", hwloc_cases())
def test_hwloc_dump_round_trips(case: str, hwloc_roots: dict[str, Path]) -> None:
    original = discover(str(hwloc_roots[case]))
    _, replayed = _regenerate(original, case)
    assert capture_differences(original, replayed) == []
    assert len(replayed.cpus) == len(original.cpus) and replayed.caches == original.caches
    if all(d.pcie_root is not None for d in original.pci_devices):
        _same_outputs(original, replayed)


def test_this_machine_round_trips() -> None:
    original = discover("/")
    _, replayed = _regenerate(original, "this host")
    assert capture_differences(original, replayed) == []


def test_differences_are_reported() -> None:
    with fake_host("cpu-2s") as host:
        original = discover(str(host.root))
    _, replayed = _regenerate(original, "cpu-2s")
    replayed.cpus[0].core = 99
    replayed.numa_nodes[0].memory_bytes = 1
    assert capture_differences(original, replayed) == ["cpus", "numa_nodes"]


def test_cli_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["machines"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == list_machines()
    assert main(["machines", "list"]) == 0
    assert capsys.readouterr().out.split() == listed

    out = tmp_path / "dgx.yaml"
    assert main(["machines", "capture", "--fake", "dgx-h100", "--output-file", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["graph", "--fake", str(out), "-o", "json"]) == 0
    captured_graph = json.loads(capsys.readouterr().out)
    assert main(["graph", "--fake", "dgx-h100", "-o", "json"]) == 0
    assert captured_graph["relations"] == json.loads(capsys.readouterr().out)["relations"]

    inventory = tmp_path / "inv.json"
    assert main(["discover", "--fake", "mi300x-8", "-o", "json"]) == 0
    inventory.write_text(capsys.readouterr().out)
    assert main(["machines", "capture", "--inventory", str(inventory)]) == 0
    text = capsys.readouterr().out
    assert "captured by `toposlice machines capture` from --inventory" in text
    assert load_yaml(text).amd is not None
