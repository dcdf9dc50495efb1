"""The shared synthetic inventories survive the JSON round trip."""

from __future__ import annotations

from discovery.model import Inventory
from tests.inventories import amd, dgx, gb200, snc


def test_inventories_round_trip() -> None:
    for make in (dgx, gb200, amd, snc):
        inv = make()
        assert Inventory.from_dict(inv.to_dict()).to_dict() == inv.to_dict()
