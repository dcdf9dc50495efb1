"""Claims that take CPUs or NICs from another driver (``toposlice claim --cpus-from dra.cpu``,
``--nics-from dra.net``): their shape, the constraints that tie them to toposlice's GPUs, and
that the API schema takes them. The real scheduler allocating them is tests/interop/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from scorer.ladder import NeighbourCpus, NeighbourNics, ladder_spec, neighbour_nic_spec
from toposlice.cli import main

BRIDGE = "dra.net/numaNode"
ROOT = "resource.kubernetes.io/pcieRoot"
REPO = Path(__file__).resolve().parent.parent


def claim(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["claim", *args, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    template = doc["items"][0]
    kubernetes_validate.validate(template, latest_version(), strict=True)
    spec: dict[str, Any] = template["spec"]["spec"]
    return spec


def names(spec: dict[str, Any]) -> list[str]:
    return [r["name"] for r in spec["devices"]["requests"]]


def tie(spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in spec["devices"]["constraints"] if "cpus" in c["requests"])


def test_grouped_cpus_ask_for_capacity_of_one_device(capsys: pytest.CaptureFixture[str]) -> None:
    spec = claim(capsys, "--gpus", "2", "--cpus-from", "dra.cpu", "--cpus", "8")
    assert names(spec) == ["gpus", "cpus"]
    cpus = spec["devices"]["requests"][1]["exactly"]
    assert cpus["deviceClassName"] == "dra.cpu" and cpus["count"] == 1
    assert cpus["capacity"] == {"requests": {"dra.cpu/cpu": "8"}}
    assert tie(spec) == {"requests": ["gpus", "cpus"], "matchAttribute": BRIDGE}
    # tied to the CPUs, `any` would search again what `numa` did
    assert [s["name"] for s in spec["devices"]["requests"][0]["firstAvailable"]] == ["numa"]


def test_individual_cpus_are_devices(capsys: pytest.CaptureFixture[str]) -> None:
    spec = claim(
        capsys, "--gpus", "1", "--cpus-from", "dra.cpu", "--cpus", "4",
        "--cpu-device-mode", "individual",
    )  # fmt: skip
    cpus = spec["devices"]["requests"][1]["exactly"]
    assert cpus["count"] == 4 and "capacity" not in cpus


def test_cpus_are_tied_to_every_gpu_of_a_paired_ladder(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = claim(
        capsys, "--gpus", "4", "--nics-per-gpu", "1", "--cpus-from", "dra.cpu", "--cpus", "4"
    )
    assert names(spec)[:2] == ["gpu-0", "cpus"]  # right after the first GPU: fails fast
    assert tie(spec)["requests"] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "cpus"]


def test_nics_from_dranet_pair_each_gpu_by_root_then_numa(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = claim(capsys, "--gpus", "2", "--nics-from", "dra.net", "--cpus-from", "dra.cpu",
                 "--cpus", "4")  # fmt: skip
    assert names(spec) == ["gpu-0", "cpus", "nic-0", "gpu-1", "nic-1"]
    nic = spec["devices"]["requests"][2]["firstAvailable"]
    assert [s["name"] for s in nic] == ["root", "numa"]
    assert all(s["deviceClassName"] == "dra.net" for s in nic)
    assert all(
        s["selectors"] == [{"cel": {"expression": 'device.attributes["dra.net"].rdma == true'}}]
        for s in nic
    )
    pairs = {(tuple(c["requests"]), c["matchAttribute"]) for c in spec["devices"]["constraints"]}
    for i in range(2):
        assert ((f"gpu-{i}", f"nic-{i}/root"), "resource.kubernetes.io/pcieRoot") in pairs
        assert ((f"gpu-{i}", f"nic-{i}/numa"), BRIDGE) in pairs
    # each GPU request its own window of ordinals: every GPU set tried once
    assert "ordinal" in json.dumps(spec["devices"]["requests"][0]["exactly"]["selectors"])


def test_two_nics_per_gpu_and_the_limits() -> None:
    spec = neighbour_nic_spec(3, NeighbourNics("dra.net", per_gpu=2))
    assert all(
        s["count"] == 2 for r in spec["devices"]["requests"] for s in r.get("firstAvailable", [])
    )
    assert len(spec["devices"]["requests"]) == 6 and len(spec["devices"]["constraints"]) == 6
    with pytest.raises(ValueError, match="at most 16"):
        neighbour_nic_spec(17, NeighbourNics("dra.net"))
    with pytest.raises(ValueError, match="not both"):
        ladder_spec(2, cpu_groups=1, cpus_from=NeighbourCpus("dra.cpu", 4))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--cpus", "4"], "--cpus needs --cpus-from"),
        (["--cpus-from", "dra.cpu"], "needs --cpus N"),
        (["--cpus-from", "dra.cpu", "--cpus", "4", "--cpu-groups", "1"], "one driver"),
        (["--nics-from", "dra.net", "--cpu-groups", "1"], "--cpus-from"),
        (["--nics-from", "dra.net", "--nics-per-gpu", "0"], "--nics-per-gpu of 1"),
    ],
)
def test_bad_neighbour_flags_say_why(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["claim", "--gpus", "2", *args]) == 2
    assert error in capsys.readouterr().err


NEIGHBOUR_EXAMPLES = sorted(
    p for d in ("dra-cpu", "dranet") for p in (REPO / "examples" / d).glob("*.yaml")
)


@pytest.mark.parametrize("path", NEIGHBOUR_EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_neighbour_examples_are_valid_and_say_what_they_get(path: Path) -> None:
    """The schema here; what the real scheduler gives them, beside the real drivers, is
    tests/interop/ (it reads the same comment lines)."""
    import yaml

    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1
    kubernetes_validate.validate(docs[0], latest_version(), strict=True)
    machines = {
        line.split(":")[0].strip("# ")
        for line in path.read_text().splitlines()
        if line.startswith("#   ") and (" = " in line or line.endswith(": unallocated"))
    }
    assert machines == {"dgx-h100", "mi300x-8"}


def test_score_emits_the_scored_pairs_first_in_dranets_terms(tmp_path: Path) -> None:
    out = tmp_path / "claim.json"
    request = REPO / "examples" / "requests" / "tp4-training.yaml"
    rc = main(["score", "--request", str(request), "--fake", "dgx-h100", "--emit-claim",
               str(out), "--nics-from", "dra.net"])  # fmt: skip
    assert rc == 0
    template = json.loads(out.read_text())["items"][0]
    kubernetes_validate.validate(template, latest_version(), strict=True)
    spec = template["spec"]["spec"]
    requests = {r["name"]: r for r in spec["devices"]["requests"]}
    assert list(requests) == [x for i in range(4) for x in (f"gpu-{i}", f"nic-{i}")]
    pinned_gpus, pinned_nics = [], []
    for i in range(4):
        gpu, nic = requests[f"gpu-{i}"]["firstAvailable"], requests[f"nic-{i}"]["firstAvailable"]
        assert [s["name"] for s in gpu] == ["chosen", "any"]
        assert [s["name"] for s in nic] == ["chosen", "root", "numa"]
        pinned_gpus.append(gpu[0]["selectors"][-1]["cel"]["expression"].split('"')[-2])
        pinned_nics.append(json.loads(nic[0]["selectors"][0]["cel"]["expression"].split(" in ")[1]))
        tie = {"requests": [f"gpu-{i}", f"nic-{i}/chosen"], "matchAttribute": ROOT}
        assert tie in spec["devices"]["constraints"]
    # the scorer's pick on dgx-h100: four GPUs of one NUMA node, each with the IB NIC on its root
    assert pinned_gpus == ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0"]
    assert pinned_nics == [["0000:18:00.0"], ["0000:40:00.0"], ["0000:4f:00.0"], ["0000:5e:00.0"]]
