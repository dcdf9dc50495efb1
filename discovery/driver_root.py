"""Find a GPU driver's library under a mounted driver root (``$NVIDIA_DRIVER_ROOT``).

The chart's driver-root mode mounts the host's driver installation read-only at
``/driver-root`` (``/`` for a driver installed on the host, ``/run/nvidia/driver`` for
the GPU Operator's driver container), as the NVIDIA DRA driver's chart does. The library
is found in the usual library directories of that tree; symlinks are followed inside it
(an absolute target such as ``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15``
means that path under the root, not in the plugin's own image).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where distributions and the driver's installer put the libraries, most specific first.
LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
    "lib",
)
_MAX_LINKS = 40


def resolve_in_root(root: str | os.PathLike[str], rel: str) -> Path | None:
    """``rel`` (a path inside ``root``) with every symlink followed inside ``root``; None
    when a component is missing or the links loop."""
    base = Path(root)
    parts = [p for p in rel.split("/") if p and p != "."]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = base.joinpath(*done, part)
        if here.is_symlink():
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        if not os.path.lexists(here):
            return None
        done.append(part)
    return base.joinpath(*done)


def find_library(root: str | os.PathLike[str], name: str) -> Path | None:
    """The first regular file named ``name`` in :data:`LIB_DIRS` under ``root``."""
    for d in LIB_DIRS:
        path = resolve_in_root(root, f"{d}/{name}")
        if path is not None and path.is_file():
            return path
    return None
