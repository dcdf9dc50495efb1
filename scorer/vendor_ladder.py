"""Claims for GPUs another driver publishes (``toposlice claim --gpus-from gpu.nvidia.com``),
each with toposlice's closest NIC and CPUs on the first GPU's NUMA node.

Beside NVIDIA's DRA GPU driver toposlice publishes only NICs and CPUs (``publish: [nic,
cpu]``, or its default, which leaves GPUs another driver publishes to it). The two drivers
share only the standard attributes, so those are the rungs: ``nic-i`` takes a NIC on
``gpu-i``'s PCIe root (``resource.kubernetes.io/pcieRoot``, the NIC a GPUDirect transfer
crosses no CPU for) and only when there is none free, one on its NUMA node (``numaNode``);
a node with neither for some GPU fails rather than hand out a NIC of the other socket.
The CPUs (``--cpu-groups``) share ``gpu-0``'s NUMA node.

Request order is the one that makes the first fit the closest: each GPU, then its NIC, so
the NIC rungs are tried per GPU. The vendor's GPUs carry no ordinal, so the GPU requests
cannot take windows as toposlice's own ladder does (scorer/ladder.py); what bounds the
search on a node that cannot hold the claim is that the NIC requests are hard (a GPU
without a NIC near it fails at once) and that the CPUs come right after ``gpu-0``. The
worst case is measured with the rest (bench/claim_worst_case.py, shapes ``vendor``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normalize.deviceclasses import device_class_name

from .ladder import _exact, _sub

STD = "resource.kubernetes.io"
#: A NIC's rungs with the attribute it shares with its GPU, closest first.
VENDOR_NIC_RUNGS = (("root", f"{STD}/pcieRoot"), ("numa", f"{STD}/numaNode"))
MAX_REQUESTS = 32
#: GPUs x NICs per GPU at most: past it the search on a node one NIC short grows past the
#: worst of toposlice's own shapes (bench/claim_worst_case.py --shapes vendor: 4 x 1 GPU-NIC
#: pairs 81 ms, 4 x 2 499 ms, 8 x 1 past the model's cap, on dgx-h100 beside the plugin).
MAX_PAIRED = 4


@dataclass(frozen=True)
class VendorGpus:
    """What the claim asks of the vendor's driver and of toposlice."""

    vendor: str
    gpus: int
    nics_per_gpu: int = 1
    cpu_groups: int = 0
    driver: str = "toposlice.dev"
    """toposlice's driver name (its NIC and CPU DeviceClasses)."""
    gpu_selectors: tuple[str, ...] = ()


def gpu_class(vendor: str) -> str:
    from normalize.dialects import DIALECTS

    dialect = DIALECTS.get(vendor)
    return (dialect.device_class if dialect else None) or vendor


def vendor_gpu_spec(want: VendorGpus) -> dict[str, Any]:
    """The ResourceClaimSpec (module docstring). ValueError for a shape the API refuses
    (more than 32 requests) or that pairs nothing."""
    n, per = want.gpus, want.nics_per_gpu
    if n < 1:
        raise ValueError("a claim for vendor GPUs needs at least one GPU")
    gcls = gpu_class(want.vendor)
    ncls = device_class_name("nic", want.driver)
    ccls = device_class_name("cpu", want.driver)
    rdma = (f'"rdmaDevice" in device.attributes["{want.driver}"]',)
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    if per == 0:
        requests.append({"name": "gpus", "exactly": _exact(gcls, n, want.gpu_selectors)})
        gpu_names = ["gpus"]
    else:
        if 2 * n + (1 if want.cpu_groups else 0) > MAX_REQUESTS:
            raise ValueError(f"--gpus {n}: at most {MAX_REQUESTS // 2} vendor GPUs with NICs")
        for i in range(n):
            requests.append({"name": f"gpu-{i}", "exactly": _exact(gcls, 1, want.gpu_selectors)})
            rungs = [_sub(rung, ncls, per, rdma) for rung, _ in VENDOR_NIC_RUNGS]
            requests.append({"name": f"nic-{i}", "firstAvailable": rungs})
            for rung, attr in VENDOR_NIC_RUNGS:
                constraints.append(
                    {"requests": [f"gpu-{i}", f"nic-{i}/{rung}"], "matchAttribute": attr}
                )
        gpu_names = ["gpu-0"]
    if want.cpu_groups:
        # Right after the first GPU: a node without CPUs on its NUMA node fails there.
        requests.insert(1, {"name": "cpu", "exactly": _exact(ccls, want.cpu_groups)})
        constraints.append({"requests": [*gpu_names, "cpu"], "matchAttribute": f"{STD}/numaNode"})
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}
