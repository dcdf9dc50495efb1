"""The hwloc sysfs dumps: list them, find their files and extract them.

Tests, ``bench/`` and ``hack/`` all replay these tarballs; this is the one place that
knows where they live, how ``cases.txt`` names them and that each tarball holds one top
directory (the fsroot). The project ships the public set in ``tests/data/hwloc``
(:data:`HWLOC`, provenance and licence there); ``../shared/fixtures/hwloc``
(``$TOPOSLICE_SHARED`` overrides ``../shared``) only adds cases that are not shipped.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The shipped dumps, truths, ``cases.txt`` and ``fidelity_check.py``.
HWLOC = REPO / "tests" / "data" / "hwloc"
SHARED = Path(os.environ.get("TOPOSLICE_SHARED", REPO.parent / "shared"))
#: Extra cases, when this folder exists.
SHARED_HWLOC = SHARED / "fixtures" / "hwloc"


def _folders(fixtures: Path | None) -> list[Path]:
    """Where to look: the one folder a caller names, else the shipped set then shared."""
    if fixtures is not None:
        return [fixtures]
    return [HWLOC] if SHARED_HWLOC.resolve() == HWLOC.resolve() else [HWLOC, SHARED_HWLOC]


def _case_lines(folder: Path) -> list[list[str]]:
    cases_txt = folder / "cases.txt"
    if not cases_txt.is_file():
        return []
    lines = (line.split() for line in cases_txt.read_text(encoding="utf-8").splitlines())
    return [words for words in lines if words and not words[0].startswith("#")]


def hwloc_cases(fixtures: Path | None = None) -> list[str]:
    """Case names from ``cases.txt`` (first word of each line), in file order: the shipped
    ones, then the shared folder's cases that are not shipped and have a tarball there
    (or only ``fixtures``'s, when given)."""
    out: list[str] = []
    for i, folder in enumerate(_folders(fixtures)):
        for words in _case_lines(folder):
            case = words[0]
            if case in out or (i > 0 and not (folder / f"{case}.tar.bz2").is_file()):
                continue
            out.append(case)
    return out


def extra_cases() -> list[str]:
    """The cases that only ``../shared`` has (not shipped in ``tests/data/hwloc``)."""
    shipped = set(hwloc_cases(HWLOC))
    return [c for c in hwloc_cases() if c not in shipped]


def case_file(case: str, suffix: str, fixtures: Path | None = None) -> Path:
    """``<case><suffix>`` (``.tar.bz2``, ``.json``) from the first folder that has it; the
    shipped folder's path when none has it (so that an error names it)."""
    folders = _folders(fixtures)
    for folder in folders:
        path = folder / f"{case}{suffix}"
        if path.is_file():
            return path
    return folders[0] / f"{case}{suffix}"


def case_env(case: str, fixtures: Path | None = None) -> dict[str, str]:
    """The extra lstopo environment ``cases.txt`` gives a case (``KEY=VALUE`` words)."""
    for folder in _folders(fixtures):
        for words in _case_lines(folder):
            if words[0] == case:
                return dict(w.split("=", 1) for w in words[1:] if "=" in w)
    return {}


def extract_case(case: str, dest: Path, fixtures: Path | None = None) -> Path:
    """Extract ``case``'s tarball under ``dest``; returns the fsroot (its one top directory)."""
    tarball = case_file(case, ".tar.bz2", fixtures)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tf:
        members = tf.getmembers()
        tops = {m.name.split("/")[0] for m in members if m.name}
        if len(tops) != 1:
            raise ValueError(f"{tarball} should hold one top directory, has {sorted(tops)}")
        # numeric_owner: as root, tarfile would otherwise look every member's owner and
        # group up by name (a third of the extraction time); the ids are irrelevant here.
        tf.extractall(dest, members=members, filter="tar", numeric_owner=True)
    return dest / tops.pop()


def extract_all(dest: Path, fixtures: Path | None = None) -> dict[str, Path]:
    """Every case extracted under ``dest/<case>/``: case name -> fsroot."""
    return {case: extract_case(case, dest / case, fixtures) for case in hwloc_cases(fixtures)}


class ExtractedCases(Mapping[str, Path]):
    """case name -> fsroot, each case extracted the first time it is looked up, at most
    once per ``dest`` even across processes (pytest-xdist workers share ``dest``): a file
    lock per case, extraction into a temporary folder renamed into place.

    The trees are shared: callers read them, and copy them before damaging anything.
    """

    def __init__(self, dest: Path, fixtures: Path | None = None) -> None:
        self.dest = dest
        self.fixtures = fixtures
        self._cases = hwloc_cases(fixtures)
        self._roots: dict[str, Path] = {}

    def __getitem__(self, case: str) -> Path:
        root = self._roots.get(case)
        if root is None:
            if case not in self._cases:
                raise KeyError(case)
            root = self._roots[case] = self._extract_once(case)
        return root

    def __iter__(self) -> Iterator[str]:
        return iter(self._cases)

    def __len__(self) -> int:
        return len(self._cases)

    def _extract_once(self, case: str) -> Path:
        self.dest.mkdir(parents=True, exist_ok=True)
        done = self.dest / case
        with open(self.dest / f".{case}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.is_dir():
                tmp = Path(tempfile.mkdtemp(prefix=f".{case}-", dir=self.dest))
                try:
                    extract_case(case, tmp, self.fixtures)
                    os.rename(tmp, done)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
        tops = [p for p in done.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ValueError(f"{done} should hold one top directory, has {sorted(tops)}")
        return tops[0]
