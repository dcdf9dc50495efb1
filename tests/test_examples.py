"""examples/: every claim gets exactly the devices its comment names on each machine it names.

The slices are the ones `toposlice slices --fake <machine>` prints (run as a command), the
DeviceClasses the ones normalize/deviceclasses.py defines (and the chart installs), and
the allocation follows the upstream structured-allocation rules (scorer/allocator.py, CEL
evaluated by a CEL library through scorer/cel.py, not by Python code of ours).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from normalize.deviceclasses import device_classes
from normalize.node_feature import PREFIX, admits, topology_labels
from normalize.vendor_view import beside_vendor, vendor_device_class
from scorer.allocator import AllocationError, Allocator, Result

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
NODE = "n1"

_EXPECT = re.compile(r"^#\s{2,}([a-z0-9][-a-z0-9]*(?: beside [a-z0-9.-]+)?):\s+(.+?)\s*$")

#: The DeviceClass the NVIDIA GPU DRA driver installs for its full GPUs.
VENDOR_CLASSES = {"gpu.nvidia.com": vendor_device_class("gpu.nvidia.com")}
#: Slices NVIDIA's plugin published on the fake machines (tests/interop/test_nvidia_gpu.py).
RECORDED = REPO / "tests" / "data" / "foreign-slices" / "recorded"
VENDOR_RECORDED = {
    ("dgx-h100", "gpu.nvidia.com"): "nvidia-gpu.yaml",
    ("gb200-nvl72-tray", "gpu.nvidia.com"): "nvidia-gpu-gb200.yaml",
}
STD = "resource.kubernetes.io"


@cache
def machine_slices(machine: str) -> tuple[dict[str, Any], ...]:
    """The slices ``toposlice slices --fake <machine> --node-name n1`` prints."""
    args = ["-q", "slices", "--fake", machine, "--node-name", NODE, "-o", "yaml"]
    proc = subprocess.run(
        [sys.executable, "-m", "toposlice", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"toposlice slices --fake {machine} failed: {proc.stderr}"
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def expectations(path: Path) -> dict[str, dict[str, list[str]] | None]:
    """``machine -> {result request -> [device, ...]}``, or None for "unsatisfiable"."""
    out: dict[str, dict[str, list[str]] | None] = {}
    in_block = False
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if "Allocation on the fake machines" in line:
            in_block = True
            continue
        if not in_block:
            continue
        m = _EXPECT.match(line)
        if m is None:
            if out:
                break
            continue
        machine, rest = m.groups()
        if rest == "unsatisfiable":
            out[machine] = None
            continue
        results: dict[str, list[str]] = {}
        for part in rest.split(";"):
            request, _, devices = part.partition("=")
            results[request.strip()] = devices.split()
        out[machine] = results
    return out


def recorded_vendor(machine: str, vendor: str) -> list[dict[str, Any]] | None:
    """The vendor's slices as the real plugin published them on ``machine`` (None: none
    recorded there; then the vendor's shape is derived from toposlice's GPUs)."""
    name = VENDOR_RECORDED.get((machine, vendor))
    if name is None:
        return None
    return [d for d in yaml.safe_load_all((RECORDED / name).read_text()) if d]


def node_view(machine: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(slices, device classes) for ``<machine>`` or ``<machine> beside <vendor driver>``."""
    name, _, vendor = machine.partition(" beside ")
    if not vendor:
        return list(machine_slices(name)), device_classes()
    view = beside_vendor(machine_slices(name), vendor, NODE, recorded_vendor(name, vendor))
    return view, [*device_classes(), VENDOR_CLASSES[vendor]]


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def template(path: Path) -> dict[str, Any]:
    (t,) = [d for d in docs(path) if d["kind"] == "ResourceClaimTemplate"]
    return t


