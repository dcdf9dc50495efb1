"""``toposlice claim``: a prioritized-list ResourceClaimTemplate for "N GPUs with NICs",
without a scoring run: topology classes best first, plain counts last (scorer/ladder.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toposlice.output import dump


def add_arguments(p: argparse.ArgumentParser) -> None:
    from driver.plumbing.flag_types import count
    from scorer.request import PATTERNS

    p.add_argument("--gpus", type=count(1, 64), help="GPUs per pod, 1..64 (or from --request)")
    p.add_argument(
        "--nics-per-gpu", type=count(0, 8), default=None, help="GPUDirect NICs per GPU, 0..8"
    )
    p.add_argument(
        "--cpu-groups", type=count(0, 8), default=0, help="CPU-group devices, 0..8 (default 0)"
    )
    from normalize.dialects import CPU_DRIVERS, GPU_DRIVERS, NIC_DRIVERS

    p.add_argument(
        "--gpus-from",
        choices=GPU_DRIVERS,
        default=None,
        metavar="DRIVER",
        help=f"take the GPUs from this DRA driver ({', '.join(GPU_DRIVERS)}), each with "
        "toposlice's RDMA NIC on its PCIe root, else on its NUMA node (--nics-per-gpu, default "
        "1; GPUs x NICs per GPU at most 4), --cpu-groups on the first GPU's NUMA node",
    )

    p.add_argument(
        "--nics-from",
        choices=NIC_DRIVERS,
        default=None,
        metavar="DRIVER",
        help=f"take each GPU's NICs ({', '.join(NIC_DRIVERS)}: RDMA functions) from this DRA "
        "driver: on the GPU's PCIe root, else on its NUMA node (dra.net/numaNode: `run` "
        "publishes it beside that driver); --nics-per-gpu of them (default 1)",
    )
    p.add_argument(
        "--cpus-from",
        choices=CPU_DRIVERS,
        default=None,
        metavar="DRIVER",
        help=f"take the CPUs from this DRA driver ({', '.join(CPU_DRIVERS)}), all on the GPUs' "
        "NUMA node (matchAttribute dra.net/numaNode: `run` publishes it beside that driver); "
        "instead of --cpu-groups",
    )
    p.add_argument(
        "--cpus", type=count(1, 4096), default=None, help="CPUs to take with --cpus-from"
    )
    p.add_argument(
        "--cpu-device-mode",
        choices=["grouped", "individual"],
        default="grouped",
        help="how --cpus-from's driver publishes CPUs: grouped (one device per NUMA node, "
        "CPUs as its capacity; dra-driver-cpu's default) or individual (one device per CPU) "
        "(default %(default)s)",
    )
    p.add_argument(
        "--min-gpu-memory", default=None, metavar="QUANTITY", help="GPU memory at least (40Gi)"
    )
    p.add_argument(
        "--pattern",
        choices=PATTERNS,
        default=None,
        metavar="PATTERN",
        help=f"the workload ({', '.join(PATTERNS)}; or from --request): one that runs at least "
        "twice as long on PCIe as on NVLink (all but pipeline-parallel and independent) gets "
        "a scale-up (NVLink / xGMI) rung first; without a pattern, no such rung",
    )
    p.add_argument("--request", metavar="REQ.yaml", help="a scorer request file to read from")
    p.add_argument("--name", default=None, help="template name (default: request name)")
    p.add_argument("--namespace", default=None, help="the template's namespace (default: none)")
    p.add_argument("--driver", default="toposlice.dev", help="DRA driver name")
    p.add_argument(
        "-o",
        "--output",
        choices=["yaml", "json"],
        default="yaml",
        help="a v1 List of the template and its DeviceClasses (default %(default)s)",
    )
    p.add_argument(
        "--fake",
        action="append",
        default=[],
        metavar="NAME",
        help="also print (stderr) what the allocator model gives on this fake machine, empty, "
        "and its score (the one `toposlice score --devices` gives that set)",
    )


def build(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(template name, ResourceClaimSpec) from the arguments; ValueError on bad input."""
    from scorer.claim import gpu_selectors
    from scorer.ladder import ladder_spec, wants_scaleup
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
        try:
            memory = parse_quantity(args.min_gpu_memory)
        except ValueError as exc:
            raise ValueError(f"--min-gpu-memory {args.min_gpu_memory!r}: {exc}") from exc
    base = req or Request(gpus=gpus)
    sel_req = Request(
        gpus=gpus,
        min_gpu_memory=memory,
        gpu_attributes=dict(base.gpu_attributes),
    )
    selectors = gpu_selectors(sel_req, args.driver)
    # The scale-up rung costs the scheduler a device scan on every node without NVLink
    # or xGMI, so it is spent only where the workload is stated and gains from it.
    pattern = args.pattern or (req.pattern if req else None)
    scaleup = pattern is not None and wants_scaleup(pattern, gpus)
    if getattr(args, "gpus_from", None):
        spec, nics = _vendor_spec(args, gpus, nics, selectors)
    elif getattr(args, "nics_from", None):
        from scorer.ladder import NeighbourNics, neighbour_nic_spec

        if args.cpu_groups:
            raise ValueError("--nics-from with toposlice's CPU groups: use --cpus-from")
        per = args.nics_per_gpu if args.nics_per_gpu is not None else max(nics, 1)
        if per < 1:
            raise ValueError("--nics-from needs --nics-per-gpu of 1 or more")
        spec = neighbour_nic_spec(
            gpus, NeighbourNics(args.nics_from, per), args.driver, selectors, neighbour_cpus(args)
        )
        nics = per
    else:
        spec = ladder_spec(
            gpus,
            nics,
            args.driver,
            selectors,
            args.cpu_groups,
            scaleup=scaleup,
            cpus_from=neighbour_cpus(args),
        )
    name = args.name or (req.name if req else f"gpus-{gpus}" + (f"-nics-{nics}" if nics else ""))
    from toposlice.sources import check_object_name

    check_object_name("--name" if args.name else "the request's name", name, "object")
    if args.namespace is not None:
        from normalize.validation import is_dns_label

        if not is_dns_label(args.namespace):
            raise ValueError(f"--namespace {args.namespace!r} is not a DNS-1123 label")
    return name, spec


