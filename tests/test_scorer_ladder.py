"""Claim ladders (scorer/ladder.py, `toposlice claim`, `--emit-claim`): within the API's
limits, the best topology class while it is free and a looser one when it is taken, as
the upstream allocator (scorer/allocator.py) allocates them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from normalize.deviceclasses import device_classes
from scorer.allocator import Allocator
from scorer.claim import claim_spec_for, ladder_spec_for
from scorer.ladder import (
    MAX_SUBREQUESTS,
    ladder_spec,
    prioritized_score,
    rung_of,
    wants_scaleup,
)
from scorer.request import Occupancy, Request
from scorer.search import place
from tests.scorer_support import machine
from toposlice.cli import main

DRIVER = "toposlice.dev"


def _alloc(name: str) -> Allocator:
    m = machine(name)
    return Allocator(m.slices, device_classes(), str(m.graph["node"]))


def _busy(name: str, devices: list[str]) -> list[tuple[str, str, str]]:
    pool = str(machine(name).graph["dra"]["pool"])
    return [(DRIVER, pool, d) for d in devices]


def _attr(name: str, device: str, key: str) -> Any:
    for sl in machine(name).slices:
        for d in sl["spec"]["devices"]:
            if d["name"] == device:
                return next(iter(d["attributes"].get(key, {None: None}).values()))
    raise KeyError(device)


@pytest.mark.parametrize("nics", [0, 1, 2])
@pytest.mark.parametrize("cpus", [0, 1])
@pytest.mark.parametrize("scaleup", [False, True])
def test_ladders_stay_within_the_api_limits(nics: int, cpus: int, scaleup: bool) -> None:
    for gpus in range(1, 21):
        spec = ladder_spec(gpus, nics, DRIVER, cpu_groups=cpus, scaleup=scaleup)["devices"]
        requests = spec["requests"]
        assert len(requests) <= 32
        names = {r["name"] for r in requests}
        subs = {f"{r['name']}/{s['name']}" for r in requests for s in r.get("firstAvailable", [])}
        for r in requests:
            assert len(r.get("firstAvailable", [])) <= MAX_SUBREQUESTS
        constraints = spec.get("constraints", [])
        assert len(constraints) <= 32
        for c in constraints:
            assert 1 <= len(c["requests"]) <= 32
            assert set(c["requests"]) <= names | subs, (gpus, c)
        # The counts always add up to what was asked.
        got = _min_counts(requests)
        assert got.get("gpu.toposlice.dev") == gpus
        assert got.get("nic.toposlice.dev", 0) == gpus * nics
        assert got.get("cpu.toposlice.dev", 0) == cpus


def _min_counts(requests: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        alts = r.get("firstAvailable") or [r["exactly"]]
        counts = {a["count"] for a in alts}
        assert len(counts) == 1  # every rung asks for the same number of devices
        classes = {a["deviceClassName"] for a in alts}
        assert len(classes) == 1
        key = classes.pop()
        out[key] = out.get(key, 0) + counts.pop()
    return out


def test_ladder_template_validates() -> None:
    version = latest_version()
    for gpus, nics in ((1, 0), (2, 1), (8, 1), (4, 0)):
        t = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "x"},
            "spec": {"spec": ladder_spec(gpus, nics, DRIVER, cpu_groups=1)},
        }
        kubernetes_validate.validate(t, version, strict=True)


def test_best_class_when_free_looser_when_taken_pcie() -> None:
    alloc = _alloc("pcie-8gpu")
    spec = ladder_spec(2, 1, DRIVER)
    got = alloc.allocate(spec)
    assert got is not None
    rungs = rung_of([r.request for r in got])
    # Mode P: every GPU with a NIC of its own closest-NIC group.
    assert rungs == {"gpu-0": "paired", "gpu-1": "paired", "nic-0": "paired", "nic-1": "paired"}
    devs = {r.request.split("/")[0]: r.device for r in got}
    aff = "nicAffinity"
    # Each GPU with the NIC on its own switch, the two GPUs behind different switches.
    assert _attr("pcie-8gpu", devs["gpu-0"], aff) != _attr("pcie-8gpu", devs["gpu-1"], aff)
    for i in (0, 1):
        assert _attr("pcie-8gpu", devs[f"gpu-{i}"], aff) == _attr(
            "pcie-8gpu", devs[f"nic-{i}"], aff
        )
    best = prioritized_score(spec, [r.request for r in got])
    # Only the two GPUs of one switch free: they cannot both pair with its one NIC, so the
    # claim drops to mode A as a whole (no GPU paired, no NIC paired): first fit then still
    # gives the first GPU the NIC on its switch.
    busy = _busy("pcie-8gpu", [f"gpu-0000-{b}-00-0" for b in ("3a", "3b", "9a", "9b", "ba", "bb")])
    got2 = alloc.allocate(spec, busy)
    assert got2 is not None
    assert rung_of([r.request for r in got2]) == {
        "gpu-0": "unpaired",
        "gpu-1": "paired",
        "nic-0": "any",
        "nic-1": "any",
    }
    devs2 = {r.request.split("/")[0]: r.device for r in got2}
    assert devs2["nic-0"] == "nic-0000-1a-00-0"
    assert prioritized_score(spec, [r.request for r in got2]) < best


def test_mi300x_pairs_each_gpu_with_its_socket_nic() -> None:
    alloc = _alloc("mi300x-8")
    spec = ladder_spec(2, 1, DRIVER)
    got = alloc.allocate(spec)
    assert got is not None
    # No NIC shares a GPU's root there; each GPU pairs with its socket's NIC by
    # nicAffinity, and the second GPU is pushed to the other socket by the NICs left.
    assert rung_of([r.request for r in got]) == {
        "gpu-0": "paired",
        "nic-0": "paired",
        "gpu-1": "paired",
        "nic-1": "paired",
    }
    devs = {r.request.split("/")[0]: r.device for r in got}
    for i in (0, 1):
        aff = "nicAffinity"
        assert _attr("mi300x-8", devs[f"gpu-{i}"], aff) == _attr("mi300x-8", devs[f"nic-{i}"], aff)
    # A plain pcieRoot pair cannot be satisfied there at all.
    hard = {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.toposlice.dev"}},
                {"name": "nic", "exactly": {"deviceClassName": "nic.toposlice.dev"}},
            ],
            "constraints": [
                {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
            ],
        }
    }
    assert alloc.allocate(hard) is None


def test_ladder_still_allocates_where_no_nic_is_close() -> None:
    """GB200 trays: no NIC carries nicAffinity; the unpaired rungs still allocate."""
    got = _alloc("gb200-nvl72-tray").allocate(ladder_spec(2, 1, DRIVER))
    assert got is not None
    assert set(rung_of([r.request for r in got]).values()) == {"any"}


def _ranked(name: str, spec: dict[str, Any]) -> tuple[dict[str, str], int]:
    got = _alloc(name).allocate(spec)
    assert got is not None, name
    requests = [r.request for r in got]
    return rung_of(requests), prioritized_score(spec, requests)


def test_scaleup_rung_ranks_nvlink_and_xgmi_boards_first() -> None:
    """Without the rung a DGX and a PCIe box pair GPUs with NICs alike, so the scheduler's
    prioritized-list score ties and a tensor-parallel pair lands on PCIe half the time;
    with it the NVSwitch board and the xGMI hive rank first and still pair each GPU with
    its own NIC."""
    plain = ladder_spec(2, 1, DRIVER)
    assert _ranked("dgx-h100", plain)[1] == _ranked("pcie-8gpu", plain)[1]
    spec = ladder_spec(2, 1, DRIVER, scaleup=True)
    dgx, dgx_score = _ranked("dgx-h100", spec)
    pcie, pcie_score = _ranked("pcie-8gpu", spec)
    mi, mi_score = _ranked("mi300x-8", spec)
    assert dgx == {"gpu-0": "scaleup", "nic-0": "paired", "gpu-1": "paired", "nic-1": "paired"}
    assert pcie == {"gpu-0": "paired", "nic-0": "paired", "gpu-1": "paired", "nic-1": "paired"}
    assert mi["gpu-0"] == "scaleup"
    assert dgx_score > pcie_score
    # MI300X pairs each GPU with its socket's NIC as the PCIe box does; the hive lifts it
    # above the box.
    assert _ranked("mi300x-8", plain)[1] == _ranked("pcie-8gpu", plain)[1]
    assert mi_score > pcie_score
    got = _alloc("dgx-h100").allocate(spec)
    assert got is not None
    devs = {r.request.split("/")[0]: r.device for r in got}
    aff = "nicAffinity"
    for i in (0, 1):
        assert _attr("dgx-h100", devs[f"gpu-{i}"], aff) == _attr("dgx-h100", devs[f"nic-{i}"], aff)
    # The count ladder (no NICs): the whole set in the scale-up domain, else one socket.
    count = ladder_spec(4, 0, DRIVER, scaleup=True)
    assert _ranked("dgx-h100", count)[0] == {"gpus": "scaleup"}
    assert _ranked("pcie-8gpu", count)[0] == {"gpus": "numa"}


def test_scaleup_only_where_the_run_time_model_gains() -> None:
    for pattern in ("tensor-parallel", "data-parallel", "inference-decode"):
        assert wants_scaleup(pattern, 2)
        assert not wants_scaleup(pattern, 1)  # one GPU has no in-node collective
    assert not wants_scaleup("pipeline-parallel", 4)
    assert not wants_scaleup("independent", 8)
    assert not wants_scaleup("no-such-pattern", 2)


def test_claim_pattern_adds_the_scaleup_rung(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def gpu1(args: list[str]) -> list[str]:
        assert main(["claim", "--gpus", "2", "--nics-per-gpu", "1", "-o", "json", *args]) == 0
        spec = json.loads(capsys.readouterr().out)["items"][0]["spec"]["spec"]
        (req,) = [r for r in spec["devices"]["requests"] if r["name"] == "gpu-0"]
        return [s["name"] for s in req["firstAvailable"]]

    cheap = ["paired", "unpaired", "any"]
    assert gpu1([]) == cheap  # no workload stated: the cheap ladder
    assert gpu1(["--pattern", "tensor-parallel"]) == ["scaleup", *cheap]
    assert gpu1(["--pattern", "pipeline-parallel"]) == cheap
    req = tmp_path / "req.yaml"
    req.write_text(yaml.safe_dump({"gpus": 2, "nicsPerGpu": 1, "pattern": "inference-decode"}))
    assert gpu1(["--request", str(req)]) == ["scaleup", *cheap]
    assert gpu1(["--request", str(req), "--pattern", "independent"]) == cheap
    with pytest.raises(SystemExit):
        main(["claim", "--gpus", "2", "--pattern", "tensor"])
    assert "--pattern" in capsys.readouterr().err


def test_one_gpu_is_a_plain_count() -> None:
    """One GPU has no topology to choose; a rung that cannot match (a GPU outside any
    NVLink domain, on a DGX) would only cost every node a scan of its devices."""
    spec = ladder_spec(1, 0, DRIVER)
    (req,) = spec["devices"]["requests"]
    assert req["firstAvailable"] == [
        {"name": "any", "deviceClassName": "gpu.toposlice.dev", "count": 1}
    ]
    assert "constraints" not in spec["devices"]


def test_prioritized_score_is_the_schedulers() -> None:
    """KEP-4816 scoring: per firstAvailable request, 8 − the chosen sub-request's index,
    summed; requests without firstAvailable add nothing."""
    spec = {
        "devices": {
            "requests": [
                {"name": "a", "firstAvailable": [{"name": "x"}, {"name": "y"}, {"name": "z"}]},
                {"name": "b", "firstAvailable": [{"name": "x"}, {"name": "y"}, {"name": "z"}]},
                {"name": "c", "exactly": {}},
            ]
        }
    }
    assert prioritized_score(spec, ["a/x", "b/z", "c"]) == 8 + 6
    assert prioritized_score(spec, ["a/y", "b/x", "a/y"]) == 7 + 8
    assert prioritized_score(spec, ["a/z", "b/y"]) == 6 + 7


def test_sub_request_constraint_binds_only_when_that_sub_is_chosen() -> None:
    """The upstream rule the ladder rests on: a constraint naming ``req/sub`` holds only
    for the devices of that sub-request; one naming ``req`` holds for every sub-request."""
    alloc = _alloc("pcie-8gpu")
    sub_only = {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "firstAvailable": [
                        {"name": "tight", "deviceClassName": "gpu.toposlice.dev", "count": 3},
                        {"name": "loose", "deviceClassName": "gpu.toposlice.dev", "count": 3},
                    ],
                }
            ],
            "constraints": [
                {"requests": ["gpus/tight"], "matchAttribute": "toposlice.dev/pcieSwitch"}
            ],
        }
    }
    got = alloc.allocate(sub_only)
    assert got is not None and {r.request for r in got} == {"gpus/loose"}
    whole = json.loads(json.dumps(sub_only))
    whole["devices"]["constraints"][0]["requests"] = ["gpus"]
    assert alloc.allocate(whole) is None


# -- the scorer's --emit-claim ladder ------------------------------------------------


def _tp2() -> Request:
    return Request(gpus=2, nics_per_gpu=1, pattern="tensor-parallel", bound="communication")


def test_emitted_ladder_lands_the_choice_then_degrades() -> None:
    m = machine("pcie-8gpu")
    topo = m.topo()
    req = _tp2()
    best = place([topo], Occupancy(), req, top=1)[0].pods[0]
    spec = ladder_spec_for(topo, req, None, best, m.slices)
    assert "firstAvailable" in spec["devices"]["requests"][0]
    alloc = _alloc("pcie-8gpu")
    got = alloc.allocate(spec)
    assert got is not None
    assert sorted(r.device for r in got) == sorted(best.devices)
    assert {rung_of([r.request for r in got])[k] for k in ("gpu-0", "gpu-1")} == {"chosen"}
    # Another pod took one of the chosen GPUs between scoring and allocation: the pinned
    # hard claim now fails, the ladder allocates the best class left.
    taken = _busy("pcie-8gpu", [best.devices[0]])
    pinned = claim_spec_for(topo, req, None, best, None)
    assert alloc.allocate(pinned, taken) is None
    again = alloc.allocate(spec, taken)
    assert again is not None
    assert best.devices[0] not in {r.device for r in again}
    assert prioritized_score(spec, [r.request for r in again]) < prioritized_score(
        spec, [r.request for r in got]
    )


def test_emit_claim_writes_a_ladder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "req.yaml"
    req.write_text(yaml.safe_dump({"gpus": 2, "nicsPerGpu": 1, "pattern": "tensor-parallel"}))
    out = tmp_path / "claim.yaml"
    rc = main(["score", "--request", str(req), "--fake", "mi300x-8", "--emit-claim", str(out)])
    assert rc == 0
    doc = yaml.safe_load(out.read_text())
    spec = doc["items"][0]["spec"]["spec"]
    names = [s["name"] for s in spec["devices"]["requests"][0]["firstAvailable"]]
    assert names[0] == "chosen" and names[-1] == "any"
    assert "nvlink" not in names  # a rung the node cannot match is left out
    capsys.readouterr()


# -- toposlice claim -------------------------------------------------------------------


def test_claim_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["claim", "--gpus", "2", "--nics-per-gpu", "1", "--fake", "mi300x-8"]) == 0
    captured = capsys.readouterr()
    doc = yaml.safe_load(captured.out)
    assert doc["kind"] == "List"
    template = doc["items"][0]
    assert template["metadata"]["name"] == "gpus-2-nics-1"
    kubernetes_validate.validate(template, latest_version(), strict=True)
    assert {c["metadata"]["name"] for c in doc["items"][1:]} == {
        "gpu.toposlice.dev",
        "nic.toposlice.dev",
    }
    # the scorer's score of the set it lands on (the same number `toposlice score` gives)
    assert re.search(r"# mi300x-8: score [0-9.]+; gpu-0/paired = gpu-0000-0c-00-0", captured.err)


def test_claim_command_json_memory_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["claim", "--gpus", "4", "--min-gpu-memory", "40Gi", "-o", "json", "--name", "x"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    sub = doc["items"][0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]
    assert 'quantity("42949672960")' in sub["selectors"][0]["cel"]["expression"]
    with pytest.raises(SystemExit) as exited:  # refused by the parser's range
        main(["claim", "--gpus", "0"])
    assert exited.value.code == 2
    assert "--gpus: '0': give a number in 1..64" in capsys.readouterr().err
    assert main(["claim"]) == 2
    assert "--gpus" in capsys.readouterr().err


def _numa(name: str, device: str) -> Any:
    return _attr(name, device, "resource.kubernetes.io/numaNode")


def test_one_gpu_with_a_cpu_group_takes_the_gpus_numa_node() -> None:
    spec = ladder_spec(1, 0, DRIVER, cpu_groups=1)
    alloc = _alloc("dgx-h100")
    gpus = [d["name"] for sl in machine("dgx-h100").slices for d in sl["spec"]["devices"]]
    numa0 = [g for g in gpus if g.startswith("gpu-") and _numa("dgx-h100", g) == 0]
    assert numa0
    # NUMA node 0's GPUs taken: the CPU group follows the GPU to node 1 (first fit alone
    # would take cpu-numa0, the first CPU group).
    got = alloc.allocate(spec, _busy("dgx-h100", numa0))
    assert got is not None
    devs = {r.request.split("/")[0]: r.device for r in got}
    assert _numa("dgx-h100", devs["gpus"]) == 1
    assert devs["cpu"] == "cpu-numa1"
    assert rung_of([r.request for r in got]) == {"gpus": "numa", "cpu": "numa"}
    # The GPU's own group taken: a group elsewhere, on the looser rung.
    got = alloc.allocate(spec, _busy("dgx-h100", [*numa0, "cpu-numa1"]))
    assert got is not None
    assert rung_of([r.request for r in got])["cpu"] == "any"


def test_one_gpu_without_a_numa_node_still_gets_its_cpu_group() -> None:
    got = _alloc("cloud-vm-1gpu").allocate(ladder_spec(1, 0, DRIVER, cpu_groups=1))
    assert got is not None
    assert rung_of([r.request for r in got])["gpus"] == "any"
    assert {r.request.split("/")[0] for r in got} == {"gpus", "cpu"}
