#!/usr/bin/env python3
"""The worst case of every claim toposlice writes: how long the scheduler's allocator can
search one node for it (issue #31).

kube-scheduler runs the structured allocator once per node and pod, and on a node that
cannot hold the claim that search is exhaustive: a claim shape that fits in microseconds
on an empty node can search for seconds on a node one GPU short, and past the
DynamicResources ``filterTimeout`` (10 s) the whole scheduling attempt is thrown away.
Averages hide that; this bench looks for the cliff.

Shapes: ``toposlice claim`` over its flag space as users call it (--gpus 1/2/4/8 x
--nics-per-gpu 0/1/2, with and without --pattern tensor-parallel, --cpu-groups 0/1/2),
``toposlice score --emit-claim`` over examples/requests on every machine, every claim
in examples/ that names only toposlice's DeviceClasses, and (``vendor``) ``toposlice claim
--gpus-from gpu.nvidia.com`` (1/2/4 GPUs x 0/1/2 NICs each within its limit, --cpu-groups
0/1) plus the examples naming ``gpu.nvidia.com``, on dgx-h100 and the GB200 tray as they look
beside NVIDIA's plugin (its slices recorded from the real plugin, toposlice's NICs and CPUs).
Machines: every built-in fake machine. Occupancies, devices taken by other claims: empty,
half of the GPUs and NICs, 90 % of them (random draws), and the adversarial ones: exactly
one GPU short of the claim, and exactly one NIC short.

Each case runs through the allocator model (bench/allocator_cost.search_cost: the
upstream v1.36 search move for move, combinations within a request) and prints, per shape,
its worst case: allocateOne calls and devices looked at, and the time that is on the
real scheduler (``model ms``: calls, device looks and CEL evaluations weighed as fitted to
kube-scheduler v1.36.2 on the 2-core VM; ``--real`` measures it instead). ``>`` marks a
search the model gave up on (``--cap``).

``--real`` runs the worst cases on the real kube-scheduler v1.36.2 (../shared/kube): one
node per (machine, occupancy), the occupancy allocated to an admin claim, and per shape one
pod pinned to each of its worst nodes; the figure is the scheduler's own scheduling attempt
duration (``scheduler_scheduling_attempt_duration_seconds``, exact sum over the pod's first
attempt), which for a pod pinned to one node is that node's Filter plus a fixed overhead
(the plain 2-GPU count's, printed beside it).

Usage: python3 bench/claim_worst_case.py [--shapes claim,emit,examples,vendor] [--machines a,b]
  [--draws 3] [--cap N] [--json FILE] [--real [--real-top K]] [--before]
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import itertools
import json
import random
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.allocator_cost import search_cost  # noqa: E402
from normalize.deviceclasses import device_classes  # noqa: E402

DRIVER = "toposlice.dev"
SELF = (sys.executable, "-m", "toposlice", "-q")
#: Give up on a case past this many allocateOne calls (the real search would go on).
CAP = 300_000
#: The real scheduler's time per allocateOne call, per device looked at inside one and per
#: CEL selector evaluation, fitted (least squares) to kube-scheduler v1.36.2 attempts on
#: one pinned node on the 2-core VM (docs/performance.md, "Claims that fail fast"): CEL
#: dominates small searches, calls large ones.
US_PER_CALL = 3.3
US_PER_SCAN = 0.15
US_PER_CEL = 76.0
GPU_COUNTS = (1, 2, 4, 8)
NIC_COUNTS = (0, 1, 2)
CPU_GROUPS = (0, 1, 2)
PATTERNS = (None, "tensor-parallel")


@dataclass
class Case:
    shape: str
    machine: str
    occupancy: str
    calls: int
    scans: int
    cel: int
    ok: bool
    capped: bool
    busy: tuple[str, ...] = ()

    def ms(self) -> float:
        """The model's figure for the real scheduler's Filter on this node."""
        return (self.calls * US_PER_CALL + self.scans * US_PER_SCAN + self.cel * US_PER_CEL) / 1e3


# --------------------------------------------------------------------------- inputs


def machines() -> list[str]:
    from discovery.fake import list_machines

    return list_machines()


def machine_slices(machine: str, node: str | None = None) -> list[dict[str, Any]]:
    """What `toposlice slices --fake MACHINE --node-name NODE -o json` prints."""
    out = subprocess.run(
        [*SELF, "slices", "--fake", machine, "--node-name", node or machine, "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def claim_shapes() -> dict[str, dict[str, Any]]:
    """``toposlice claim`` over its flag space, built as the command builds it."""
    from toposlice.cmd_claim import build

    out: dict[str, dict[str, Any]] = {}
    for gpus, nics, pattern, cpus in itertools.product(
        GPU_COUNTS, NIC_COUNTS, PATTERNS, CPU_GROUPS
    ):
        args = argparse.Namespace(
            gpus=gpus,
            nics_per_gpu=nics,
            cpu_groups=cpus,
            min_gpu_memory=None,
            pattern=pattern,
            request=None,
            name=None,
            namespace=None,
            driver=DRIVER,
        )
        flags = f"--gpus {gpus}"
        flags += f" --nics-per-gpu {nics}" if nics else ""
        flags += f" --pattern {pattern}" if pattern else ""
        flags += f" --cpu-groups {cpus}" if cpus else ""
        _, spec = build(args)
        out[f"claim {flags}"] = spec
    return out


def emit_shapes(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``toposlice score --request R --fake M --emit-claim F`` for every request example
    on every machine where it places (the claim names that machine's devices first)."""
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for req in sorted((REPO / "examples" / "requests").glob("*.yaml")):
            for m in names:
                f = Path(tmp) / f"{req.stem}-{m}.json"
                cmd = [*SELF, "score", "--request", str(req), "--fake", m, "--emit-claim"]
                proc = subprocess.run(
                    [*cmd, str(f), "-o", "json"],
                    capture_output=True,
                    text=True,
                    cwd=REPO,
                )
                if proc.returncode != 0 or not f.exists():
                    continue  # the request does not place on that machine
                doc = json.loads(f.read_text())
                for item in doc.get("items", [doc]):
                    if item.get("kind") == "ResourceClaimTemplate":
                        out[f"emit {req.stem} @{m}"] = item["spec"]["spec"]
    return out