def _vendor_spec(
    args: argparse.Namespace, gpus: int, nics: int, selectors: list[str]
) -> tuple[dict[str, Any], int]:
    """``--gpus-from``: the vendor's GPUs with toposlice's NICs and CPU groups."""
    from scorer.vendor_ladder import MAX_PAIRED, VendorGpus, vendor_gpu_spec

    if getattr(args, "nics_from", None) or getattr(args, "cpus_from", None):
        raise ValueError(
            "--gpus-from takes toposlice's NICs and CPUs (--nics-per-gpu, --cpu-groups)"
        )
    if getattr(args, "pattern", None) or selectors:
        raise ValueError(
            "--gpus-from: the vendor's GPUs carry none of toposlice's attributes "
            "(--pattern, --min-gpu-memory, request GPU attributes)"
        )
    per = args.nics_per_gpu if args.nics_per_gpu is not None else max(nics, 1)
    if per and gpus * per > MAX_PAIRED:
        raise ValueError(
            f"--gpus-from with --gpus {gpus} x --nics-per-gpu {per}: at most {MAX_PAIRED} "
            "GPU-NIC pairs (the vendor's GPUs have no ordinal to keep the scheduler's search "
            "short on a node one NIC short; docs/integrations.md); toposlice's own GPUs "
            "(publish: [gpu, ...]) take any count"
        )
    want = VendorGpus(args.gpus_from, gpus, per, args.cpu_groups, args.driver)
    return vendor_gpu_spec(want), per


def neighbour_cpus(args: argparse.Namespace) -> Any:
    """``--cpus-from`` / ``--cpus`` / ``--cpu-device-mode`` as a NeighbourCpus, or None."""
    from scorer.ladder import NeighbourCpus

    cpus_from = getattr(args, "cpus_from", None)
    cpus = getattr(args, "cpus", None)
    if cpus_from is None:
        if cpus is not None:
            raise ValueError("--cpus needs --cpus-from (toposlice's own CPUs: --cpu-groups)")
        return None
    if getattr(args, "cpu_groups", 0):
        raise ValueError("--cpus-from and --cpu-groups: take CPUs from one driver")
    if cpus is None:
        raise ValueError(f"--cpus-from {cpus_from} needs --cpus N")
    return NeighbourCpus(cpus_from, cpus, individual=args.cpu_device_mode == "individual")


