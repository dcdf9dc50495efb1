#!/usr/bin/env python3
"""Score discovery against hwloc's truth on every fixture with the fixtures' own scorer.

Usage: python3 hack/fidelity.py [FIXTURES_DIR]   (default tests/data/hwloc)
Extracts each tarball to a temp dir, writes discovery's view in the
``topology-fidelity/v1`` schema (plus this host's, for the live-session-vm truth), and
runs ``fidelity_check.py --truth-dir/--got-dir``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from discovery.fidelity import to_fidelity  # noqa: E402
from discovery.host import discover_host  # noqa: E402
from discovery.root import Root  # noqa: E402
from hack.hwloc_fixtures import HWLOC, extract_case, hwloc_cases  # noqa: E402


def main() -> int:
    fixtures = Path(sys.argv[1]) if len(sys.argv) > 1 else HWLOC
    with tempfile.TemporaryDirectory() as tmp:
        got = Path(tmp) / "got"
        got.mkdir()
        for case in hwloc_cases(fixtures):
            root = extract_case(case, Path(tmp) / case, fixtures)
            inv, _ = discover_host(Root(root, live=False))
            (got / f"{case}.json").write_text(json.dumps(to_fidelity(inv, case)))
        # The live truth describes the VM the fixtures were made on: it scores 1.0 only on a
        # host of that shape (CI's and the developers' machines are).
        inv, _ = discover_host(Root("/", live=True))
        (got / "live-session-vm.json").write_text(json.dumps(to_fidelity(inv, "live")))
        cmd = [sys.executable, str(fixtures / "fidelity_check.py"), "--truth-dir", str(fixtures)]
        return subprocess.call([*cmd, "--got-dir", str(got), "--quiet"])


if __name__ == "__main__":
    raise SystemExit(main())
