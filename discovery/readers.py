"""Tolerant readers for sysfs/procfs text files.

Every reader returns None (or an empty value) on a missing, unreadable or malformed
file instead of raising: discovery must produce a partial inventory from a damaged
tree. Callers that want to tell the operator record a warning themselves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from discovery.bounds import MAX_CPUS, MAX_INT_DIGITS, MAX_LINK_SPEED_GTS

__all__ = [
    "format_cpulist",
    "normalize_bdf",
    "parse_cpulist",
    "parse_cpumask",
    "parse_decimal",
    "parse_int",
    "parse_link_speed",
    "read_hex",
    "read_int",
    "read_text",
]


def read_text(path: str | os.PathLike[str]) -> str | None:
    """Content stripped of whitespace and NUL bytes; None if unreadable.

    Uses raw ``os.open``/``os.read``: discovery reads thousands of tiny files and the
    buffered ``open()`` machinery costs several times more per file.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except (OSError, ValueError):
        return None
    return _read_fd(fd)


def _read_fd(fd: int) -> str | None:
    """Read and close ``fd``; text without NULs and surrounding whitespace."""
    try:
        data = os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.replace(b"\x00", b"").decode("utf-8", "replace").strip()


def parse_int(text: str | None, base: int = 10) -> int | None:
    """The first word of ``text`` as an integer; None when malformed or longer than any
    number the kernel prints (so a 5,000-digit file cannot hit ``int``'s digit limit)."""
    if not text:
        return None
    word = text.split(None, 1)[0]
    if len(word) > MAX_INT_DIGITS or not word.isascii():
        return None
    try:
        return int(word, base)
    except ValueError:
        return None


def read_int(path: str | os.PathLike[str], base: int = 10) -> int | None:
    return parse_int(read_text(path), base)


def read_hex(path: str | os.PathLike[str]) -> int | None:
    return read_int(path, 16)


def parse_cpulist(text: str | None, limit: int = MAX_CPUS) -> list[int] | None:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]; None when malformed or when an id is
    not below ``limit`` (CPU ids: the largest NR_CPUS; the list also serves node ids).

    Ranges are merged before they are expanded, so the work is bounded by ``limit``
    however many ranges the text repeats.
    """
    if text is None:
        return None
    text = text.replace("\x00", "").strip()
    if not text:
        return []
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo_s, dash, hi_s = part.partition("-")
        lo = _small_int(lo_s)
        hi = _small_int(hi_s) if dash else lo
        if lo is None or hi is None or hi < lo or hi >= limit:
            return None
        spans.append((lo, hi))
    spans.sort()
    out: list[int] = []
    last = -1
    for lo, hi in spans:
        lo = max(lo, last + 1)
        if lo <= hi:
            out.extend(range(lo, hi + 1))
            last = hi
    return out


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also accepts superscripts that ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _small_int(text: str) -> int | None:
    text = text.strip()
    if len(text) > MAX_INT_DIGITS or not _digits(text):
        return None
    return int(text)


def format_cpulist(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> ``0-2,5`` (the kernel's list format; inverse of parse_cpulist)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpumask(text: str | None, limit: int = MAX_CPUS) -> list[int] | None:
    """``00000000,0000ffff`` (32-bit words, most significant first) -> CPU ids; None when
    malformed (a sign, non-hex characters) or when a bit at or above ``limit`` is set."""
    if text is None:
        return None
    text = text.replace("\x00", "").strip()
    if not text:
        return []
    try:
        value = int(text.replace(",", ""), 16)
    except ValueError:
        return None
    if value < 0 or value.bit_length() > limit:  # "-1" would never end the loop below
        return None
    out = []
    bit = 0
    while value:
        if value & 1:
            out.append(bit)
        value >>= 1
        bit += 1
    return out


def normalize_bdf(text: str) -> str | None:
    """Any ``domain:bus:dev.fn`` spelling (NVML upper-case, 8-digit domain) -> sysfs form."""
    try:
        text = text.strip()
        if text.count(":") == 1:
            text = "0:" + text
        dom_s, bus_s, rest = text.split(":")
        dev_s, fn_s = rest.split(".")
        dom, bus, dev, fn = int(dom_s, 16), int(bus_s, 16), int(dev_s, 16), int(fn_s, 16)
    except ValueError:
        return None
    if bus > 0xFF or dev > 0x1F or fn > 7 or dom < 0:
        return None
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def parse_link_speed(text: str | None) -> float | None:
    """``16.0 GT/s PCIe`` / ``8 GT/s`` -> 16.0 / 8.0; None for ``Unknown``, garbage, and
    speeds no PCIe link has (``inf``, ``nan``, above the bound)."""
    return parse_decimal(text, MAX_LINK_SPEED_GTS)


def parse_decimal(text: str | None, limit: float) -> float | None:
    """The first word of ``text`` as a plain positive decimal (``16``, ``2.5``) up to
    ``limit``; None for anything else (``inf``, ``1e999``, ``1.2.3``, signs)."""
    if not text:
        return None
    head = text.split(None, 1)[0]
    whole, _, frac = head.partition(".")
    if not (whole.isascii() and whole.isdigit()) or (
        frac and not (frac.isascii() and frac.isdigit())
    ):
        return None
    if len(whole) > MAX_INT_DIGITS:
        return None
    val = float(head[: MAX_INT_DIGITS * 2])
    return val if 0 < val <= limit else None


class DirReader:
    """Reads files of one directory through a directory fd (``openat``).

    Discovery reads ~15 files per PCI function; resolving the long sysfs path (and
    the ``bus/pci/devices`` symlink) once per directory instead of once per file,
    and skipping files the directory listing says are absent, is what keeps it
    faster than lstopo on the same tree.
    """

    __slots__ = ("fd", "names")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except (OSError, ValueError):
            self.fd = None
            self.names: frozenset[str] = frozenset()
            return
        try:
            self.names = frozenset(os.listdir(self.fd))
        except OSError:
            self.names = frozenset()

    def __enter__(self) -> DirReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def text(self, name: str) -> str | None:
        if self.fd is None or name not in self.names:
            return None
        try:
            fd = os.open(name, os.O_RDONLY, dir_fd=self.fd)
        except OSError:
            return None
        return _read_fd(fd)

    def link(self, name: str) -> str | None:
        """Basename of the symlink's target."""
        if self.fd is None or name not in self.names:
            return None
        try:
            return os.path.basename(os.readlink(name, dir_fd=self.fd).rstrip("/")) or None
        except OSError:
            return None
