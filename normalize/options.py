"""Options that change how an Inventory is turned into ResourceSlices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .limits import MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE_RESTRICTED

__all__ = [
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICES_PER_SLICE_RESTRICTED",
    "CpuGrouping",
    "MatrixNics",
    "NormalizeOptions",
]

CpuGrouping = Literal["numa", "l3", "core"]
MatrixNics = Literal["rdma", "all"]


@dataclass(frozen=True)
class NormalizeOptions:
    driver: str = "toposlice.dev"
    """DRA driver name; also the domain of unqualified attribute names."""
    numa_list: bool = False
    """Publish ``resource.kubernetes.io/numaNode`` in the KEP-6072 list form (``ints``), and
    CPU-group PCIe roots as ``strings`` lists. Needs the ``DRAListTypeAttributes`` gate."""
    cpu_grouping: CpuGrouping = "numa"
    """One CPU device per NUMA node, per L3 cache group, or per physical core."""
    bridges: tuple[str, ...] = ()
    """Neighbour drivers whose NUMA dialect every device also speaks (``dra.cpu``,
    ``dra.net``: normalize/dialects.py); ``run`` adds those it sees on the node."""
    matrix_nics: MatrixNics = "rdma"
    """NICs in the graph's relation matrix: ``rdma`` physical functions (nvidia-smi's set)
    or ``all`` network functions."""
    max_devices_per_slice: int = MAX_DEVICES_PER_SLICE
    """Split the pool into slices of at most this many devices (capped by the upstream limits)."""

    def __post_init__(self) -> None:
        if self.cpu_grouping not in ("numa", "l3", "core"):
            raise ValueError(f"cpu_grouping must be numa, l3 or core, not {self.cpu_grouping!r}")
        if self.matrix_nics not in ("rdma", "all"):
            raise ValueError(f"matrix_nics must be rdma or all, not {self.matrix_nics!r}")
        from .dialects import check_bridges

        object.__setattr__(self, "bridges", check_bridges(self.bridges))
        if self.max_devices_per_slice < 1:
            raise ValueError("max_devices_per_slice must be >= 1")
