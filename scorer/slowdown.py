"""How much longer a job runs on a placement than on the best one the cluster offers.

A job on a slow fabric does not merely score lower: it holds its GPUs longer, and the jobs
behind it pay for that. This module turns a placement's modelled bandwidths into a run-time
factor (``stretch`` ≥ 1, 1 on the best placement) for the bench's replay and for the
scorer's expected-completion decision (``scorer/completion.py``). Every constant of the
model is here, each with its source; the figures are in docs/scorer.md ("Run-time model").

One step of a job = compute + the communication it cannot hide:

* compute is 1 (the step's compute time); a memory-bound job's compute is stretched by
  the other memory-bound work sharing its PCIe switch (``MEMORY_SHARED``);
* each collective (in-node, over the NICs) takes ``ratio × best bandwidth / this
  placement's bandwidth`` of the compute time; a share ``overlap`` of it can run during the
  backward pass (``BACKWARD_SHARE`` of compute), the rest is exposed;
* stretch = step time on this placement / step time on the reference placement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """A pattern's communication, relative to its compute time at the best bandwidth."""

    intra: float
    """In-node collective time / compute time, at the cluster's best busbw for the size."""
    intra_overlap: float
    """Share of the in-node collective that can overlap the backward pass."""
    net: float
    """Collective time over the job's NICs / compute time, at the best NIC path (jobs with
    NICs only: a pod of a job that spans nodes)."""
    net_overlap: float
    memory_bound: bool
    """Roofline: below the ridge point, so co-located memory traffic slows it."""


#: Per pattern. Sources (docs/scorer.md, "Run-time model", gives the arithmetic):
#: * tensor-parallel: 8-way model parallel ran at 77 % weak-scaling efficiency on NVSwitch
#:   (Megatron-LM, Shoeybi et al. 2019, §5.1), so communication ≈ 1/0.77 − 1 = 0.30 of
#:   compute; its all-reduces sit on the critical path of every layer (no overlap,
#:   placement-models §2.5: latency-sensitive, keep inside one NVLink domain).
#: * data-parallel: gradient all-reduce of 2 bytes per parameter against 6 FLOPs per
#:   parameter per token (Kaplan et al. 2020, §2.1) at H100 figures gives ≈ 0.18; it
#:   overlaps the backward pass (PyTorch DDP, Li et al. VLDB 2020; NeMo "Communication
#:   Overlap", placement-models §2.5).
#: * pipeline-parallel: point-to-point activations of neighbouring stages, "small volume"
#:   (placement-models §2.5): 0.05, not overlapped.
#: * inference-decode: memory-bandwidth bound (placement-models §2.5; roofline, Williams et
#:   al. 2009: ~2 FLOPs per weight byte per batch row, far under H100's ridge of 989 TFLOPs /
#:   3.35 TB/s ≈ 295); its TP all-reduce per token is small and latency-bound: 0.15.
#: * inference-prefill: compute-bound (whole prompt in one pass, §2.5): 0.10, no overlap.
#: * independent: no collective.
#: Jobs with NICs add the collective of the job they are a pod of, over the NICs: the
#: outer data-parallel gradient exchange (overlapped), 0.30 of compute at a 46 GB/s NIC
#: path (dranet's NUMA-local figure, placement-models §2.4) — an assumption, see
#: docs/scorer.md.
PROFILES: dict[str, Profile] = {
    "tensor-parallel": Profile(0.30, 0.0, 0.30, 1.0, False),
    "data-parallel": Profile(0.18, 1.0, 0.30, 1.0, False),
    "pipeline-parallel": Profile(0.05, 0.0, 0.05, 0.0, False),
    "inference-decode": Profile(0.15, 0.0, 0.05, 1.0, True),
    "inference-prefill": Profile(0.10, 0.0, 0.05, 1.0, False),
    "independent": Profile(0.0, 0.0, 0.0, 0.0, False),
}

#: The backward pass's share of a training step's compute: 4 of the 6 FLOPs per parameter
#: per token (Kaplan et al. 2020, §2.1: forward 2N, backward 2 × forward).
BACKWARD_SHARE = 2.0 / 3.0

#: Share of a memory-bound job's time that uses a link it shares with the other
#: memory-bound work behind the same PCIe switch (KV-cache and weight traffic to host
#: memory); each other memory-bound job on the switch adds this share again, one on the same
#: root complex half of it (the scorer's ``contention`` part weighs them the same way).
#: An assumption (no public figure measures it), varied in docs/scorer.md.
MEMORY_SHARED = 0.25

#: A placement can be no better than the reference (rounding of two bandwidth models).
_FLOOR = 1.0


def step_time(profile: Profile, intra_ratio: float, net_ratio: float, sharing: float) -> float:
    """One step, in units of the uncontended compute time: ``intra_ratio`` and
    ``net_ratio`` are best bandwidth / this placement's (≥ 1), ``sharing`` the memory-bound
    jobs beside it (switch = 1, root complex = ½)."""
    compute = 1.0 + (MEMORY_SHARED * sharing if profile.memory_bound else 0.0)
    window = BACKWARD_SHARE * compute
    intra = profile.intra * intra_ratio
    net = profile.net * net_ratio
    hidden = intra * profile.intra_overlap + net * profile.net_overlap
    exposed = intra * (1.0 - profile.intra_overlap) + net * (1.0 - profile.net_overlap)
    return compute + exposed + max(0.0, hidden - window)


def stretch(
    pattern: str,
    gpus: int,
    busbw: float,
    best_busbw: float,
    nic_gbps: float | None = None,
    best_nic_gbps: float | None = None,
    sharing: float = 0.0,
) -> float:
    """Run time on this placement ÷ run time on the reference (best busbw for the size,
    best NIC path, no memory-bound neighbour). One GPU has no in-node collective; a job
    without NICs no network one."""
    profile = PROFILES[pattern]
    intra_ratio = best_busbw / busbw if gpus > 1 and busbw > 0 and best_busbw > 0 else 1.0
    net_on = nic_gbps is not None and best_nic_gbps
    net_ratio = best_nic_gbps / nic_gbps if net_on and nic_gbps and best_nic_gbps else 1.0
    p = profile if gpus > 1 else Profile(0.0, 0.0, profile.net, profile.net_overlap, False)
    p = p if net_on else Profile(p.intra, p.intra_overlap, 0.0, 0.0, p.memory_bound)
    p = Profile(p.intra, p.intra_overlap, p.net, p.net_overlap, profile.memory_bound)
    ref = step_time(p, 1.0, 1.0, 0.0)
    return max(_FLOOR, step_time(p, max(1.0, intra_ratio), max(1.0, net_ratio), sharing) / ref)
