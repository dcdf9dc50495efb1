"""Figures the benches print: one percentile rule, so driver.py and kube_api.py report
their p50/p99 the same way."""

from __future__ import annotations


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile by nearest rank on the sorted samples (no interpolation:
    a reported p99 is a latency that was actually measured)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]
