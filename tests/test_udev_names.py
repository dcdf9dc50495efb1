"""udev hwdb names fill PCI device names on a live host, and their absence is harmless."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from discovery import udev


class _Dev:
    def __init__(self, name: str, props: dict[str, str]) -> None:
        self.sys_name = name
        self.properties = props


def _fake_pyudev(devices: list[_Dev], fail: bool = False) -> types.ModuleType:
    mod = types.ModuleType("pyudev")

    class Context:
        def list_devices(self, subsystem: str) -> list[_Dev]:
            assert subsystem == "pci"
            if fail:
                raise OSError("no udev database")
            return devices

    mod.Context = Context  # type: ignore[attr-defined]
    return mod


def test_names_from_hwdb(monkeypatch: pytest.MonkeyPatch) -> None:
    devs = [
        _Dev(
            "0000:18:00.0",
            {
                "ID_VENDOR_FROM_DATABASE": "Mellanox Technologies",
                "ID_MODEL_FROM_DATABASE": "MT2910 Family [ConnectX-7]",
            },
        ),
        _Dev("0000:00:00.0", {}),
    ]
    monkeypatch.setitem(sys.modules, "pyudev", _fake_pyudev(devs))
    assert udev.pci_names() == {
        "0000:18:00.0": ("Mellanox Technologies", "MT2910 Family [ConnectX-7]")
    }


@pytest.mark.parametrize("module", [None, "fail"])
def test_no_udev_gives_no_names(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    fake = None if module is None else _fake_pyudev([], fail=True)
    monkeypatch.setitem(sys.modules, "pyudev", fake)
    assert udev.pci_names() == {}
