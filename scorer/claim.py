"""The ResourceClaimTemplate that makes the stock allocator land the scorer's choice.

An extender ranks whole nodes; the claim carries the choice down to devices. For each pod
the scorer writes the most general claim that still lands on the chosen devices (or a set
of equal score): device counts per DeviceClass, GPU↔NIC pairs tied by ``matchAttribute`` on
``resource.kubernetes.io/pcieRoot`` (else ``numaNode``), and a ``numaNode`` constraint when
the whole set shares a NUMA node. When the node's slices are at hand, that claim is run
through the allocator model (``scorer.allocator``, CEL by a CEL library) against the node's
occupancy; if first-fit would pick a worse set, CEL selectors pin each request to the
chosen devices by ``resource.kubernetes.io/pciBusID`` (CPU groups by ``numaNode`` and ``cpuList``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from normalize.deviceclasses import device_class_name, device_classes

from .allocator import AllocationError, allocate
from .ladder import Chosen, NeighbourNics, ladder_spec, neighbour_nic_spec
from .request import Occupancy, Request
from .score import Placement, assign_nics, score_devices
from .topology import GpuView, NicView, NodeTopology

STD = "resource.kubernetes.io"
API = "resource.k8s.io/v1"
MAX_REQUESTS = 32


def _attr(expr_domain: str, name: str) -> str:
    return f'device.attributes["{expr_domain}"].{name}'


def _in(domain: str, name: str, values: Sequence[Any]) -> str:
    return f"{_attr(domain, name)} in {json.dumps(list(values))}"


def gpu_selectors(req: Request, driver: str) -> list[str]:
    out = []
    if req.min_gpu_memory:
        out.append(
            f'device.capacity["{driver}"].memory.compareTo(quantity("{req.min_gpu_memory}")) >= 0'
        )
    for key, value in sorted(req.gpu_attributes.items()):
        out.append(f"{_attr(driver, key)} == {json.dumps(value)}")
    return out


def _exact(cls: str, count: int, selectors: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return body


def pod_claim_spec(topo: NodeTopology, req: Request, p: Placement, pin: bool) -> dict[str, Any]:
    """The ResourceClaimSpec for one pod's placement ``p``."""
    driver = topo.driver
    gpus = [topo.gpu(v) for v in p.gpus]
    nics = [n for n in topo.nics if n.vid in p.nics]
    cpus = [c for c in topo.cpus if c.vid in p.cpus]
    per = len(nics) // len(gpus) if gpus else 0
    gsel = gpu_selectors(req, driver)
    gpin = [_in(STD, "pciBusID", sorted(g.bus_id for g in gpus))] if pin else []
    npin = [_in(STD, "pciBusID", sorted(n.bus_id for n in nics))] if pin and nics else []
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    gpu_reqs: list[str] = []
    nic_reqs: list[str] = []
    paired = per > 0 and 2 * len(gpus) + (1 if cpus else 0) <= MAX_REQUESTS
    if paired:
        pairs = assign_nics(topo, gpus, nics, per) or []
        nic_requests: list[dict[str, Any]] = []
        # Every GPU request before the NICs: a node with too few free GPUs fails before
        # the allocator evaluates a NIC (docs/performance.md#claims-at-cluster-size).
        for i, g in enumerate(sorted(gpus, key=lambda x: x.bus_id)):
            mine = [n for gg, n in pairs if gg.vid == g.vid]
            gname, nname = f"gpu-{i}", f"nic-{i}"
            requests.append({"name": gname, "exactly": _exact(_cls("gpu", driver), 1, gsel + gpin)})
            nic_requests.append({"name": nname, "exactly": _exact(_cls("nic", driver), per, npin)})
            gpu_reqs.append(gname)
            nic_reqs.append(nname)
            attr = pair_attribute(driver, g, mine)
            if attr:
                constraints.append({"requests": [gname, nname], "matchAttribute": attr})
        requests += nic_requests
    else:
        requests.append(
            {"name": "gpu", "exactly": _exact(_cls("gpu", driver), len(gpus), gsel + gpin)}
        )
        gpu_reqs.append("gpu")
        if nics:
            requests.append(
                {"name": "nic", "exactly": _exact(_cls("nic", driver), len(nics), npin)}
            )
            nic_reqs.append("nic")
    if len(gpus) > 1 and len({g.pcie_root for g in gpus}) == 1 and gpus[0].pcie_root:
        constraints.append({"requests": list(gpu_reqs), "matchAttribute": f"{STD}/pcieRoot"})
    cpu_reqs: list[str] = []
    if cpus:
        csel: list[str] = []
        if pin:
            csel.append(_in(STD, "numaNode", sorted({c.numa for c in cpus if c.numa is not None})))
            lists = [_cpu_list(topo, c.dra_device) for c in cpus]
            if all(lists):
                csel.append(_in(driver, "cpuList", sorted(x for x in lists if x)))
        requests.append({"name": "cpu", "exactly": _exact(_cls("cpu", driver), len(cpus), csel)})
        cpu_reqs.append("cpu")
    numas = {g.numa for g in gpus} | {n.numa for n in nics} | {c.numa for c in cpus}
    if len(numas) == 1 and None not in numas and len(requests) > 1:
        constraints.append(
            {"requests": gpu_reqs + nic_reqs + cpu_reqs, "matchAttribute": f"{STD}/numaNode"}
        )
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}


