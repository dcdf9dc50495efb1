"""Link throughput tables shared by the probes (what they report) and normalize (what it publishes).

Per direction, decimal GB/s, as hwloc's ``misc.h`` and its NVLink table give them.
"""

from __future__ import annotations

from discovery.bounds import MAX_LINK_WIDTH

#: PCIe per-lane throughput by generation (128b/130b from Gen3, 242/256 FLIT from Gen6).
PCIE_LANE_GBPS: dict[int, float] = {
    1: 0.25,
    2: 0.5,
    3: 8 * 128 / 130 / 8,
    4: 16 * 128 / 130 / 8,
    5: 32 * 128 / 130 / 8,
    6: 64 * 242 / 256 / 8,
    7: 128 * 242 / 256 / 8,
}
_SPEED_TO_GEN: dict[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}

#: NVLink per-link throughput by generation text (``nvmlNvlinkVersion_t`` decoded).
NVLINK_LINK_GBPS: dict[str, float] = {
    "1.0": 20.0,
    "2.0": 25.0,
    "2.2": 25.0,
    "3.0": 25.0,
    "3.1": 25.0,
    "4.0": 25.0,
    "5.0": 50.0,
}


def pcie_generation(speed_gts: float | None) -> int | None:
    """``16.0`` GT/s -> Gen 4; None for speeds no generation has."""
    if speed_gts is None:
        return None
    for speed, gen in _SPEED_TO_GEN.items():
        if abs(speed - speed_gts) < 0.01:
            return gen
    return None


def pcie_link_gbps(gen: int | None, width: int | None) -> float | None:
    if gen is None or not width or not 0 < width <= MAX_LINK_WIDTH or gen not in PCIE_LANE_GBPS:
        return None
    return PCIE_LANE_GBPS[gen] * width
