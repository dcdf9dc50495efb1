"""PCI identity numbers as the probes read them: ids, class codes, vendor words.

Shared by every probe (GPUs, NICs, NVML's sysfs side) so that no probe imports
another; they read the strings sysfs discovery stored in :class:`PciDevice`.
"""

from __future__ import annotations

from discovery.model import PciDevice

__all__ = ["VENDOR_WORDS", "class_code", "parse_id", "vendor_word"]

VENDOR_WORDS: dict[int, str] = {
    0x10DE: "nvidia",
    0x1002: "amd",
    0x1022: "amd",
    0x8086: "intel",
    0x1DA3: "habana",
    0x1E52: "tenstorrent",
    0x1D0F: "amazon",
    0x1AE0: "google",
    0x19E5: "huawei",
    0x15B3: "mellanox",
    0x14E4: "broadcom",
    0x1AF4: "virtio",
}


def parse_id(text: str | None) -> int | None:
    """``0x10de`` / ``10DE`` / ``0x030200`` -> int; None when absent or malformed."""
    if not text:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def class_code(dev: PciDevice) -> int | None:
    """16-bit base class + subclass (``0x0302``), tolerating a 24-bit value with prog-if."""
    value = parse_id(dev.class_code)
    if value is None:
        return None
    return value >> 8 if value > 0xFFFF else value


def vendor_word(vendor: int | None) -> str:
    if vendor is None:
        return "unknown"
    return VENDOR_WORDS.get(vendor, f"0x{vendor:04x}")