def example_shapes() -> dict[str, dict[str, Any]]:
    """Every ResourceClaimTemplate in examples/ that names only toposlice's classes."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "ResourceClaimTemplate":
                continue
            spec = doc["spec"]["spec"]
            classes = {
                alt.get("deviceClassName", "")
                for r in spec["devices"]["requests"]
                for alt in r.get("firstAvailable") or [r.get("exactly") or {}]
            }
            if all(c.endswith(f".{DRIVER}") for c in classes):
                out[f"example {path.stem}"] = spec
    return out


VENDOR = "gpu.nvidia.com"
#: Machines with a slice recorded from NVIDIA's plugin (tests/data/foreign-slices/recorded).
VENDOR_RECORDED = {"dgx-h100": "nvidia-gpu.yaml", "gb200-nvl72-tray": "nvidia-gpu-gb200.yaml"}


def vendor_shapes() -> dict[str, dict[str, Any]]:
    """``toposlice claim --gpus-from gpu.nvidia.com`` within its limit, and the examples
    that name the vendor's class."""
    from scorer.vendor_ladder import MAX_PAIRED, VendorGpus, vendor_gpu_spec

    out: dict[str, dict[str, Any]] = {}
    for gpus, nics, cpus in itertools.product((1, 2, 4), NIC_COUNTS, (0, 1)):
        if nics and gpus * nics > MAX_PAIRED:
            continue
        spec = vendor_gpu_spec(VendorGpus(VENDOR, gpus, nics, cpus, DRIVER))
        flags = f"--gpus {gpus} --nics-per-gpu {nics}" + (f" --cpu-groups {cpus}" if cpus else "")
        out[f"vendor claim --gpus-from {VENDOR} {flags}"] = spec
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ResourceClaimTemplate" and VENDOR in json.dumps(doc):
                out[f"vendor example {path.stem}"] = doc["spec"]["spec"]
    return out


