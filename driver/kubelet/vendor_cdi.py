"""The GPU vendor's own CDI devices (``nvidia.com/gpu``, ``amd.com/gpu``) in a claim's answer.

The spec directories are read by discovery/vendor_cdi.py (as the runtime's CDI cache reads
them); here each GPU of a claim gets its vendor device first in its ``cdi_device_ids``, so
the runtime applies the vendor's edits (the driver's user space), then toposlice's
(../shared/reference/cdi.md section 8).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from discovery import vendor_cdi
from discovery.model import Gpu, Inventory
from discovery.vendor_cdi import VendorDevice
from driver.kubelet import cdi
from driver.kubelet.checkpoint import PreparedDevice

#: The reason of the Node Event that reports the gap.
EVENT_REASON = "VendorCDIMissing"


class VendorCdi(vendor_cdi.VendorCdi):
    """The vendor devices of the spec directories, for :class:`~driver.kubelet.state.DriverState`
    (thread-safe: prepares run concurrently)."""

    def attach(
        self,
        inv: Inventory,
        gpus: Iterable[tuple[str, Gpu]],
        claim_uid: str,
        edits: dict[str, cdi.ContainerEdits],
        common: cdi.ContainerEdits,
        prepared: list[PreparedDevice],
    ) -> list[PreparedDevice]:
        """Put each GPU's vendor id first in its ``cdi_ids`` and leave out of toposlice's
        edits for it (``edits["<claim uid>-<device>"]``, in place) every device node that id
        already adds. When every NVIDIA GPU of the claim has a vendor id, the claim's
        ``NVIDIA_VISIBLE_DEVICES`` is left out too: the vendor spec sets it to ``void`` so
        that an NVIDIA runtime configured as default does not inject the GPUs a second
        time, and toposlice's, applied after it, would win."""
        found: dict[str, VendorDevice] = {}
        nvidia_total = nvidia_found = 0
        reg = self.registry()
        for name, gpu in gpus:
            hit = self.find(inv, gpu, reg).device
            nvidia_total += gpu.vendor == "nvidia"
            if hit is None:
                continue
            nvidia_found += gpu.vendor == "nvidia"
            found[name] = hit
            own = edits.get(f"{claim_uid}-{name}")
            if own and own.get("deviceNodes"):
                kept = [n for n in own["deviceNodes"] if n["path"] not in hit.node_paths]
                if kept:
                    own["deviceNodes"] = kept
                else:
                    del own["deviceNodes"]
        if not found:
            return prepared
        if nvidia_total and nvidia_found == nvidia_total:
            env = common.get("env") or []
            common["env"] = [e for e in env if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        out = []
        for dev in prepared:
            hit = found.get(dev.device)
            out.append(
                dev
                if hit is None
                else replace(dev, cdi_ids=(hit.id, *dev.cdi_ids), vendor_cdi_ids=(hit.id,))
            )
        return out
