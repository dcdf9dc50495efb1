"""``toposlice score``: rank placements of a workload request on node topology graphs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toposlice.output import dump


def add_arguments(p: argparse.ArgumentParser) -> None:
    from driver.plumbing.flag_types import count

    p.add_argument("--request", required=True, metavar="REQ.yaml", help="workload request file")
    src = p.add_argument_group("nodes (at least one)")
    src.add_argument(
        "--fake",
        action="append",
        default=[],
        metavar="NAME[:NODE]",
        help="a built-in fake machine (repeatable; NODE renames it)",
    )
    src.add_argument(
        "--graph",
        action="append",
        nargs="+",
        default=[],
        metavar="FILE",
        help="toposlice.graph/v1 files (`toposlice graph -o json`)",
    )
    src.add_argument(
        "--url", action="append", default=[], help="a node's /v1/topology URL (repeatable)"
    )
    p.add_argument("--occupancy", metavar="FILE", help="allocated devices or ResourceClaims")
    p.add_argument(
        "--node-labels",
        metavar="FILE",
        help="YAML/JSON mapping node name -> labels (for the request's nodeLabels filter)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "json"],
        default="table",
        help="table: ranked placements with their score parts; json: {placements: [...]} "
        "(default %(default)s)",
    )
    p.add_argument(
        "--top",
        type=count(1, 1000),
        default=5,
        help="placements to print, 1..1000 (default %(default)s)",
    )
    p.add_argument(
        "--devices",
        metavar="A,B,...",
        help="score this device set instead of searching: GPU<n>/NIC<n> as toposlice graph "
        "lists them, DRA device names or PCI bus ids (as nccl-topo takes them)",
    )
    p.add_argument("--node", help="the node --devices are on (default: the only/first node)")
    p.add_argument(
        "--emit-claim",
        metavar="FILE",
        help="write a List with the ResourceClaimTemplate(s) and DeviceClasses for the best "
        "to FILE (JSON if it ends in .json, else YAML; its directory must exist): a "
        "prioritized list, the chosen devices first, then looser topology classes",
    )
    p.add_argument("--claim-name", default=None, help="template name (default: request name)")
    from normalize.dialects import NIC_DRIVERS

    p.add_argument(
        "--nics-from",
        choices=NIC_DRIVERS,
        default=None,
        metavar="DRIVER",
        help="--emit-claim for a node whose NICs another DRA driver publishes "
        f"({', '.join(NIC_DRIVERS)}): each GPU's scored NICs first, pinned by that driver's "
        "dra.net/pciAddress, then one on its root, else on its NUMA node",
    )


def fake_node(spec: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``NAME[:NODE]`` -> the fake machine's graph and ResourceSlices, published as NODE."""
    from normalize.graph import build_graph
    from normalize.slices import build_slices
    from scorer.topology import rename_graph
    from toposlice.discover import discover

    name, _, node = spec.partition(":")
    if node:
        from toposlice.sources import check_object_name

        check_object_name(f"--fake {spec}: NODE", node, "node")
    inv = discover("/", fake=name)
    graph = build_graph(inv)
    node = node or str(graph.get("node") or name)
    return rename_graph(graph, node), build_slices(inv, node)


def _load_nodes(args: argparse.Namespace) -> tuple[list[Any], dict[str, list[dict[str, Any]]]]:
    from scorer.topology import from_graph, load_graphs, read_graph_file

    labels: dict[str, dict[str, str]] = {}
    if args.node_labels:
        from scorer.request import load_document

        data = load_document(args.node_labels)
        if not isinstance(data, dict):
            raise ValueError(f"{args.node_labels}: expected a mapping node -> labels")
        labels = {str(k): {str(a): str(b) for a, b in (v or {}).items()} for k, v in data.items()}
    nodes = []
    slices: dict[str, list[dict[str, Any]]] = {}
    for spec in args.fake:
        graph, node_slices = fake_node(spec)
        node = str(graph["node"])
        nodes.append(from_graph(graph, labels.get(node)))
        slices[node] = node_slices
    for files in args.graph:
        for f in files:
            g = read_graph_file(f)
            nodes.append(from_graph(g, labels.get(str(g.get("node")))))
    for t in load_graphs(urls=args.url):
        t.labels = labels.get(t.name, {})
        nodes.append(t)
    if not nodes:
        raise ValueError("no nodes: give --fake, --graph or --url")
    names = [t.name for t in nodes]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"two graphs for node {sorted(dup)[0]!r} (rename with --fake NAME:NODE)")
    return nodes, slices