def vendor_slices(machine: str) -> list[dict[str, Any]]:
    """The node beside the plugin: toposlice's NICs and CPUs, the plugin's recorded GPUs."""
    from normalize.vendor_view import beside_vendor

    recorded = REPO / "tests" / "data" / "foreign-slices" / "recorded" / VENDOR_RECORDED[machine]
    theirs = [d for d in yaml.safe_load_all(recorded.read_text()) if d]
    return beside_vendor(machine_slices(machine), VENDOR, machine, theirs)


def demand(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(GPUs, NICs) the claim takes at its first choice."""
    gpus = nics = 0
    for r in spec["devices"]["requests"]:
        alt = (r.get("firstAvailable") or [r.get("exactly") or {}])[0]
        cls = alt.get("deviceClassName", "")
        n = int(alt.get("count", 1)) if alt.get("allocationMode", "ExactCount") != "All" else 0
        if cls.startswith("gpu.") or cls == VENDOR:
            gpus += n
        elif cls.startswith("nic."):
            nics += n
    return gpus, nics


def _kind(device: Mapping[str, Any]) -> str:
    return str(device.get("attributes", {}).get("type", {}).get("string", ""))


def occupancies(
    slices: Sequence[Mapping[str, Any]], spec: Mapping[str, Any], draws: int, seed: int
) -> Iterator[tuple[str, set[str]]]:
    """(label, devices taken) for one machine and claim: empty, half and 90 % of the GPUs
    and NICs taken at random (``draws`` each), one GPU short and one NIC short of the
    claim's demand (random ones taken, the rest free)."""
    devs = [d for s in slices for d in s["spec"]["devices"]]
    gpus = [d["name"] for d in devs if _kind(d) == "gpu"]
    nics = [d["name"] for d in devs if _kind(d) == "nic"]
    rng = random.Random(seed)
    yield "empty", set()
    for share, label in ((0.5, "half"), (0.9, "90%")):
        for k in range(draws):
            busy = set(rng.sample(gpus, round(len(gpus) * share)))
            busy |= set(rng.sample(nics, round(len(nics) * share)))
            yield f"{label}#{k}", busy
    want_gpus, want_nics = demand(spec)
    for k in range(draws):
        if 0 < want_gpus <= len(gpus):
            yield f"gpu-short#{k}", set(rng.sample(gpus, len(gpus) - want_gpus + 1))
        if 0 < want_nics <= len(nics):
            yield f"nic-short#{k}", set(rng.sample(nics, len(nics) - want_nics + 1))


# --------------------------------------------------------------------------- model


def run_model(
    shapes: Mapping[str, Mapping[str, Any]],
    slices: Mapping[str, Sequence[Mapping[str, Any]]],
    draws: int,
    cap: int,
) -> list[Case]:
    from normalize.vendor_view import vendor_device_class

    classes = {c["metadata"]["name"]: c for c in device_classes(DRIVER)}
    classes[VENDOR] = vendor_device_class(VENDOR)
    cases: list[Case] = []
    for si, (shape, spec) in enumerate(shapes.items()):
        for m, sl in slices.items():
            for label, busy in occupancies(sl, spec, draws, seed=31 + si):
                c = search_cost(spec, sl, busy, classes, max_tries=cap)
                cases.append(
                    Case(shape, m, label, c.calls, c.scans, c.cel, c.ok, c.capped, tuple(busy))
                )
    return cases


def worst(cases: Sequence[Case]) -> dict[str, Case]:
    out: dict[str, Case] = {}
    for c in cases:
        best = out.get(c.shape)
        if best is None or (c.capped, c.ms()) > (best.capped, best.ms()):
            out[c.shape] = c
    return out


def table(cases: Sequence[Case], before: Mapping[str, Case] | None = None) -> str:
    w = worst(cases)
    rows = []
    head = ["shape", "worst on", "calls", "model ms", "answer"]
    if before:
        head += ["before: on", "calls", "model ms"]
    for shape, c in w.items():
        mark = ">" if c.capped else ""
        answer = "gave up" if c.capped else ("fits" if c.ok else "no fit")
        row = [shape, f"{c.machine} {c.occupancy}", f"{mark}{c.calls:,}", f"{mark}{c.ms():.2f}"]
        row.append(answer)
        if before:
            b = before.get(shape)
            if b:
                bm = ">" if b.capped else ""
                row += [f"{b.machine} {b.occupancy}", f"{bm}{b.calls:,}", f"{bm}{b.ms():.2f}"]
            else:
                row += ["-", "-", "-"]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(widths[i]) for i, v in enumerate(head))]
    lines += ["  ".join(str(v).ljust(widths[i]) for i, v in enumerate(r)) for r in rows]
    over = [c for c in w.values() if c.capped or c.ms() > 50]
    lines.append(
        f"{len(cases)} cases, {len(w)} shapes; worst model ms "
        f"{max((c.ms() for c in w.values()), default=0):.2f}; over 50 ms: {len(over)}"
    )
    return "\n".join(lines)