def pair_attribute(driver: str, g: GpuView, nics: Sequence[NicView]) -> str | None:
    """The tightest attribute a GPU shares with all its NICs: ``pcieRoot``, else
    ``toposlice.dev/nicAffinity`` (its closest-NIC group), else ``numaNode``; None when
    they share none of them (a NIC across sockets)."""
    if not nics:
        return None
    if g.pcie_root and all(n.pcie_root == g.pcie_root for n in nics):
        return f"{STD}/pcieRoot"
    if g.nic_affinity and all(n.nic_affinity == g.nic_affinity for n in nics):
        return f"{driver}/nicAffinity"
    if g.numa is not None and all(n.numa == g.numa for n in nics):
        return f"{STD}/numaNode"
    return None


def _cls(kind: str, driver: str) -> str:
    return device_class_name(kind, driver)


def _cpu_list(topo: NodeTopology, device: str) -> str | None:
    for v in topo.graph.get("vertices", []):
        a = v.get("attrs", {})
        if v.get("kind") == "cpu_group" and a.get("dra_device") == device:
            cpus = a.get("cpus")
            return cpus if isinstance(cpus, str) and len(cpus) <= 64 else None
    return None


def verify(
    topo: NodeTopology,
    req: Request,
    occ: Occupancy | None,
    p: Placement,
    spec: dict[str, Any],
    slices: list[dict[str, Any]],
) -> tuple[bool, list[str]]:
    """Does the allocator model, on ``slices`` with ``occ``'s devices in use, allocate ``p``'s
    devices or a set with the same score? Returns (ok, allocated device names)."""
    occ = occ or Occupancy()
    in_use = [(topo.driver, topo.pool, d) for d in occ.used(topo.pool)]
    try:
        results = allocate(spec, slices, device_classes(topo.driver), in_use, topo.pool)
    except AllocationError:
        return False, []
    names = [r.device for r in results]
    if sorted(names) == sorted(p.devices):
        return True, names
    sub = req.with_gpus(len(p.gpus))
    want = score_devices(topo, occ, sub, p.devices).score
    try:
        got = score_devices(topo, occ, sub, names).score
    except ValueError:
        return False, names
    return abs(got - want) < 1e-6, names


