"""A job's expected run time: its hint when it states one, else learned from completed jobs
of the same shape.

The expected-completion decision (``scorer/completion.py``) needs a run time for the job it
places and for the jobs whose devices it waits for. Workloads may state one: the request
document's ``expectedRunSeconds``, or Kueue's maximum execution time (the
``kueue.x-k8s.io/max-exec-time-seconds`` label a Job or Pod carries, which Kueue copies to
its Workload's ``spec.maximumExecutionTimeSeconds``). Without a hint the estimate is the mean
base run time (run time ÷ the placement's stretch) of completed jobs of the same shape
(GPU count, pattern), shrunk towards the mean over all shapes while few are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .request import Request

#: Kueue's label for a job's maximum execution time (seconds), on Jobs and plain Pods.
KUEUE_MAX_EXEC_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
#: The expected run time before any job has completed: an hour, between the median and
#: the mean run times of the public traces (placement-models §3.1: medians 122-874 s,
#: means 1,260-18,006 s).
PRIOR_S = 3600.0
#: Weight of the prior (and of the all-shapes mean for a shape), in jobs.
PRIOR_WEIGHT = 2.0


def kueue_hint(obj: dict[str, Any]) -> float | None:
    """Seconds from a Pod or Job's Kueue label, or a Workload's
    ``spec.maximumExecutionTimeSeconds``; None when absent or not a positive number."""
    meta = obj.get("metadata") or {}
    value: Any = ((meta.get("labels") or {}).get(KUEUE_MAX_EXEC_LABEL)) or (
        (obj.get("spec") or {}).get("maximumExecutionTimeSeconds")
        if obj.get("kind") == "Workload"
        else None
    )
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and seconds > 0 else None


def shape(req: Request) -> tuple[int, str]:
    return (req.gpus, req.pattern)


@dataclass
class RunEstimator:
    """Expected run times; ``use_hints`` False ignores every hint (the bench's no-hint run)."""

    use_hints: bool = True
    _sum: dict[tuple[int, str], float] = field(default_factory=dict)
    _n: dict[tuple[int, str], int] = field(default_factory=dict)
    _all_sum: float = 0.0
    _all_n: int = 0
    _arrivals: dict[tuple[int, int], tuple[Request, int]] = field(default_factory=dict)
    _first: float | None = None
    _last: float = 0.0

    def expected(self, req: Request, hint: float | None = None) -> float:
        hint = hint if hint is not None else req.expected_run_s
        if self.use_hints and hint is not None:
            return hint
        overall = (self._all_sum + PRIOR_S * PRIOR_WEIGHT) / (self._all_n + PRIOR_WEIGHT)
        k = shape(req)
        n = self._n.get(k, 0)
        return (self._sum.get(k, 0.0) + overall * PRIOR_WEIGHT) / (n + PRIOR_WEIGHT)

    def observe(self, req: Request, base_seconds: float) -> None:
        """A completed job's run time at the best placement (its run ÷ its stretch)."""
        k = shape(req)
        self._sum[k] = self._sum.get(k, 0.0) + base_seconds
        self._n[k] = self._n.get(k, 0) + 1
        self._all_sum += base_seconds
        self._all_n += 1

    def arrived(self, req: Request, t: float) -> None:
        """A job of this shape arrived at ``t`` (seconds): the arrival rates the
        expected-completion decision charges future jobs' delays with."""
        key = (req.gpus, req.nics_per_gpu)
        _, n = self._arrivals.get(key, (req, 0))
        self._arrivals[key] = (req, n + 1)
        self._first = t if self._first is None else self._first
        self._last = t

    def rates(self, min_jobs: int = 10) -> list[tuple[Request, float]]:
        """(a recent request of the shape, arrivals per second) per (GPUs, NICs per GPU),
        once ``min_jobs`` have arrived."""
        total = sum(n for _, n in self._arrivals.values())
        span = self._last - (self._first or 0.0)
        if total < min_jobs or span <= 0:
            return []
        return [(r, n / span) for r, n in self._arrivals.values()]
