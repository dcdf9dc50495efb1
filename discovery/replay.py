"""Replay a ``toposlice gather`` archive: safe extraction and the recorded NVML answers.

``--gathered node.tar.gz`` extracts the archive into a temporary directory and runs the
ordinary discovery on it with the NVML answers of ``nvml.json``
(``toposlice.replay``); ``--root DIR`` on an extracted archive finds ``DIR/nvml.json``
the same way (:func:`gathered_nvml`).
Extraction refuses absolute names, ``..`` components, links leaving the archive and
anything but files, directories and symlinks, before and while extracting (tarfile's
``data`` filter).
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from discovery.nvml_replay import ReplayNvml

__all__ = ["check_archive", "extract_gathered", "gathered_nvml", "gathered_root", "restore_paths"]

NVML_FILE = "nvml.json"
META_FILE = "toposlice-gather.json"
_MAX_NVML_BYTES = 64 << 20
_MAX_MEMBERS = 2_000_000


def gathered_nvml(root: str) -> ReplayNvml | None:
    """The NVML replay stored beside an extracted archive's ``sys/``; None if absent."""
    path = os.path.join(root, NVML_FILE)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_NVML_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_NVML_BYTES:
        raise ValueError(f"{path}: larger than {_MAX_NVML_BYTES >> 20} MiB")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: want a JSON object")
    return ReplayNvml(data)


def _check_member(archive: str, member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "\\" in name:
        raise ValueError(f"{archive}: unsafe member name {name!r}")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise ValueError(f"{archive}: member {name!r} is not a file, directory or symlink")
    if member.issym():
        target = os.path.normpath(os.path.join(os.path.dirname(name), member.linkname))
        if os.path.isabs(member.linkname) or target == ".." or target.startswith("../"):
            raise ValueError(f"{archive}: symlink {name!r} points outside the archive")


#: What reading a damaged archive raises besides ``tarfile.TarError``: a truncated gzip
#: stream (``EOFError``), bad gzip/bz2/xz data (``OSError``, ``zlib.error``, ``lzma``).
_DAMAGED = (EOFError, OSError, ValueError)


def _archive_error(archive: str, exc: BaseException) -> ValueError:
    """One line for an archive that cannot be read: what it is, not tarfile's list of
    every compression it tried."""
    if isinstance(exc, tarfile.ReadError) and "could not be opened" in str(exc):
        why = "not a tar archive (want the .tar.gz `toposlice gather` writes)"
    elif isinstance(exc, EOFError) or "unexpected end" in str(exc):
        why = "truncated: the archive ends early (copied or downloaded in part?)"
    else:
        why = f"damaged archive: {' '.join(str(exc).split()) or type(exc).__name__}"
    return ValueError(f"{archive}: {why}")


def check_archive(archive: str) -> None:
    """Read the whole archive once, without extracting: ValueError naming it when it is
    no tar archive, is truncated or damaged (before a command binds or writes anything)."""
    try:
        with tarfile.open(archive, "r:*") as tf:
            for _member in tf:
                pass
    except IsADirectoryError:
        raise ValueError(f"{archive}: is a directory") from None
    except (tarfile.TarError, *_DAMAGED) as exc:
        if isinstance(exc, OSError) and exc.strerror and exc.filename:
            raise ValueError(f"{archive}: {exc.strerror}") from None
        raise _archive_error(archive, exc) from None


@contextmanager
def extract_gathered(archive: str) -> Iterator[str]:
    """Extract a gathered archive into a temporary directory (removed on exit)."""
    from discovery.fake import scratch_dir  # tmpfs when available: thousands of tiny files

    tmp = tempfile.mkdtemp(prefix="toposlice-gathered-", dir=scratch_dir())
    try:
        try:
            with tarfile.open(archive, "r:*") as tf:
                members = []
                for member in tf:
                    _check_member(archive, member)
                    members.append(member)
                    if len(members) > _MAX_MEMBERS:
                        raise ValueError(f"{archive}: more than {_MAX_MEMBERS} members")
                tf.extractall(tmp, members=members, filter="data")
        except (tarfile.TarError, EOFError, OSError) as exc:
            if isinstance(exc, OSError) and exc.strerror and exc.filename:
                raise ValueError(f"{archive}: {exc.strerror}") from None
            raise _archive_error(archive, exc) from None
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def restore_paths(warnings: list[str], extracted: str, root: str) -> list[str]:
    """Warnings of a replay with the gathered host's paths instead of the temporary ones."""
    return [w.replace(extracted, root.rstrip("/")) for w in warnings]


def gathered_root(extracted: str) -> str | None:
    """The root the archive was gathered from (its ``toposlice-gather.json``)."""
    try:
        with open(os.path.join(extracted, META_FILE), encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return None
    value = meta.get("root") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None
