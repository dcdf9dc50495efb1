"""Record the ResourceSlices a real peer driver published, as test fixtures.

Reads ``kubectl get resourceslices -o yaml`` output (a v1 List) of one driver and writes
them with the node renamed to the fixtures' node and the server-set metadata (uid,
resourceVersion, timestamps, owner) removed; every device and attribute stays as the
driver wrote it. The interop tier (tests/interop/) records them this way: see
tests/data/foreign-slices/README.md for which peer version made each file.

    python3 hack/record_peer_slices.py IN.yaml OUT.yaml --driver dra.cpu --header "..."
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

NODE = "dgx-h100"


def recorded(items: list[dict[str, Any]], driver: str, node: str = NODE) -> list[dict[str, Any]]:
    """The slices of ``driver`` in a stable form: sorted by name, node and pool renamed."""
    out = []
    mine = [s for s in items if (s.get("spec") or {}).get("driver") == driver]
    for index, s in enumerate(sorted(mine, key=lambda s: s["metadata"]["name"])):
        spec = dict(s["spec"])
        old_node = spec.get("nodeName")
        spec["nodeName"] = node
        pool = dict(spec.get("pool") or {})
        if pool.get("name") == old_node:
            pool["name"] = node
        spec["pool"] = pool
        out.append(
            {
                "apiVersion": s.get("apiVersion", "resource.k8s.io/v1"),
                "kind": "ResourceSlice",
                "metadata": {"name": f"{index:05d}-{driver}-{node}"},
                "spec": spec,
            }
        )
    return out


def write(path: Path, slices: list[dict[str, Any]], header: str) -> None:
    """Temp file, fsync, rename: a fixture is never half written."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for line in header.strip().splitlines():
            fh.write(f"# {line}\n")
        yaml.safe_dump_all(slices, fh, sort_keys=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--driver", required=True)
    ap.add_argument("--node", default=NODE)
    ap.add_argument("--header", default="")
    args = ap.parse_args()
    with open(args.input, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    items = doc.get("items", []) if isinstance(doc, dict) else []
    write(Path(args.output), recorded(items, args.driver, args.node), args.header)


if __name__ == "__main__":
    main()
