"""``toposlice claim``: a prioritized-list ResourceClaimTemplate for "N GPUs with NICs",
without a scoring run: topology classes best first, plain counts last (scorer/ladder.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toposlice.output import dump


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, help="GPUs per pod (or from --request)")
    p.add_argument("--nics-per-gpu", type=int, default=None, help="GPUDirect NICs per GPU")
    p.add_argument("--cpu-groups", type=int, default=0, help="CPU-group devices (default 0)")
    p.add_argument("--min-gpu-memory", default=None, help="GPU memory at least (e.g. 40Gi)")
    p.add_argument("--request", metavar="REQ.yaml", help="a scorer request file to read from")
    p.add_argument("--name", default=None, help="template name (default: request name)")
    p.add_argument("--namespace", default=None)
    p.add_argument("--driver", default="toposlice.dev", help="DRA driver name")
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.add_argument(
        "--fake",
        action="append",
        default=[],
        metavar="NAME",
        help="also print (stderr) what the allocator model gives on this fake machine, empty",
    )


def build(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(template name, ResourceClaimSpec) from the arguments; ValueError on bad input."""
    from scorer.claim import gpu_selectors
    from scorer.ladder import ladder_spec
    from scorer.request import Request, load_request, parse_quantity

    req = load_request(args.request) if args.request else None
    gpus = args.gpus if args.gpus is not None else (req.gpus if req else None)
    if gpus is None:
        raise ValueError("--gpus (or --request) is required")
    if not 1 <= gpus <= 64:
        raise ValueError(f"--gpus {gpus}: must be 1..64")
    nics = args.nics_per_gpu if args.nics_per_gpu is not None else (req.nics_per_gpu if req else 0)
    if not 0 <= nics <= 8:
        raise ValueError(f"--nics-per-gpu {nics}: must be 0..8")
    if not 0 <= args.cpu_groups <= 8:
        raise ValueError(f"--cpu-groups {args.cpu_groups}: must be 0..8")
    memory = req.min_gpu_memory if req else 0
    if args.min_gpu_memory is not None:
        memory = parse_quantity(args.min_gpu_memory)
    base = req or Request(gpus=gpus)
    sel_req = Request(
        gpus=gpus,
        min_gpu_memory=memory,
        gpu_attributes=dict(base.gpu_attributes),
    )
    selectors = gpu_selectors(sel_req, args.driver)
    spec = ladder_spec(gpus, nics, args.driver, selectors, args.cpu_groups)
    name = args.name or (req.name if req else f"gpus-{gpus}" + (f"-nics-{nics}" if nics else ""))
    return name, spec


def run(args: argparse.Namespace) -> int:
    from normalize.deviceclasses import device_classes

    name, spec = build(args)
    meta: dict[str, Any] = {"name": name}
    if args.namespace:
        meta["namespace"] = args.namespace
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {"spec": spec},
    }
    used = {
        alt["deviceClassName"]
        for r in spec["devices"]["requests"]
        for alt in r.get("firstAvailable") or [r.get("exactly") or {}]
    }
    classes = [c for c in device_classes(args.driver) if c["metadata"]["name"] in used]
    doc = {"apiVersion": "v1", "kind": "List", "items": [template, *classes]}
    for machine in args.fake:
        print(f"# {machine}: {_on_machine(machine, spec, args.driver)}", file=sys.stderr)
    if args.output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        dump(doc, "yaml")
    return 0


def _on_machine(machine: str, spec: dict[str, Any], driver: str) -> str:
    from normalize.deviceclasses import device_classes
    from normalize.options import NormalizeOptions
    from normalize.slices import build_slices
    from scorer.allocator import Allocator
    from scorer.ladder import prioritized_score
    from toposlice.discover import discover

    inv = discover("/", fake=machine)
    slices = build_slices(inv, "node", NormalizeOptions(driver=driver))
    got = Allocator(slices, device_classes(driver), "node").allocate(spec)
    if got is None:
        return "unsatisfiable"
    score = prioritized_score(spec, [r.request for r in got])
    return f"score {score}; " + "; ".join(f"{r.request} = {r.device}" for r in got)