def claim_spec_for(
    topo: NodeTopology,
    req: Request,
    occ: Occupancy | None,
    p: Placement,
    slices: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The general claim when the allocator model lands it right, else the pinned one."""
    if slices is not None:
        general = pod_claim_spec(topo, req, p, pin=False)
        if verify(topo, req, occ, p, general, slices)[0]:
            return general
    return pod_claim_spec(topo, req, p, pin=True)


def ladder_spec_for(
    topo: NodeTopology,
    req: Request,
    occ: Occupancy | None,
    p: Placement,
    slices: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """A prioritized-list claim (``scorer.ladder``) whose first rung is the chosen set and
    whose later rungs are the looser topology classes, down to plain counts: the stock
    scheduler lands the choice while it is free and the best class left when it is not.
    When the node's slices are at hand and the allocator model does not land the choice
    (or an equal-score set) through it, the pinned hard claim is returned instead."""
    gpus = [topo.gpu(v) for v in p.gpus]
    nics = [n for n in topo.nics if n.vid in p.nics]
    cpus = [c for c in topo.cpus if c.vid in p.cpus]
    per = len(nics) // len(gpus) if gpus and nics else 0
    pairs = assign_nics(topo, gpus, nics, per) or [] if per else []
    mine = {g.vid: [n for gg, n in pairs if gg.vid == g.vid] for g in gpus}
    attrs = {g.vid: pair_attribute(topo.driver, g, mine[g.vid]) for g in gpus}
    tight = [f"{STD}/pcieRoot", f"{topo.driver}/nicAffinity", f"{STD}/numaNode", None]
    order = sorted(gpus, key=lambda g: (tight.index(attrs[g.vid]), g.bus_id))
    # A paired rung no GPU of the choice can take (no closest NIC: GB200) is left out.
    drop = set() if all(g.nic_affinity for g in gpus) else {"paired"}
    cpu_sel: list[str] = []
    if cpus:
        cpu_sel.append(_in(STD, "numaNode", sorted({c.numa for c in cpus if c.numa is not None})))
        lists = [_cpu_list(topo, c.dra_device) for c in cpus]
        if all(lists):
            cpu_sel.append(_in(topo.driver, "cpuList", sorted(x for x in lists if x)))
    chosen = Chosen(
        gpu_bus_ids=tuple(g.bus_id for g in order),
        pair_attribute=tuple(attrs[g.vid] for g in order),
        nic_bus_ids=tuple(tuple(sorted(n.bus_id for n in mine[g.vid])) for g in order),
        cpu_selectors=tuple(cpu_sel),
        drop_rungs=frozenset(drop),
    )
    spec = ladder_spec(
        len(gpus),
        per,
        topo.driver,
        gpu_selectors(req, topo.driver),
        len(cpus),
        chosen,
    )
    if slices is not None and not verify(topo, req, occ, p, spec, slices)[0]:
        return pod_claim_spec(topo, req, p, pin=True)
    return spec


def neighbour_spec_for(
    topo: NodeTopology, req: Request, p: Placement, nics: NeighbourNics
) -> dict[str, Any]:
    """The claim for a placement whose NICs another driver publishes (dranet): each GPU its
    scored GPU and NICs first (pinned), then a NIC on its root, else on its NUMA node
    (scorer.ladder.neighbour_nic_spec). Not checked against the allocator model, which
    holds toposlice's devices only."""
    gpus = sorted((topo.gpu(v) for v in p.gpus), key=lambda g: g.bus_id)
    picked = [n for n in topo.nics if n.vid in p.nics]
    per = nics.per_gpu
    pairs = assign_nics(topo, gpus, picked, per) or [] if picked else []
    mine = {g.vid: [n for gg, n in pairs if gg.vid == g.vid] for g in gpus}
    chosen = Chosen(
        gpu_bus_ids=tuple(g.bus_id for g in gpus),
        pair_attribute=tuple(pair_attribute(topo.driver, g, mine[g.vid]) for g in gpus),
        nic_bus_ids=tuple(tuple(sorted(n.bus_id for n in mine[g.vid])) for g in gpus),
    )
    return neighbour_nic_spec(
        len(gpus), nics, topo.driver, gpu_selectors(req, topo.driver), chosen=chosen
    )


def claim_list(
    name: str,
    pods: Sequence[tuple[NodeTopology, Placement]],
    req: Request,
    occ: Occupancy | None = None,
    slices: dict[str, list[dict[str, Any]]] | None = None,
    namespace: str | None = None,
    ladder: bool = True,
    nics_from: NeighbourNics | None = None,
) -> dict[str, Any]:
    """A ``List`` with one ResourceClaimTemplate per pod and the DeviceClasses they name:
    prioritized-list ladders (``ladder_spec_for``), or with ``ladder=False`` the single
    general-or-pinned claim (``claim_spec_for``)."""
    items: list[dict[str, Any]] = []
    driver = pods[0][0].driver if pods else "toposlice.dev"
    for i, (topo, p) in enumerate(pods):
        node_slices = (slices or {}).get(topo.name)
        if nics_from is not None:
            spec = neighbour_spec_for(topo, req, p, nics_from)
        elif ladder:
            spec = ladder_spec_for(topo, req, occ, p, node_slices)
        else:
            spec = claim_spec_for(topo, req, occ, p, node_slices)
        meta: dict[str, Any] = {
            "name": name if len(pods) == 1 else f"{name}-{i}",
            "annotations": {"toposlice.dev/node": topo.name},
        }
        if namespace:
            meta["namespace"] = namespace
        items.append(
            {
                "apiVersion": API,
                "kind": "ResourceClaimTemplate",
                "metadata": meta,
                "spec": {"spec": spec},
            }
        )
    used = {
        alt["deviceClassName"]
        for it in items
        for r in it["spec"]["spec"]["devices"]["requests"]
        for alt in r.get("firstAvailable") or [r.get("exactly") or {}]
        if "deviceClassName" in alt
    }
    items += [c for c in device_classes(driver) if c["metadata"]["name"] in used]
    return {"apiVersion": "v1", "kind": "List", "items": items}