def gather_shapes(kinds: Sequence[str], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    shapes: dict[str, dict[str, Any]] = {}
    if "claim" in kinds:
        shapes.update(claim_shapes())
    if "emit" in kinds:
        shapes.update(emit_shapes(names))
    if "examples" in kinds:
        shapes.update(example_shapes())
    return shapes


def run_vendor(draws: int, cap: int, match: str) -> list[Case]:
    shapes = {k: v for k, v in vendor_shapes().items() if match in k}
    cases: list[Case] = []
    for m in VENDOR_RECORDED:
        cases += run_model(shapes, {f"{m} beside {VENDOR}": vendor_slices(m)}, draws, cap)
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="claim,emit,examples")
    p.add_argument("--machines", default="", help="comma-separated (default: every one)")
    p.add_argument("--match", default="", help="only shapes whose name contains this")
    p.add_argument("--draws", type=int, default=3, help="random draws per occupancy")
    p.add_argument("--cap", type=int, default=CAP, help="allocateOne calls to give up at")
    p.add_argument("--before", metavar="JSON", help="a --json file to print beside")
    p.add_argument("--json", metavar="FILE", help="write every case here")
    p.add_argument("--real", action="store_true", help="also on the real kube-scheduler")
    p.add_argument("--real-top", type=int, default=2, help="worst nodes per shape (--real)")
    args = p.parse_args(argv)
    names = [m for m in args.machines.split(",") if m] or machines()
    kinds = args.shapes.split(",")
    shapes = gather_shapes(kinds, names)
    if args.match:
        shapes = {k: v for k, v in shapes.items() if args.match in k}
    slices = {m: machine_slices(m) for m in names} if shapes else {}
    cases = run_model(shapes, slices, args.draws, args.cap)
    if "vendor" in kinds:
        cases += run_vendor(args.draws, args.cap, args.match)
    before = None
    if args.before:
        data = json.loads(Path(args.before).read_text())
        before = worst([Case(**{**c, "busy": tuple(c["busy"])}) for c in data["cases"]])
    print(table(cases, before))
    if args.json:
        from driver.plumbing.atomic import write_atomic

        doc = {"cases": [asdict(c) for c in cases]}
        write_atomic(Path(args.json), json.dumps(doc).encode())
    if args.real:
        from bench.claim_worst_case_real import run_real

        print(run_real(shapes, cases, names, args.real_top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
