"""The DeviceClasses that select this driver's devices: one per kind (``gpu``, ``nic``,
``cpu``) and one for every device of the driver, whatever its kind (``device``).

One definition serves the Helm chart (which installs them; a test compares), the claims the
scorer emits and the examples (which name them). A class is named ``<kind>.<driver>``; a
kind's selects on the driver and the device's ``type`` attribute, ``device`` on the driver.
"""

from __future__ import annotations

from typing import Any

DEVICE_KINDS = ("gpu", "nic", "cpu")
#: The class of every device the driver publishes. A whole node is one ``All`` request
#: over it: the allocator evaluates a request's class on every device of the node, so one
#: request costs one CEL evaluation per device where one per kind costs one per kind.
ANY_KIND = "device"
CLASS_KINDS = (*DEVICE_KINDS, ANY_KIND)


def device_class_name(kind: str, driver: str = "toposlice.dev") -> str:
    if kind not in CLASS_KINDS:
        raise ValueError(f"unknown device kind {kind!r}: one of {', '.join(CLASS_KINDS)}")
    return f"{kind}.{driver}"


def device_class_selector(kind: str, driver: str = "toposlice.dev") -> str:
    """The CEL expression a class uses: this driver's devices whose ``type`` is ``kind``
    (all of them for ``device``)."""
    device_class_name(kind, driver)  # validates kind
    if kind == ANY_KIND:
        return f'device.driver == "{driver}"'
    return f'device.driver == "{driver}" && device.attributes["{driver}"].type == "{kind}"'


def device_classes(driver: str = "toposlice.dev") -> list[dict[str, Any]]:
    """``resource.k8s.io/v1`` DeviceClass objects, one per kind, then ``device``."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": device_class_name(kind, driver)},
            "spec": {"selectors": [{"cel": {"expression": device_class_selector(kind, driver)}}]},
        }
        for kind in CLASS_KINDS
    ]
