"""The filesystem root discovery reads: built once at the edge, handed to every reader.

``/`` on a live node, ``/host`` in a container that mounts the host there, or the top
of a dump (an hwloc fsroot tarball, a fake machine's generated tree, a gathered
archive). Every backend and probe takes this value instead of a string, so the path
is made absolute once, "is this the running host" is decided once, and nobody climbs
back from a sysfs path to the root with ``dirname``.
"""

from __future__ import annotations

import os

__all__ = ["Root"]


class Root:
    """An absolute filesystem root and whether it is the running host.

    ``live`` decides whether host libraries (NVML, psutil, udev's database, the
    hostname syscall) may be asked: they describe the running machine, not a dump.
    Plain strings rather than pathlib (start-up cost: docs/performance.md).
    """

    __slots__ = ("live", "path", "proc", "sys")

    def __init__(self, path: str | os.PathLike[str] = "/", live: bool | None = None) -> None:
        self.path: str = os.path.abspath(os.fspath(path))
        self.live: bool = self.path == "/" if live is None else live
        self.sys: str = os.path.join(self.path, "sys")
        """``<root>/sys``."""
        self.proc: str = os.path.join(self.path, "proc")
        """``<root>/proc``."""

    @classmethod
    def of(cls, root: Root | str | os.PathLike[str]) -> Root:
        """``root`` itself, or a Root at that path (for callers holding a path)."""
        return root if isinstance(root, Root) else cls(root)

    def join(self, *parts: str) -> str:
        """A path below the root: ``join("etc", "hostname")``."""
        return os.path.join(self.path, *parts)

    def sys_path(self, *parts: str) -> str:
        """A path below ``<root>/sys``: ``sys_path("class", "net")``."""
        return os.path.join(self.sys, *parts)

    def etc_path(self, *parts: str) -> str:
        """A path below ``<root>/etc``."""
        return os.path.join(self.path, "etc", *parts)

    def proc_path(self, *parts: str) -> str:
        """A path below ``<root>/proc``."""
        return os.path.join(self.proc, *parts)

    def relative(self, path: str) -> str:
        """``path`` (below the root) relative to ``<root>/sys``: the kernel's device path
        spelling that symlink targets are resolved against."""
        return os.path.relpath(path, self.sys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Root) and (self.path, self.live) == (other.path, other.live)

    def __hash__(self) -> int:
        return hash((self.path, self.live))

    def __repr__(self) -> str:
        return f"Root({self.path!r}, live={self.live})"

    def __fspath__(self) -> str:
        return self.path
