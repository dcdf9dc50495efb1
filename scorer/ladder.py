"""Claim ladders: soft topology through ``firstAvailable`` prioritized lists.

A hard claim pins one device set; when that set is taken between scoring and allocation the
pod waits. A ladder lists topology classes best first, each as a sub-request, so the stock
scheduler allocates the best class that is free at that moment: the allocator tries
sub-requests in order (backtracking across requests), and since Kubernetes 1.35 the
scheduler also prefers the node whose allocation uses the best-ranked sub-requests
(:func:`prioritized_score`).

The rungs are few on purpose. kube-scheduler runs the allocator on every node it filters,
and its cost is CEL evaluations: each sub-request evaluates its selectors on every free
device it passes, once per node, so a rung that cannot match on a node is a full scan of
that node's devices, and on a node too full for the claim every rung of the request that
fails is one (docs/performance.md#claims-at-cluster-size). Rungs that only ever matched the
whole node (``nvlinkDomain`` on NVSwitch boards and GB200 trays, ``xgmiHive`` on MI300X)
or never (a second NVLink or hive rung, ``pcieSwitch`` for 4+ GPUs) paid that scan on
every node of the other kinds; they are gone, and each GPU's NIC is paired by the one
attribute that names it on every machine, ``toposlice.dev/nicAffinity``.

One rung is opt-in: ``scaleup`` (a GPU in an NVLink domain or an xGMI hive) goes first for
a workload that runs at least twice as long with its GPUs on PCIe (:func:`wants_scaleup`,
from the run-time model; ``toposlice claim --pattern``). Only the NVSwitch, GB200 and MI300X
boards' GPUs match it, so they rank above PCIe boxes for the scheduler; every other node
pays one scan for it, which is why a ladder without a stated workload does not carry it.

Without NICs, one request ``gpus`` with ``count`` N in every rung:

======== ==============================================================
rung     the N GPUs share
======== ==============================================================
scaleup  a scale-up domain (opt-in, above)
numa     ``resource.kubernetes.io/numaNode`` (one socket; N > 1 only)
any      nothing (plain count)
======== ==============================================================

With NICs, one request ``gpu-i`` per GPU, then one ``nic-i`` per GPU (``nicsPerGpu`` NICs
each); every ``gpu-i`` and ``nic-i/any`` takes a *window* of ``ordinal`` values
(:func:`window`), and the claim runs in one of two *modes*, chosen by ``gpu-0``'s rung:

======== ================================================================================
request  rungs
======== ================================================================================
gpu-0    ``scaleup`` (opt-in: mode P on a GPU in a scale-up domain), ``paired`` (a GPU with
         a closest-NIC group, ``nicAffinity``: mode P), ``unpaired`` (one with a group:
         mode A), ``any`` (one without: mode A)
gpu-i    ``paired`` (has a group), ``any`` (has none): the two never offer the same GPU
nic-i    ``paired`` (in gpu-i's group: ``matchAttribute nicAffinity`` with gpu-i's group
         rungs), ``any``
cpu      right after gpu-0: ``numa`` (gpu-0's NUMA node), ``any`` (only beside a gpu-0
         without one, for one CPU group)
======== ================================================================================

Why (issue #31): on a node that cannot hold the claim the allocator's search is exhaustive,
and it walks combinations within a request but every order across requests. Per-GPU
requests over the same GPUs and NICs, each with rungs that overlap, made that N! orders
times 2^N rung mixtures: seconds per node, past the scheduler's 10 s filter timeout. The
windows let each set of GPUs (and NICs) be tried once and fail a node with too few at the
first scan, without losing a set that fits; the modes keep the rungs from mixing (mode P:
no ``nic-i/any``, mode A: no ``nic-i/paired``, each one ``matchAttribute: toposlice.dev/type``
constraint with ``gpu-0``'s rungs, since a GPU and a NIC never share a type). The price: a
node where only some GPUs can pair gets mode A. Constraints name sub-requests, never a
whole request, so a GPU without ``nicAffinity`` (GB200) or ``numaNode`` (a cloud VM) stays
usable. Up to 15 pairs; above that (or above 16 GPUs: 32 requests) the count ladder with a
``nics`` request. With a chosen placement (``--emit-claim``) each ``gpu-i`` and ``nic-i``
gets a ``chosen`` rung first (that device, pinned by ``pciBusID``), tied by the attribute
the chosen pair shares, and ``gpu-0/chosen`` is a third mode: every NIC its chosen one.
bench/claim_worst_case.py measures every shape's worst node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normalize.attribute_names import NVLINK_DOMAIN, ORDINAL, TYPE_COUNT, XGMI_HIVE
from normalize.deviceclasses import device_class_name

from .slowdown import PROFILES, stretch

STD = "resource.kubernetes.io"
NUMA_NODE = f"{STD}/numaNode"
PCI_BUS_ID = f"{STD}/pciBusID"
MAX_SUBREQUESTS = 8
MAX_REQUESTS = 32
MAX_CONSTRAINTS = 32
MAX_CONSTRAINT_REFS = 32

NIC_AFFINITY = "nicAffinity"
#: Bus bandwidth of a GPU pair without and with a scale-up fabric: NCCL AllReduce across
#: PCIe GPUs on a two-socket server, 28 GB/s (nccl#1639), and the ring figure on an H100
#: NVSwitch board, ~370 GB/s (nccl-tests#212); placement-models.md §2.4.
PCIE_PAIR_GBPS = 28.0
NVLINK_PAIR_GBPS = 370.0
#: The run-time factor on PCIe from which a ladder asks for NVLink / xGMI first: met by
#: tensor-parallel (3.8), data-parallel (2.7), inference-decode (2.6) and -prefill (2.1),
#: not by pipeline-parallel (1.6) or independent work (1.0).
SCALEUP_STRETCH = 2.0
#: Rungs of the count ladder (no NICs), with the attribute its GPUs share.
SET_RUNGS: tuple[tuple[str, str | None], ...] = (("numa", NUMA_NODE), ("any", None))
#: gpu-0's rungs the CPU group's NUMA node is tied to (all: a GPU without a NUMA node, a
#: cloud VM's, takes ``cpu/any``, which the CPU request tries second).
GATE_NUMA_RUNGS = ("paired", "unpaired", "any")


@dataclass(frozen=True)
class NeighbourCpus:
    """CPUs from another driver (``toposlice claim --cpus-from dra.cpu``), all on the
    GPUs' NUMA node.

    The request is hard (``exactly``): a node without that many free CPUs on the node of
    GPUs it can give fails, rather than handing out CPUs of the other socket. It is tied to
    every GPU request, all their rungs, by ``matchAttribute`` on the neighbour's NUMA name
    (``dra.net/numaNode``, which toposlice's devices carry with the bridge on: ``run``'s
    default when the neighbour publishes on the node), the one the v1.36 scheduler evaluates
    across the two drivers (docs/integrations.md)."""

    driver: str
    cpus: int
    individual: bool = False
    """The neighbour runs one device per CPU (dra-driver-cpu ``--cpu-device-mode=individual``):
    ask for ``cpus`` devices; grouped (its default): one NUMA-node device and ``cpus`` of its
    consumable capacity."""

    def request(self) -> dict[str, Any]:
        from normalize.dialects import DIALECTS

        dialect = DIALECTS[self.driver]
        cls = dialect.device_class or self.driver
        if self.individual or not dialect.cpu_capacity:
            return {"name": "cpus", "exactly": _exact(cls, self.cpus)}
        exact = _exact(cls, 1)
        exact["capacity"] = {"requests": {dialect.cpu_capacity: str(self.cpus)}}
        return {"name": "cpus", "exactly": exact}


@dataclass(frozen=True)
class NeighbourNics:
    """Each GPU's NICs from another driver (``toposlice claim --nics-from dra.net``).

    dranet's NICs carry ``resource.kubernetes.io/pcieRoot`` and ``dra.net/numaNode`` but none
    of toposlice's pairing attributes (``nicAffinity``), so the closest NIC a claim can name
    across the two drivers is one on the GPU's PCIe root, else one on its NUMA node
    (``dra.net/numaNode``, which toposlice's GPUs carry beside dranet: ``run``'s
    ``--bridge auto``). ``nic-i`` lists those two rungs; a node with neither free for some
    GPU fails rather than give it a NIC of the other socket."""

    driver: str
    per_gpu: int = 1
    rdma: bool = True
    """Only functions with RDMA (``dra.net/rdma``): the ones GPUDirect uses."""

    def selectors(self) -> list[str]:
        return [f'device.attributes["{self.driver}"].rdma == true'] if self.rdma else []


#: The rungs of a neighbour NIC request, with the attribute the NIC shares with its GPU.
NEIGHBOUR_NIC_RUNGS = (("root", f"{STD}/pcieRoot"), ("numa", "dra.net/numaNode"))


def neighbour_nic_spec(
    gpus: int,
    nics: NeighbourNics,
    driver: str = "toposlice.dev",
    gpu_selectors: Sequence[str] = (),
    cpus_from: NeighbourCpus | None = None,
    chosen: Chosen | None = None,
) -> dict[str, Any]:
    """One request per GPU (``gpu-i``, windowed as the paired ladder's) followed by its NIC
    request (``nic-i``: ``root``, then ``numa``), so a GPU whose NIC cannot be found fails
    right after that GPU's choices; ``cpus_from`` ties another driver's CPUs to the GPUs.
    With a scored placement (``score --emit-claim``), ``gpu-i`` tries its chosen GPU first
    (``chosen``, pinned by ``pciBusID``) and ``nic-i`` its chosen NICs (pinned by the
    neighbour's own name for the address, ``dra.net/pciAddress``), tied to ``gpu-i`` by
    the attribute the pair shares: the scorer's pick (closest by PCIe switch where there is
    one) while it is free, the rungs above when it is not."""
    from normalize.dialects import DIALECTS

    if gpus < 1 or nics.per_gpu < 1:
        raise ValueError("a claim with NICs from another driver needs GPUs and NICs")
    if 2 * gpus + (1 if cpus_from else 0) > MAX_REQUESTS:
        raise ValueError(f"--gpus {gpus}: at most {MAX_REQUESTS // 2} GPUs with NICs each")
    gcls = device_class_name("gpu", driver)
    ncls = DIALECTS[nics.driver].device_class or nics.driver
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    bus_name = DIALECTS[nics.driver].bus_id
    if chosen is not None and len(chosen.gpu_bus_ids) != gpus:
        raise ValueError("a chosen placement needs one GPU per GPU request")
    if chosen is not None and 3 * gpus + (1 if cpus_from else 0) > MAX_CONSTRAINTS:
        raise ValueError(f"--gpus {gpus}: too many to pin the chosen pairs")
    for i in range(gpus):
        sel = [*gpu_selectors, window(driver, i, gpus)] if gpus > 1 else list(gpu_selectors)
        nic_subs = [
            _sub(rung, ncls, nics.per_gpu, nics.selectors()) for rung, _ in NEIGHBOUR_NIC_RUNGS
        ]
        if chosen is None:
            requests.append({"name": f"gpu-{i}", "exactly": _exact(gcls, 1, sel)})
        else:
            pin = [*gpu_selectors, pin_expression([chosen.gpu_bus_ids[i]])]
            subs = [_sub("chosen", gcls, 1, pin), _sub("any", gcls, 1, sel)]
            requests.append({"name": f"gpu-{i}", "firstAvailable": subs})
            tie = _neighbour_tie(chosen, i)
            mine = chosen.nic_bus_ids[i] if i < len(chosen.nic_bus_ids) else ()
            if bus_name and tie and len(mine) == nics.per_gpu:
                domain, name = bus_name.split("/", 1)
                nic_pin = f'device.attributes["{domain}"].{name} in {json.dumps(sorted(mine))}'
                nic_subs.insert(0, _sub("chosen", ncls, nics.per_gpu, [nic_pin]))
                constraints.append(
                    {"requests": [f"gpu-{i}", f"nic-{i}/chosen"], "matchAttribute": tie}
                )
        requests.append({"name": f"nic-{i}", "firstAvailable": nic_subs})
        for rung, attr in NEIGHBOUR_NIC_RUNGS:
            constraints.append(
                {"requests": [f"gpu-{i}", f"nic-{i}/{rung}"], "matchAttribute": attr}
            )
    if cpus_from is not None:
        _add_neighbour_cpus(requests, constraints, cpus_from)
    return {"devices": {"requests": requests, "constraints": constraints}}


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


def pin_expression(bus_ids: Sequence[str]) -> str:
    if len(bus_ids) == 1:
        return f'device.attributes["{STD}"].pciBusID == {json.dumps(bus_ids[0])}'
    return f'device.attributes["{STD}"].pciBusID in {json.dumps(sorted(bus_ids))}'


def scaleup_expression(driver: str = "toposlice.dev") -> str:
    """CEL: the GPU is in a scale-up domain: NVLink (NVSwitch boards, GB200 trays, bridged
    groups) or an AMD xGMI hive."""
    attrs = f'device.attributes["{driver}"]'
    return f'"{NVLINK_DOMAIN}" in {attrs} || "{XGMI_HIVE}" in {attrs}'


def wants_scaleup(pattern: str, gpus: int) -> bool:
    """Whether a ladder for this workload gets the ``scaleup`` rung: by the run-time model
    (scorer/slowdown.py), a pair of its GPUs on PCIe (``PCIE_PAIR_GBPS``) instead of
    NVLink (``NVLINK_PAIR_GBPS``) runs at least ``SCALEUP_STRETCH`` times as long. The rung
    is a scan of the devices of every node without a scale-up fabric, so it is not spent on
    patterns that barely communicate (pipeline-parallel, independent)."""
    if pattern not in PROFILES or gpus < 2:
        return False
    return stretch(pattern, gpus, PCIE_PAIR_GBPS, NVLINK_PAIR_GBPS) >= SCALEUP_STRETCH


def ladder_spec(
    gpus: int,
    nics_per_gpu: int = 0,
    driver: str = "toposlice.dev",
    gpu_selectors: Sequence[str] = (),
    cpu_groups: int = 0,
    chosen: Chosen | None = None,
    scaleup: bool = False,
    cpus_from: NeighbourCpus | None = None,
) -> dict[str, Any]:
    """The ResourceClaimSpec of a ladder for ``gpus`` GPUs with ``nics_per_gpu`` NICs each
    (and ``cpu_groups`` CPU-group devices on the first GPU's NUMA node if free); ``scaleup``
    (:func:`wants_scaleup`) puts a ``scaleup`` rung first: on ``gpu-1``, or on the count
    ladder's set; ``cpus_from`` adds another driver's CPUs on the GPUs' NUMA node."""
    if gpus < 1:
        raise ValueError("a ladder needs at least one GPU")
    if nics_per_gpu < 0 or cpu_groups < 0:
        raise ValueError("NIC and CPU counts must not be negative")
    if cpus_from is not None and cpu_groups:
        raise ValueError("CPUs come from toposlice's CPU groups or from another driver, not both")
    gcls = device_class_name("gpu", driver)
    ncls = device_class_name("nic", driver)
    ccls = device_class_name("cpu", driver)
    drop = chosen.drop_rungs if chosen else frozenset()
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    numa_refs: list[str] = []
    # One constraint per pair (two when a chosen pair shares another attribute), three
    # that keep the modes apart, two for CPUs.
    nvl = scaleup and gpus > 1  # a set of one GPU has no fabric to prefer
    up_sel = [*gpu_selectors, scaleup_expression(driver)]
    pair_constraints = gpus + (gpus if chosen else 0) + 3 + (2 if cpu_groups else 0)
    paired = nics_per_gpu > 0 and 2 * gpus + (1 if cpu_groups else 0) <= MAX_REQUESTS
    paired = paired and pair_constraints <= MAX_CONSTRAINTS and "paired" not in drop
    if paired:
        requests, constraints = _paired_requests(
            gpus, nics_per_gpu, driver, gpu_selectors, chosen, nvl, up_sel
        )
        numa_refs = ["gpu-0/chosen"] if chosen else []
        numa_refs += [f"gpu-0/{r}" for r in (("scaleup",) if nvl else ()) + GATE_NUMA_RUNGS]
        if cpu_groups == 1:
            # cpu/any is for a gpu-0 without a NUMA node: beside a GPU that has one, the
            # CPU group must be on its node, so `cpu/any` never tries a second time what
            # `cpu/numa` tried (a CPU group and a GPU never share their `type`).
            kind = qualified(driver, "type")
            constraints.append({"requests": [*numa_refs, "cpu/any"], "matchAttribute": kind})
    else:
        subs = []
        if chosen:
            subs.append(
                _sub("chosen", gcls, gpus, [*gpu_selectors, pin_expression(chosen.gpu_bus_ids)])
            )
        if nvl and "scaleup" not in drop:
            subs.append(_sub("scaleup", gcls, gpus, up_sel))
        for rung, attr in SET_RUNGS:
            if rung in drop or (attr is not None and gpus == 1 and not cpu_groups):
                continue  # one GPU: a set constraint would only demand the attribute
            subs.append(_sub(rung, gcls, gpus, gpu_selectors))
            if attr is None:
                continue
            if gpus > 1:
                constraints.append({"requests": [f"gpus/{rung}"], "matchAttribute": attr})
            # One GPU keeps its `numa` rung only for the CPU constraint to name: the rung
            # aligns the CPU group with it, and a GPU without a NUMA node (a cloud VM's)
            # fails it and takes `any`, with the CPU group left unaligned.
            numa_refs.append(f"gpus/{rung}")
        if cpus_from is not None and len(subs) > 1 and subs[-1]["name"] == "any":
            # Tied to the other driver's CPUs, `any` GPUs share their NUMA node too: the
            # rung would only search again what `numa` searched.
            subs.pop()
        requests.append({"name": "gpus", "firstAvailable": subs[:MAX_SUBREQUESTS]})
        if nics_per_gpu:
            requests.append({"name": "nics", "exactly": _exact(ncls, gpus * nics_per_gpu)})
    if cpu_groups:
        csubs = []
        if chosen and chosen.cpu_selectors:
            csubs.append(_sub("chosen", ccls, cpu_groups, list(chosen.cpu_selectors)))
        csubs += [_sub("numa", ccls, cpu_groups, []), _sub("any", ccls, cpu_groups, [])]
        cpu = {"name": "cpu", "firstAvailable": csubs}
        # Pairs: the CPU request goes right after gpu-0, whose NUMA node it shares: a node
        # without a free CPU group there fails after gpu-0's few choices, not after every
        # placement of the GPUs and NICs, and later dead ends do not retry the CPU group.
        requests.insert(1 if paired else len(requests), cpu)
        constraints.append({"requests": [*numa_refs, "cpu/numa"], "matchAttribute": NUMA_NODE})
    if cpus_from is not None:
        _add_neighbour_cpus(requests, constraints, cpus_from)
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}


def _neighbour_tie(chosen: Chosen, i: int) -> str | None:
    """What a chosen GPU and its chosen neighbour NICs share, in names both drivers publish:
    the root, else the NUMA node (a closest-NIC group or a PCIe switch of toposlice's lies
    within it); None when they share nothing (no chosen NIC rung then)."""
    attr = chosen.pair_attribute[i] if i < len(chosen.pair_attribute) else None
    if attr is None:
        return None
    return f"{STD}/pcieRoot" if attr == f"{STD}/pcieRoot" else "dra.net/numaNode"


def _add_neighbour_cpus(
    requests: list[dict[str, Any]], constraints: list[dict[str, Any]], cpus: NeighbourCpus
) -> None:
    """The neighbour's CPU request right after the first GPU request (a node without the
    CPUs there fails after that GPU's few choices), tied to every GPU request."""
    from normalize.attribute_names import BRIDGE_NUMA

    gpu_requests = [r["name"] for r in requests if r["name"] == "gpus" or r["name"][:4] == "gpu-"]
    if len(constraints) >= MAX_CONSTRAINTS or len(gpu_requests) + 1 > MAX_CONSTRAINT_REFS:
        raise ValueError("too many GPU requests to tie another driver's CPUs to them")
    requests.insert(1, cpus.request())
    constraints.append({"requests": [*gpu_requests, "cpus"], "matchAttribute": BRIDGE_NUMA})


def window(driver: str, i: int, n: int, per: int = 1) -> str:
    """CEL: request ``i`` of ``n`` that each take ``per`` devices of one type may take a
    device at ``ordinal`` >= i*per with at least (n-i-1)*per + 1 of its type from it on.
    Any set of n*per devices, sorted by ordinal and cut into runs of ``per``, fits these
    windows run by run, so no allocation is lost; but the allocator no longer tries each
    set in every order across the requests (it walks combinations within a request, and
    permutations across requests), and a node with fewer than n*per devices of the type
    fails at the first scan."""
    a = f'device.attributes["{driver}"]'
    lo, after = i * per, (n - i - 1) * per + 1
    out = f'"{ORDINAL}" in {a} && "{TYPE_COUNT}" in {a}'
    if lo:
        out += f" && {a}.{ORDINAL} >= {lo}"
    return out + f" && {a}.{TYPE_COUNT} - {a}.{ORDINAL} >= {after}"


def _paired_requests(
    gpus: int,
    nics_per_gpu: int,
    driver: str,
    gpu_selectors: Sequence[str],
    chosen: Chosen | None,
    scaleup: bool,
    up_sel: Sequence[str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests and constraints of the paired ladder (module docstring): ``gpu-i`` then
    ``nic-i`` for every GPU, windowed, in two modes chosen by ``gpu-0``."""
    gcls = device_class_name("gpu", driver)
    ncls = device_class_name("nic", driver)
    affinity = qualified(driver, NIC_AFFINITY)
    attrs = f'device.attributes["{driver}"]'
    grouped = f'"{NIC_AFFINITY}" in {attrs}'
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    mode_p: list[str] = []  # gpu-0's rungs whose NICs are paired
    mode_a: list[str] = []  # gpu-0's rungs whose NICs are not
    nic_any: list[str] = []
    nic_paired: list[str] = []
    nic_requests: list[dict[str, Any]] = []
    nic_chosen: list[str] = []
    for i in range(gpus):
        g, n = f"gpu-{i}", f"nic-{i}"
        win = window(driver, i, gpus)
        subs: list[dict[str, Any]] = []
        pair_refs: dict[str, list[str]] = {affinity: []}
        if chosen:
            pin = pin_expression([chosen.gpu_bus_ids[i]])
            subs.append(_sub("chosen", gcls, 1, [*gpu_selectors, pin]))
            attr = chosen.pair_attribute[i] if i < len(chosen.pair_attribute) else None
            if attr:
                pair_refs.setdefault(attr, []).append(f"{g}/chosen")
        if scaleup and i == 0:
            subs.append(_sub("scaleup", gcls, 1, [*up_sel[:-1], f"{win} && ({up_sel[-1]})"]))
            pair_refs[affinity].append(f"{g}/scaleup")
            mode_p.append(f"{g}/scaleup")
        subs.append(_sub("paired", gcls, 1, [*gpu_selectors, f"{win} && {grouped}"]))
        pair_refs[affinity].append(f"{g}/paired")
        if i == 0:
            mode_p.append(f"{g}/paired")
            # A GPU with a closest-NIC group whose NICs are not its pair's: mode A on
            # nodes where the groups' NICs are taken (or too few per GPU).
            subs.append(_sub("unpaired", gcls, 1, [*gpu_selectors, f"{win} && {grouped}"]))
            mode_a.append(f"{g}/unpaired")
        subs.append(_sub("any", gcls, 1, [*gpu_selectors, f"{win} && !({grouped})"]))
        if i == 0:
            mode_a.append(f"{g}/any")
        requests.append({"name": g, "firstAvailable": subs})
        nic_pin = chosen.nic_bus_ids[i] if chosen and i < len(chosen.nic_bus_ids) else ()
        nsubs = []
        nrefs = [f"{n}/paired"]
        if nic_pin:
            nsubs.append(_sub("chosen", ncls, nics_per_gpu, [pin_expression(nic_pin)]))
            nrefs.append(f"{n}/chosen")
            nic_chosen.append(f"{n}/chosen")
        nsubs.append(_sub("paired", ncls, nics_per_gpu, []))
        nsubs.append(_sub("any", ncls, nics_per_gpu, [window(driver, i, gpus, nics_per_gpu)]))
        nic_paired.append(f"{n}/paired")
        nic_any.append(f"{n}/any")
        nic_requests.append({"name": n, "firstAvailable": nsubs})
        for attr, refs in pair_refs.items():
            constraints.append({"requests": [*refs, *nrefs], "matchAttribute": attr})
    # The modes do not mix: with gpu-0 paired no NIC is taken unpaired, with gpu-0 in a
    # mode-A rung no NIC is taken paired. A GPU and a NIC never share their `type`, so each
    # constraint forbids the one GPU rung beside those NIC rungs and binds nothing else.
    requests += nic_requests
    kind = qualified(driver, "type")
    if chosen and len(nic_chosen) == gpus:
        # Mode C, the scored placement: with gpu-0 chosen, every NIC is the chosen one.
        constraints.append(
            {"requests": ["gpu-0/chosen", *nic_paired, *nic_any], "matchAttribute": kind}
        )
    elif chosen:
        mode_p.insert(0, "gpu-0/chosen")
    constraints.append({"requests": [*mode_p, *nic_any, *nic_chosen], "matchAttribute": kind})
    constraints.append({"requests": [*mode_a, *nic_paired, *nic_chosen], "matchAttribute": kind})
    return requests, constraints


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
