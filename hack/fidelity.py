#!/usr/bin/env python3
"""Score discovery against hwloc's truth on every fixture with the fixtures' own scorer.

Usage: python3 hack/fidelity.py [FIXTURES_DIR]   (default ../shared/fixtures/hwloc)
Extracts each tarball to a temp dir, writes discovery's view in the
``topology-fidelity/v1`` schema (plus this host's, for the live-session-vm truth), and
runs ``fidelity_check.py --truth-dir/--got-dir``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from discovery.fidelity import to_fidelity  # noqa: E402
from discovery.host import discover_host  # noqa: E402


def main() -> int:
    fixtures = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO.parent / "shared/fixtures/hwloc"
    with tempfile.TemporaryDirectory() as tmp:
        got = Path(tmp) / "got"
        got.mkdir()
        for tarball in sorted(fixtures.glob("*.tar.bz2")):
            case = tarball.name[: -len(".tar.bz2")]
            dest = Path(tmp) / case
            with tarfile.open(tarball) as tf:
                tf.extractall(dest, filter="tar")
                top = {m.name.split("/")[0] for m in tf.getmembers() if m.name}.pop()
            inv, _ = discover_host(str(dest / top), live=False)
            (got / f"{case}.json").write_text(json.dumps(to_fidelity(inv, case)))
        # The live truth describes the VM the fixtures were made on: it scores 1.0 only on a
        # host of that shape (CI's and the developers' machines are).
        inv, _ = discover_host("/", live=True)
        (got / "live-session-vm.json").write_text(json.dumps(to_fidelity(inv, "live")))
        cmd = [sys.executable, str(fixtures / "fidelity_check.py"), "--truth-dir", str(fixtures)]
        return subprocess.call([*cmd, "--got-dir", str(got), "--quiet"])


if __name__ == "__main__":
    raise SystemExit(main())
