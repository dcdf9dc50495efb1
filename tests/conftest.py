"""Shared fixtures: the hwloc sysfs dumps from ``../shared/fixtures/hwloc``
(listed and extracted by ``hack/hwloc_fixtures.py``, which bench/ and hack/ use too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack.hwloc_fixtures import HWLOC, SHARED, extract_all, hwloc_cases

__all__ = ["HWLOC", "SHARED", "hwloc_cases", "load_truth"]


def load_truth(case: str) -> dict[str, Any]:
    with open(HWLOC / f"{case}.json", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


@pytest.fixture(scope="session")
def hwloc_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """case name -> extracted fsroot (the tarball's single top directory)."""
    if not HWLOC.exists():
        pytest.skip(f"hwloc fixtures not found at {HWLOC} (set TOPOSLICE_SHARED)")
    return extract_all(tmp_path_factory.mktemp("hwloc"))


#: Markers of the tiers that start real Kubernetes binaries. A plain ``pytest`` leaves
#: them out (they take minutes and need ``../shared/kube``); ``-m e2e`` / ``-m node`` or a
#: path inside their folders runs them.
TIER_MARKERS = ("e2e", "node")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.markexpr:
        return
    named = [str(a) for a in config.args]
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        tier = next((m for m in TIER_MARKERS if item.get_closest_marker(m)), None)
        if tier is None or any(f"{tier}" in Path(a).parts for a in named):
            keep.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