def run(args: argparse.Namespace) -> int:
    from normalize.device_refs import split_refs
    from scorer.claim import claim_list
    from scorer.request import Occupancy, load_occupancy, load_request
    from scorer.score import score_devices
    from scorer.search import ClusterPlacement, place

    refs = split_refs(args.devices)
    if args.claim_name is not None:
        from toposlice.sources import check_object_name

        check_object_name("--claim-name", args.claim_name, "ResourceClaimTemplate")
    if args.emit_claim:
        from toposlice.output import check_output_file

        check_output_file("--emit-claim", args.emit_claim)
    req = load_request(args.request)
    occ = load_occupancy(args.occupancy) if args.occupancy else Occupancy()
    nodes, slices = _load_nodes(args)
    by_name = {t.name: t for t in nodes}
    if refs:
        node = by_name.get(args.node) if args.node else nodes[0]
        if node is None:
            raise ValueError(f"--node {args.node!r}: no such node")
        p = score_devices(node, occ, req, device_names(node, refs))
        results = [ClusterPlacement((p,), p.score, {}, "node")]
    else:
        results = place(nodes, occ, req, args.top)
    placements = [d for r in results for d in r.to_dicts()]
    why = "" if results else why_none(nodes, occ, req)
    if args.output == "json":
        dump({"placements": placements}, "json")
    else:
        sys.stdout.write(_table(results, req, why))
    if not results:
        print(f"toposlice: no placement fits the request: {why}", file=sys.stderr)
    if args.emit_claim and results:
        from toposlice.output import write_output_file

        best = results[0]
        pods = [(by_name[p.node], p) for p in best.pods]
        nics_from = None
        if args.nics_from:
            from scorer.ladder import NeighbourNics

            nics_from = NeighbourNics(args.nics_from, max(req.nics_per_gpu, 1))
        doc = claim_list(args.claim_name or req.name, pods, req, occ, slices, nics_from=nics_from)
        import yaml

        text = (
            json.dumps(doc, indent=2) + "\n"
            if args.emit_claim.endswith(".json")
            else yaml.safe_dump(doc, sort_keys=False)
        )
        write_output_file("--emit-claim", args.emit_claim, text.encode("utf-8"))
    return 0 if results else 1


def device_names(topo: Any, refs: list[str]) -> list[str]:
    """``--devices`` references (``GPU0``, DRA names, bus ids: normalize.device_refs, the
    parser nccl-topo uses) as the node's DRA device names."""
    from normalize.device_refs import resolve_refs

    labels = {g.label.upper(): g.dra_device for g in topo.gpus}
    labels.update({n.label.upper(): n.dra_device for n in topo.nics})
    names = {name: name for name in topo.by_device}
    buses = {v.bus_id: v.dra_device for v in (*topo.gpus, *topo.nics)}
    return resolve_refs(
        refs, labels=labels, names=names, buses=buses, what="a GPU, NIC or CPU group"
    )


def why_none(nodes: list[Any], occ: Any, req: Any) -> str:
    """One line on why no placement fits: labels, then free GPUs, then the rest."""
    from scorer.score import NodeState, node_eligible

    eligible = [t for t in nodes if node_eligible(t, req)]
    if not eligible:
        labels = ",".join(f"{k}={v}" for k, v in sorted(req.node_labels.items()))
        return f"no node has the request's node labels {labels}"
    states = [NodeState(t, occ, req) for t in eligible]
    best = max(states, key=lambda st: len(st.free_gpus))
    kind = "free GPUs"
    if req.min_gpu_memory or req.gpu_attributes:
        kind = "free GPUs with the requested memory and attributes"
    total = sum(len(st.free_gpus) for st in states)
    if len(best.free_gpus) < req.gpus:
        return (
            f"it asks for {req.gpus} GPUs; the most {kind} on one node is "
            f"{len(best.free_gpus)} ({best.topo.name}), {total} on {len(states)} node(s) in all"
        )
    wants = []
    if req.nics_per_gpu:
        wants.append(f"{req.nics_per_gpu} NIC(s) per GPU ({len(best.free_nics)} free)")
    if req.cpus:
        wants.append(f"{req.cpus} CPU device(s) ({len(best.free_cpus)} free)")
    extra = " and ".join(wants) or "its pattern"
    return f"{best.topo.name} has {len(best.free_gpus)} {kind}, but not with {extra}"


def _table(results: list[Any], req: Any = None, why: str = "") -> str:
    if not results:
        return f"(no placement fits: {why})\n" if why else "(no placement fits)\n"
    # Requests without NICs have nothing to say about NIC locality.
    hidden = {"busbw_gbps"}
    if req is not None and not req.nics_per_gpu:
        hidden.add("nic_locality")
    out: list[str] = []
    for rank, r in enumerate(results, 1):
        kind = f" [{r.kind}, {len(r.pods)} pods]" if len(r.pods) > 1 else ""
        out.append(f"#{rank}  score {r.score:7.2f}{kind}")
        for p in r.pods:
            out.append(f"    {p.node}: {', '.join(p.devices)}")
            parts = "  ".join(f"{k}={v:.3g}" for k, v in p.parts.items() if k not in hidden)
            out.append(f"      {parts}")
            for line in p.explain:
                out.append(f"      - {line}")
        if len(r.pods) > 1:
            out.append(f"    job collective {r.parts.get('busbw_gbps', 0):.1f} GB/s")
    return "\n".join(out) + "\n"
