"""Claim ladders: soft topology through ``firstAvailable`` prioritized lists.

A hard claim pins one device set; when that set is taken between scoring and allocation the
pod waits. A ladder lists the topology classes best first, each as a sub-request, so the
stock scheduler allocates the best class that is free at that moment: the allocator tries
sub-requests in order (backtracking across requests), and since Kubernetes 1.35 the
scheduler also prefers the node whose allocation uses the best-ranked sub-requests
(:func:`prioritized_score`).

Without NICs, one request ``gpus`` with ``count`` N in every rung:

====== =========================================================================
rung   the N GPUs share
====== =========================================================================
nvlink ``toposlice.dev/nvlinkDomain`` (one NVSwitch board / NVLink rack)
xgmi   ``toposlice.dev/xgmiHive`` (one xGMI mesh)
switch ``toposlice.dev/pcieSwitch``
root   ``resource.kubernetes.io/pcieRoot``
numa   ``resource.kubernetes.io/numaNode``
any    nothing (plain count)
====== =========================================================================

A single GPU without NICs asks first for a GPU outside any NVLink domain or xGMI hive
(``pcie``), then ``any``: it should not break a block a multi-GPU job needs.

With NICs, one ``gpu-i`` / ``nic-i`` request pair per GPU. ``gpu-i`` has the rungs below;
``nic-i`` has the sub-requests ``paired`` then ``unpaired`` (``nicsPerGpu`` NICs each).
Constraints name sub-requests, so a constraint binds only when that rung is the one chosen:

======== ==================================== ==========================================
rung     the GPUs of this rung share          GPU i and ``nic-i/paired`` share
======== ==================================== ==========================================
nvlink   ``nvlinkDomain``                     ``pcieRoot``
xgmi     ``xgmiHive``                         ``toposlice.dev/nicAffinity``
switch   ``pcieSwitch`` and ``numaNode``      —
root     ``numaNode`` (with switch, socket)   ``pcieRoot``
socket   ``numaNode`` (with switch, root)     —
affinity —                                    ``nicAffinity``
any      —                                    —
======== ==================================== ==========================================

A paired rung may not take ``nic-i/unpaired`` (a constraint ``matchAttribute:
toposlice.dev/type`` over the paired GPU rungs and ``nic-i/unpaired``: a GPU and a NIC never
share a type, and that constraint binds nothing else), so the allocator tries every GPU of
a paired rung before it drops to a looser one. ``nic-i/paired`` needs a NIC with
``pcieRoot`` and ``nicAffinity`` (one close to some GPU); a machine without such NICs
(GB200 trays) still gets its GPUs and NICs through the unpaired rungs.

Per pair that is 1 + the pair attributes in use constraints, plus 4 set constraints and one
for CPUs: all rungs up to 9 pairs (32 constraints); 10..13 pairs drop the ``nicAffinity``
rungs; beyond that (or above 16 GPUs: 32 requests) the count ladder with a ``nics`` request.
With a chosen placement (``--emit-claim``), ``gpu-i/chosen`` (that GPU, pinned by
``pciBusID``) and ``nic-i/chosen`` come first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normalize.deviceclasses import device_class_name

STD = "resource.kubernetes.io"
PCIE_ROOT = f"{STD}/pcieRoot"
NUMA_NODE = f"{STD}/numaNode"
PCI_BUS_ID = f"{STD}/pciBusID"
MAX_SUBREQUESTS = 8
MAX_REQUESTS = 32
MAX_CONSTRAINTS = 32
MAX_CONSTRAINT_REFS = 32

SET_RUNGS: tuple[tuple[str, str | None], ...] = (
    ("nvlink", "nvlinkDomain"),
    ("xgmi", "xgmiHive"),
    ("switch", "pcieSwitch"),
    ("root", PCIE_ROOT),
    ("numa", NUMA_NODE),
    ("any", None),
)
PAIR_RUNGS = ("nvlink", "xgmi", "switch", "root", "socket", "affinity", "any")
#: The attribute a GPU of each paired rung shares with its NICs.
PAIR_ATTRIBUTE: dict[str, str | None] = {
    "nvlink": PCIE_ROOT,
    "xgmi": "nicAffinity",
    "switch": None,
    "root": PCIE_ROOT,
    "socket": None,
    "affinity": "nicAffinity",
    "any": None,
}
#: The attribute all GPUs of a paired rung share.
SET_OF = {"nvlink": "nvlinkDomain", "xgmi": "xgmiHive", "switch": "pcieSwitch"}


@dataclass(frozen=True)
class Chosen:
    """A scored placement to put first in the ladder (``--emit-claim``): GPU bus ids in
    request order, and for each the attribute its pair shares with its NICs (or None)."""

    gpu_bus_ids: tuple[str, ...]
    pair_attribute: tuple[str | None, ...] = ()
    nic_bus_ids: tuple[tuple[str, ...], ...] = ()
    """Per GPU, its chosen NICs: ``nic-i`` then tries them first (``nic-i/chosen``)."""
    cpu_selectors: tuple[str, ...] = ()
    drop_rungs: frozenset[str] = frozenset()
    """Rungs that cannot match on the node (its GPUs lack the attribute)."""


def qualified(driver: str, name: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _sub(name: str, cls: str, count: int, selectors: Sequence[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "deviceClassName": cls, "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return body


def _exact(cls: str, count: int, selectors: Sequence[str] = ()) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return body


def _no_fabric(driver: str) -> str:
    return (
        f'!("nvlinkDomain" in device.attributes["{driver}"]) && '
        f'!("xgmiHive" in device.attributes["{driver}"])'
    )


def pin_expression(bus_ids: Sequence[str]) -> str:
    if len(bus_ids) == 1:
        return f'device.attributes["{STD}"].pciBusID == {json.dumps(bus_ids[0])}'
    return f'device.attributes["{STD}"].pciBusID in {json.dumps(sorted(bus_ids))}'


def ladder_spec(
    gpus: int,
    nics_per_gpu: int = 0,
    driver: str = "toposlice.dev",
    gpu_selectors: Sequence[str] = (),
    cpu_groups: int = 0,
    chosen: Chosen | None = None,
) -> dict[str, Any]:
    """The ResourceClaimSpec of a ladder for ``gpus`` GPUs with ``nics_per_gpu`` NICs each
    (and ``cpu_groups`` CPU-group devices on the first GPU's NUMA node if free)."""
    if gpus < 1:
        raise ValueError("a ladder needs at least one GPU")
    if nics_per_gpu < 0 or cpu_groups < 0:
        raise ValueError("NIC and CPU counts must not be negative")
    gcls = device_class_name("gpu", driver)
    ncls = device_class_name("nic", driver)
    ccls = device_class_name("cpu", driver)
    drop = chosen.drop_rungs if chosen else frozenset()
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    pair_rungs = [r for r in PAIR_RUNGS if r not in drop]
    # Constraints per pair: one per pair attribute in use, plus the one that keeps a paired
    # GPU rung off the unpaired NIC sub-request; 4 set constraints; one for CPUs.
    if nics_per_gpu and 3 * gpus + 5 > MAX_CONSTRAINTS:
        pair_rungs = [r for r in pair_rungs if r not in ("xgmi", "affinity")]
    if 3 * gpus > MAX_CONSTRAINT_REFS:  # the numaNode set names 3 rungs per GPU
        pair_rungs = [r for r in pair_rungs if r != "socket"]
    per_pair = 1 + len({PAIR_ATTRIBUTE[r] for r in pair_rungs} - {None})
    paired = nics_per_gpu > 0 and 2 * gpus + (1 if cpu_groups else 0) <= MAX_REQUESTS
    paired = paired and per_pair * gpus + 5 <= MAX_CONSTRAINTS
    numa_refs: list[str] = []
    if paired:
        budget = MAX_SUBREQUESTS - (1 if chosen else 0)
        if len(pair_rungs) > budget:
            pair_rungs = [*pair_rungs[: budget - 1], "any"]
        sets: dict[str, list[str]] = {}
        for i in range(gpus):
            g, n = f"gpu-{i}", f"nic-{i}"
            subs = []
            pair_refs: dict[str, list[str]] = {}
            paired_rungs: list[str] = []
            nic_pin = chosen.nic_bus_ids[i] if chosen and i < len(chosen.nic_bus_ids) else ()
            if chosen:
                pin = pin_expression([chosen.gpu_bus_ids[i]])
                subs.append(_sub("chosen", gcls, 1, [*gpu_selectors, pin]))
                attr = chosen.pair_attribute[i] if i < len(chosen.pair_attribute) else None
                if attr:
                    pair_refs.setdefault(attr, []).append(f"{g}/chosen")
                    paired_rungs.append(f"{g}/chosen")
            for rung in pair_rungs:
                subs.append(_sub(rung, gcls, 1, gpu_selectors))
                ref = f"{g}/{rung}"
                attr = PAIR_ATTRIBUTE[rung]
                if attr is not None:
                    pair_refs.setdefault(qualified(driver, attr), []).append(ref)
                    paired_rungs.append(ref)
                if rung in SET_OF:
                    sets.setdefault(qualified(driver, SET_OF[rung]), []).append(ref)
                if rung in ("switch", "root", "socket"):
                    sets.setdefault(NUMA_NODE, []).append(ref)
                if i == 0 and rung in ("switch", "root", "socket"):
                    numa_refs.append(ref)
            requests.append({"name": g, "firstAvailable": subs})
            # nic-i: a NIC paired with gpu-i, else (only for an unpaired GPU rung) any NIC.
            # Constraints name nic-i's sub-requests, never nic-i itself: a NIC that lacks a
            # pair attribute (a GB200 NIC has no nicAffinity) stays usable unpaired.
            nsubs = []
            nrefs = []
            if nic_pin:
                nsubs.append(_sub("chosen", ncls, nics_per_gpu, [pin_expression(nic_pin)]))
                nrefs.append(f"{n}/chosen")
            nsubs += [
                _sub("paired", ncls, nics_per_gpu, []),
                _sub("unpaired", ncls, nics_per_gpu, []),
            ]
            nrefs.append(f"{n}/paired")
            requests.append({"name": n, "firstAvailable": nsubs})
            for attr, refs in pair_refs.items():
                constraints.append({"requests": [*refs, *nrefs], "matchAttribute": attr})
            if paired_rungs:
                # A GPU and a NIC never share their `type`: this forbids the unpaired NIC
                # together with a paired GPU rung, and binds nothing else.
                constraints.append(
                    {
                        "requests": [*paired_rungs, f"{n}/unpaired"],
                        "matchAttribute": qualified(driver, "type"),
                    }
                )
        if gpus > 1:  # one GPU: a set constraint would only demand the attribute
            for attr, refs in sets.items():
                constraints.append({"requests": refs, "matchAttribute": attr})
    else:
        subs = []
        if chosen:
            subs.append(
                _sub("chosen", gcls, gpus, [*gpu_selectors, pin_expression(chosen.gpu_bus_ids)])
            )
        if gpus == 1:
            if "pcie" not in drop:
                subs.append(_sub("pcie", gcls, 1, [*gpu_selectors, _no_fabric(driver)]))
            subs.append(_sub("any", gcls, 1, gpu_selectors))
        else:
            for rung, attr in SET_RUNGS:
                if rung in drop:
                    continue
                subs.append(_sub(rung, gcls, gpus, gpu_selectors))
                if attr is not None:
                    constraints.append(
                        {"requests": [f"gpus/{rung}"], "matchAttribute": qualified(driver, attr)}
                    )
                if rung == "numa":
                    numa_refs.append(f"gpus/{rung}")
        requests.append({"name": "gpus", "firstAvailable": subs[:MAX_SUBREQUESTS]})
        if nics_per_gpu:
            requests.append({"name": "nics", "exactly": _exact(ncls, gpus * nics_per_gpu)})
    if cpu_groups:
        csubs = []
        if chosen and chosen.cpu_selectors:
            csubs.append(_sub("chosen", ccls, cpu_groups, list(chosen.cpu_selectors)))
        csubs += [_sub("numa", ccls, cpu_groups, []), _sub("any", ccls, cpu_groups, [])]
        requests.append({"name": "cpu", "firstAvailable": csubs})
        constraints.append({"requests": [*numa_refs, "cpu/numa"], "matchAttribute": NUMA_NODE})
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}


def prioritized_score(claim_spec: Mapping[str, Any], chosen_requests: Sequence[str]) -> int:
    """The scheduler's preference for one node's allocation of a claim (Kubernetes 1.35+,
    KEP-4816 scoring): for each request with ``firstAvailable``, ``8 − index`` of the
    sub-request allocated, summed (the scheduler then normalizes across nodes, which keeps
    the order). ``chosen_requests``: the allocation results' request names."""
    subs: dict[str, list[str]] = {}
    for r in (claim_spec.get("devices") or {}).get("requests") or []:
        if "firstAvailable" in r:
            subs[r["name"]] = [s["name"] for s in r["firstAvailable"]]
    seen: dict[str, int] = {}
    for name in chosen_requests:
        req, _, sub = name.partition("/")
        if req in subs and sub and req not in seen:
            seen[req] = MAX_SUBREQUESTS - subs[req].index(sub)
    return sum(seen.values())


def rung_of(results: Sequence[str]) -> dict[str, str]:
    """Request -> the sub-request chosen, from allocation result names."""
    out: dict[str, str] = {}
    for name in results:
        req, _, sub = name.partition("/")
        if sub:
            out.setdefault(req, sub)
    return out
