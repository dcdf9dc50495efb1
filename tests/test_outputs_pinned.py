"""``discover``, ``slices`` and ``graph`` print, in every format, exactly what they printed
when ``tests/data/outputs.sha256`` was recorded -- on every shipped fake machine and hwloc
fixture dump. Refactors must not change a byte; an intended change regenerates the file
with ``python3 hack/record_outputs.py --checksums`` and says why in its commit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hack.record_outputs import CHECKSUMS, record_sources


def pinned() -> dict[str, str]:
    out = {}
    for line in CHECKSUMS.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        out[name] = digest
    return out


def test_outputs_match_the_pinned_checksums(hwloc_roots: dict[str, Path]) -> None:
    want = pinned()
    records = record_sources(hwloc_roots, shared=True)
    got = {
        name: hashlib.sha256(text.encode()).hexdigest()
        for name, text in records.items()
        if name in want
    }
    missing = sorted(set(want) - set(records))
    changed = sorted(name for name, digest in got.items() if digest != want[name])
    assert not missing, f"sources no longer recorded: {missing}"
    assert not changed, f"output changed (hack/record_outputs.py DIR shows it): {changed}"
    assert len(want) > 100