def grouped(results: list[Result]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in results:
        out.setdefault(r.request, []).append(r.device)
    return out


CASES = [(p, machine) for p in EXAMPLES for machine in expectations(p)]


def test_examples_exist_and_name_machines() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "gpus-nvlink-domain",
        "gpu-nic-same-pcie-root",
        "gpus-cpu-same-numa",
        "whole-node",
        "gpus-8-else-4",
        "vendor-gpu-with-nic-and-cpus",
        "gpu-nic-affinity",
        "gpus-2-each-with-closest-nic",
        "gpus-2-nics-ladder",
    } <= names
    for p in EXAMPLES:
        exp = expectations(p)
        assert exp, f"{p.name}: no 'Allocation on the fake machines' block in its comment"
        assert any(v is not None for v in exp.values()), f"{p.name}: satisfiable nowhere"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_objects_validate(path: Path) -> None:
    version = latest_version()
    for d in docs(path):
        kubernetes_validate.validate(d, version, strict=True)
    t = template(path)
    classes = {c["metadata"]["name"] for c in [*device_classes(), *VENDOR_CLASSES.values()]}
    pod = next(d for d in docs(path) if d["kind"] == "Pod")
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == t["metadata"]["name"]
    for req in t["spec"]["spec"]["devices"]["requests"]:
        for alt in req.get("firstAvailable", [req.get("exactly")]):
            assert alt["deviceClassName"] in classes


@pytest.mark.parametrize(("path", "machine"), CASES, ids=lambda x: getattr(x, "name", x))
def test_example_allocates_as_its_comment_says(path: Path, machine: str) -> None:
    want = expectations(path)[machine]
    alloc = Allocator(*node_view(machine), node=NODE)
    got = alloc.allocate(template(path)["spec"]["spec"])
    if want is None:
        assert got is None, f"{path.name} on {machine}: comment says unsatisfiable, got {got}"
        return
    assert got is not None, f"{path.name} on {machine}: not satisfiable"
    assert grouped(got) == want
    assert all(r.pool == NODE for r in got)
    vendor = machine.partition(" beside ")[2]
    if vendor:  # one claim, devices of two drivers
        assert {r.driver for r in got} == {vendor, "toposlice.dev"}


def relations(slices: Sequence[dict[str, Any]], results: dict[str, list[str]]) -> set[Any]:
    """What makes two answers the same to a workload: per pair of requests, whether their
    devices share a PCIe root and a NUMA node (names aside)."""
    attrs = {d["name"]: d.get("attributes") or {} for s in slices for d in s["spec"]["devices"]}

    def facts(name: str) -> tuple[Any, Any]:
        a = attrs[name]
        return a.get(f"{STD}/pcieRoot"), a.get(f"{STD}/numaNode")

    out = set()
    for r1, d1 in results.items():
        for r2, d2 in results.items():
            if r1 < r2:
                f1, f2 = [facts(d) for d in d1], [facts(d) for d in d2]
                out.add((r1, r2, "root", any(a[0] == b[0] for a in f1 for b in f2)))
                out.add((r1, r2, "numa", any(a[1] == b[1] for a in f1 for b in f2)))
    return out


VENDOR_CASES = [(p, m) for p, m in CASES if " beside " in m and expectations(p)[m] is not None]


@pytest.mark.parametrize(("path", "machine"), VENDOR_CASES, ids=lambda x: getattr(x, "name", x))
def test_vendor_examples_get_an_equivalent_answer_in_every_device_order(
    path: Path, machine: str
) -> None:
    """The vendor's plugin orders its devices differently at each start (measured), so the
    scheduler's first fit changes: the comment's answer is one of several, and every order
    must give one equivalent to it (same counts, same roots and NUMA nodes shared)."""
    want = expectations(path)[machine]
    assert want is not None
    slices, classes = node_view(machine)
    vendor = machine.partition(" beside ")[2]
    base = relations(slices, want)
    theirs = next(s for s in slices if s["spec"]["driver"] == vendor)
    devices = list(theirs["spec"]["devices"])
    orders = [devices[k:] + devices[:k] for k in range(len(devices))] + [devices[::-1]]
    answers = set()
    for order in orders:
        theirs["spec"]["devices"] = order
        got = Allocator(slices, classes, node=NODE).allocate(template(path)["spec"]["spec"])
        assert got is not None, f"{path.name} on {machine}: not satisfiable in some order"
        g = grouped(got)
        assert {k: len(v) for k, v in g.items()} == {k: len(v) for k, v in want.items()}
        assert relations(slices, g) == base, (g, want)
        answers.add(tuple(sorted((k, tuple(v)) for k, v in g.items())))
    assert len(answers) > 1  # the order does change the answer: the comment says so


def pod_affinity(path: Path) -> dict[str, Any] | None:
    pod = next(d for d in docs(path) if d["kind"] == "Pod")
    affinity: dict[str, Any] | None = pod["spec"].get("affinity")
    return affinity


AFFINITY_EXAMPLES = [p for p in EXAMPLES if pod_affinity(p)]


