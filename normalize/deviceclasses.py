"""The DeviceClasses that select this driver's devices by kind: ``gpu``, ``nic``, ``cpu``.

One definition serves the Helm chart (which installs them; a test compares), the claims the
scorer emits and the examples (which name them). A class is named ``<kind>.<driver>`` and
selects on the driver and the device's ``type`` attribute.
"""

from __future__ import annotations

from typing import Any

DEVICE_KINDS = ("gpu", "nic", "cpu")


def device_class_name(kind: str, driver: str = "toposlice.dev") -> str:
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {kind!r}: one of {', '.join(DEVICE_KINDS)}")
    return f"{kind}.{driver}"


def device_class_selector(kind: str, driver: str = "toposlice.dev") -> str:
    """The CEL expression a class uses: this driver's devices whose ``type`` is ``kind``."""
    device_class_name(kind, driver)  # validates kind
    return f'device.driver == "{driver}" && device.attributes["{driver}"].type == "{kind}"'


def device_classes(driver: str = "toposlice.dev") -> list[dict[str, Any]]:
    """``resource.k8s.io/v1`` DeviceClass objects, one per kind."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": device_class_name(kind, driver)},
            "spec": {"selectors": [{"cel": {"expression": device_class_selector(kind, driver)}}]},
        }
        for kind in DEVICE_KINDS
    ]