def run(args: argparse.Namespace) -> int:
    from normalize.deviceclasses import device_classes
    from toposlice.sources import check_fake

    name, spec = build(args)
    for machine in args.fake:
        check_fake(machine)
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
    # Another driver's DeviceClass comes with that driver: only toposlice's are listed.
    classes = [c for c in device_classes(args.driver) if c["metadata"]["name"] in used]
    doc = {"apiVersion": "v1", "kind": "List", "items": [template, *classes]}
    for machine in args.fake:
        print(f"# {machine}: {_on_machine(machine, spec, args)}", file=sys.stderr)
    if args.output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        dump(doc, "yaml")
    return 0


def _on_machine(machine: str, spec: dict[str, Any], args: argparse.Namespace) -> str:
    """What the allocator model picks on the empty machine, with the score of that
    device set: the scorer's (``score_devices``, what ``toposlice score --devices``
    reports), not the scheduler's prioritized-list rank, so the two commands agree."""
    from normalize.deviceclasses import device_classes
    from normalize.graph import build_graph
    from normalize.options import NormalizeOptions
    from normalize.slices import build_slices
    from scorer.allocator import Allocator
    from scorer.request import Occupancy
    from scorer.score import score_devices
    from scorer.topology import from_graph
    from toposlice.discover import discover

    driver = args.driver
    opts = NormalizeOptions(driver=driver)
    inv = discover("/", fake=machine)
    slices = build_slices(inv, "node", opts)
    note = ""
    foreign = [
        f
        for f in (
            getattr(args, "cpus_from", None),
            getattr(args, "nics_from", None),
        )
        if f
    ]
    if foreign:
        # The model holds toposlice's devices only: it places the GPUs alone.
        note = f" ({' and '.join(foreign)} devices not modelled)"
        devices = spec["devices"]
        theirs = {"cpus"} | {r["name"] for r in devices["requests"] if r["name"][:4] == "nic-"}
        spec = {
            "devices": {
                "requests": [r for r in devices["requests"] if r["name"] not in theirs],
                "constraints": [
                    c
                    for c in devices.get("constraints", [])
                    if not theirs & {ref.split("/")[0] for ref in c["requests"]}
                ],
            }
        }
    classes = device_classes(driver)
    vendor = getattr(args, "gpus_from", None)
    if vendor:
        from normalize.vendor_view import beside_vendor, vendor_device_class

        got = Allocator(
            beside_vendor(slices, vendor, "node"), [*classes, vendor_device_class(vendor)], "node"
        ).allocate(spec)
        if got is None:
            return "unsatisfiable beside " + vendor
        picked = "; ".join(f"{r.request} = {r.device}" for r in got)
        return f"beside {vendor} (its GPUs named by NVML index): {picked}"
    got = Allocator(slices, classes, "node").allocate(spec)
    if got is None:
        return "unsatisfiable" + note
    topo = from_graph(build_graph(inv, opts, node_name="node"))
    req = _score_request(args, spec)
    placement = score_devices(topo, Occupancy(), req, [r.device for r in got])
    picked = "; ".join(f"{r.request} = {r.device}" for r in got)
    return f"score {placement.score:.2f}; {picked}{note}"


def _score_request(args: argparse.Namespace, spec: dict[str, Any]) -> Any:
    """The scorer request the claim stands for: ``--request``'s, or the one a request file
    with these counts gives (its defaults: pattern data-parallel beyond one GPU)."""
    import dataclasses

    from scorer.request import load_request, request_from_dict

    if args.request:
        req = load_request(args.request)
    else:
        req = request_from_dict({"gpus": args.gpus}, "--gpus")
    gpus = args.gpus if args.gpus is not None else req.gpus
    nics = args.nics_per_gpu if args.nics_per_gpu is not None else req.nics_per_gpu
    pattern = args.pattern or req.pattern
    return dataclasses.replace(
        req, gpus=gpus, nics_per_gpu=nics, cpus=args.cpu_groups, pattern=pattern
    )