def test_the_dgx_only_examples_carry_a_node_affinity() -> None:
    assert {p.stem for p in AFFINITY_EXAMPLES} >= {"gpus-nvlink-domain", "gpu-nic-same-pcie-root"}


@pytest.mark.parametrize("path", AFFINITY_EXAMPLES, ids=lambda p: p.name)
def test_node_affinity_refuses_only_machines_the_claim_cannot_fit(path: Path) -> None:
    """The affinity is a shortcut for the scheduler, never a rule of its own: on every fake
    machine its NodeFeature labels (what NFD puts on the node) are let through wherever the
    claim allocates, it refuses at least one machine (else it is no use), and a node
    without toposlice's labels (no NFD) is let through."""
    from discovery.fake import list_machines
    from tests.driver_support import snapshot

    affinity = pod_affinity(path)
    spec = template(path)["spec"]["spec"]
    refused = []
    for machine in list_machines():
        labels = {
            f"{PREFIX}/{k}": v
            for k, v in topology_labels(snapshot(machine).inventory, NODE).items()
        }
        got = Allocator(list(machine_slices(machine)), device_classes(), node=NODE).allocate(spec)
        if not admits(affinity, labels):
            assert got is None, f"{path.name}: the affinity refuses {machine}, where it fits"
            refused.append(machine)
    assert refused, f"{path.name}: the affinity refuses no machine"
    assert "pcie-8gpu" in refused
    assert admits(affinity, {"kubernetes.io/hostname": "no-nfd"})


# -- the allocator model itself: it must be able to say no -------------------------------


def _claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict:
    return {"devices": {"requests": list(requests), "constraints": constraints or []}}


def _gpus(count: int) -> dict[str, Any]:
    return {"name": "gpus", "exactly": {"deviceClassName": "gpu.toposlice.dev", "count": count}}


def test_model_refuses_more_devices_than_exist() -> None:
    alloc = Allocator(machine_slices("dgx-h100"), device_classes(), node=NODE)
    assert alloc.allocate(_claim(_gpus(8))) is not None
    assert alloc.allocate(_claim(_gpus(9))) is None


def test_model_skips_devices_already_allocated() -> None:
    alloc = Allocator(machine_slices("dgx-h100"), device_classes(), node=NODE)
    first = alloc.allocate(_claim(_gpus(4)))
    assert first is not None
    taken = [(r.driver, r.pool, r.device) for r in first]
    second = alloc.allocate(_claim(_gpus(4)), allocated=taken)
    assert second is not None
    assert not {r.device for r in first} & {r.device for r in second}
    assert (
        alloc.allocate(
            _claim(_gpus(1)), allocated=taken + [(r.driver, r.pool, r.device) for r in second]
        )
        is None
    )


def test_model_backtracks_into_a_matching_pair() -> None:
    # numa-1 GPU first in request order: first-fit must skip numa-0 CPU groups.
    alloc = Allocator(machine_slices("dgx-h100"), device_classes(), node=NODE)
    numa1 = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
    claim = _claim(
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu.toposlice.dev",
                "selectors": [{"cel": {"expression": numa1}}],
            },
        },
        {"name": "cpu", "exactly": {"deviceClassName": "cpu.toposlice.dev"}},
        constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode"}],
    )
    got = alloc.allocate(claim)
    assert got is not None
    assert grouped(got) == {"gpu": ["gpu-0000-9d-00-0"], "cpu": ["cpu-numa1"]}


def test_model_stops_on_a_selector_error() -> None:
    # An attribute some devices lack, read without a guard, is a CEL error: upstream
    # aborts the claim rather than skipping the device.
    alloc = Allocator(machine_slices("dgx-h100"), device_classes(), node=NODE)
    bad = 'device.attributes["toposlice.dev"].linkLayer == "InfiniBand"'
    claim = _claim(
        {
            "name": "nic",
            "exactly": {
                "deviceClassName": "gpu.toposlice.dev",
                "selectors": [{"cel": {"expression": bad}}],
            },
        }
    )
    with pytest.raises(AllocationError):
        alloc.allocate(claim)


def test_model_ignores_incomplete_pools() -> None:
    (one,) = machine_slices("cloud-vm-1gpu")
    broken = yaml.safe_load(yaml.safe_dump(one))
    broken["spec"]["pool"]["resourceSliceCount"] = 2
    alloc = Allocator([broken], device_classes(), node=NODE)
    assert alloc.devices == []
    assert alloc.allocate(_claim(_gpus(1))) is None
