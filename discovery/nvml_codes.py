"""NVML's numbers, in one table for the nvidia probe and the fake NVML.

The probe interprets what NVML returns and the fake returns it; both take the return
codes and enum values from here so the two cannot drift apart (values as in the NVML 13
header and nvidia-ml-py 13).
"""

from __future__ import annotations

NVML_ERROR_CODES: dict[str, int] = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "INSUFFICIENT_RESOURCES": 23,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "DEPRECATED": 26,
    "NOT_READY": 27,
    "GPU_NOT_FOUND": 28,
    "INVALID_STATE": 29,
    "UNKNOWN": 999,
}
"""NVML return codes by name (``NVML_ERROR_<name>``), as in the NVML 13 header."""

NVLINK_VERSION_ENUM: dict[str, int] = {
    "1.0": 1,
    "2.0": 2,
    "2.2": 3,
    "3.0": 4,
    "3.1": 5,
    "4.0": 6,
    "5.0": 7,
    "6.0": 8,
}
"""NVLink generation -> ``nvmlNvlinkVersion_t`` value (what NVML returns)."""


def nvml_error_name(code: int) -> str | None:
    """``NVML_ERROR_CODES`` name of a return code, or None for a code NVML does not define."""
    for name, value in NVML_ERROR_CODES.items():
        if value == code:
            return name
    return None


NVLINK_VERSIONS: dict[int, str] = {value: text for text, value in NVLINK_VERSION_ENUM.items()}
"""``nvmlNvlinkVersion_t`` value -> NVLink generation."""

NVLINK_DEVICE_TYPES: dict[int, str] = {0: "gpu", 1: "npu", 2: "switch"}
"""``nvmlIntNvLinkDeviceType_t`` (``NVML_NVLINK_DEVICE_TYPE_*``; 0xFF is unknown)."""

FABRIC_STATES: tuple[str, ...] = ("not_supported", "not_started", "in_progress", "completed")
"""``NVML_GPU_FABRIC_STATE_*`` by value."""

FABRIC_HEALTH: tuple[str, ...] = ("not_supported", "healthy", "unhealthy", "limited_capacity")
"""``NVML_GPU_FABRIC_HEALTH_SUMMARY_*`` by value."""

FABRIC_INFO_V2 = 0x02000024
FABRIC_INFO_V3 = 0x03000028
"""``nvmlGpuFabricInfo_v2`` / ``_v3``: the struct versions ``nvmlDeviceGetGpuFabricInfoV`` takes."""

ARCHITECTURES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}
"""``nvmlDeviceArchitecture_t`` (``NVML_DEVICE_ARCH_*``) -> name."""
