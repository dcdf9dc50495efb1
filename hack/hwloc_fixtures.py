"""The hwloc sysfs dumps in ``../shared/fixtures/hwloc``: list them and extract them.

Tests, ``bench/`` and ``hack/`` all replay these tarballs; this is the one place that
knows where they live (``$TOPOSLICE_SHARED`` overrides ``../shared``), how
``cases.txt`` names them and that each tarball holds one top directory (the fsroot).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TOPOSLICE_SHARED", REPO.parent / "shared"))
HWLOC = SHARED / "fixtures" / "hwloc"


def hwloc_cases(fixtures: Path = HWLOC) -> list[str]:
    """Case names from ``cases.txt`` (first word of each line), in file order."""
    cases_txt = fixtures / "cases.txt"
    if not cases_txt.exists():
        return []
    out = []
    for line in cases_txt.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line.split()[0])
    return out


def case_env(case: str, fixtures: Path = HWLOC) -> dict[str, str]:
    """The extra lstopo environment ``cases.txt`` gives a case (``KEY=VALUE`` words)."""
    for line in (fixtures / "cases.txt").read_text().splitlines():
        words = line.split()
        if words and words[0] == case:
            return dict(w.split("=", 1) for w in words[1:] if "=" in w)
    return {}


def extract_case(case: str, dest: Path, fixtures: Path = HWLOC) -> Path:
    """Extract ``case``'s tarball under ``dest``; returns the fsroot (its one top directory)."""
    tarball = fixtures / f"{case}.tar.bz2"
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tf:
        tf.extractall(dest, filter="tar")
        tops = {m.name.split("/")[0] for m in tf.getmembers() if m.name}
    if len(tops) != 1:
        raise ValueError(f"{tarball} should hold one top directory, has {sorted(tops)}")
    return dest / tops.pop()


def extract_all(dest: Path, fixtures: Path = HWLOC) -> dict[str, Path]:
    """Every case extracted under ``dest/<case>/``: case name -> fsroot."""
    return {case: extract_case(case, dest / case, fixtures) for case in hwloc_cases(fixtures)}
