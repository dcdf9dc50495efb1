"""Shared fixtures: the hwloc sysfs dumps from ``../shared/fixtures/hwloc``."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TOPOSLICE_SHARED", REPO.parent / "shared"))
HWLOC = SHARED / "fixtures" / "hwloc"


def hwloc_cases() -> list[str]:
    cases_txt = HWLOC / "cases.txt"
    if not cases_txt.exists():
        return []
    out = []
    for line in cases_txt.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line.split()[0])
    return out


def load_truth(case: str) -> dict[str, Any]:
    with open(HWLOC / f"{case}.json", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


@pytest.fixture(scope="session")
def hwloc_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """case name -> extracted fsroot (the tarball's single top directory)."""
    if not HWLOC.exists():
        pytest.skip(f"hwloc fixtures not found at {HWLOC} (set TOPOSLICE_SHARED)")
    base = tmp_path_factory.mktemp("hwloc")
    roots = {}
    for case in hwloc_cases():
        tarball = HWLOC / f"{case}.tar.bz2"
        dest = base / case
        dest.mkdir()
        with tarfile.open(tarball) as tf:
            tf.extractall(dest, filter="tar")
            tops = {m.name.split("/")[0] for m in tf.getmembers() if m.name}
        assert len(tops) == 1, f"{tarball} should hold one top directory, has {tops}"
        roots[case] = dest / tops.pop()
    return roots
