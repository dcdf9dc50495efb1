"""The checkpoint's write path: a checkpoint that fits one page is overwritten in place
(same inode, same size, fdatasync), a larger one and one without a boot id go through
temp + fsync + rename; the format stays the JSON document every version reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver import checkpoint
from driver.checkpoint import (
    PAGE,
    ClaimRecord,
    PreparedDevice,
    load_checkpoint,
    save_checkpoint,
)


def records(n: int, devices: int = 1) -> dict[str, ClaimRecord]:
    out = {}
    for i in range(n):
        devs = tuple(
            PreparedDevice(("req",), "node-a", f"gpu-{i}-{k}", (f"k8s.x/claim=u{i}-{k}",))
            for k in range(devices)
        )
        out[f"u{i}"] = ClaimRecord(f"u{i}", "ns", f"c{i}", "PrepareCompleted", devs, ("/a",))
    return out


def test_one_page_checkpoint_is_rewritten_in_place(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save_checkpoint(path, "boot", records(1), sync=True, sync_dir=False)
    assert path.stat().st_size == PAGE
    inode = path.stat().st_ino
    save_checkpoint(path, "boot", records(2), sync=True, sync_dir=False)
    save_checkpoint(path, "boot", {}, sync=True, sync_dir=False)
    save_checkpoint(path, "boot", records(3), sync=True, sync_dir=False)
    assert path.stat().st_ino == inode and path.stat().st_size == PAGE
    assert load_checkpoint(path, "boot") == (records(3), "ok")
    # The same document as before, padded with JSON whitespace: older drivers read it.
    doc = json.loads(path.read_bytes())
    assert set(doc) == {"checksum", "data"} and set(doc["data"]["claims"]) == {"u0", "u1", "u2"}
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_larger_checkpoint_and_no_boot_id_are_renamed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save_checkpoint(path, "boot", records(1), sync=True, sync_dir=False)
    inode = path.stat().st_ino
    big = records(20, devices=2)
    save_checkpoint(path, "boot", big, sync=True, sync_dir=False)
    assert path.stat().st_ino != inode and path.stat().st_size > PAGE
    assert load_checkpoint(path, "boot") == (big, "ok")
    # Back to one page: first a renamed one-page file, then in place again.
    save_checkpoint(path, "boot", records(1), sync=True, sync_dir=False)
    inode = path.stat().st_ino
    save_checkpoint(path, "boot", records(2), sync=True, sync_dir=False)
    assert path.stat().st_ino == inode
    # State that may outlive a reboot (no boot id) is always renamed.
    save_checkpoint(path, "", records(1), sync=True, sync_dir=True)
    assert path.stat().st_ino != inode


def test_a_read_racing_the_write_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader (another instance starting) may read the page while it is being
    overwritten: it sees a mix whose checksum fails. It reads again instead of moving a
    good checkpoint aside as corrupt; a really corrupt one is still moved aside."""
    path = tmp_path / "checkpoint.json"
    save_checkpoint(path, "boot", records(2), sync=False, sync_dir=False)
    good = path.read_bytes()
    save_checkpoint(path, "boot", records(3), sync=False, sync_dir=False)
    newer = path.read_bytes()
    torn = newer[:200] + good[200:]
    reads = iter([torn, newer])
    monkeypatch.setattr(Path, "read_bytes", lambda self: next(reads))
    assert load_checkpoint(path, "boot") == (records(3), "ok")
    monkeypatch.undo()
    path.write_bytes(torn)
    assert load_checkpoint(path, "boot") == ({}, "corrupt")
    assert (tmp_path / "checkpoint.json.corrupt").read_bytes() == torn


def test_not_a_one_page_file_is_not_overwritten(tmp_path: Path) -> None:
    """A file of another size (an older driver's checkpoint) or a hard-linked one is
    replaced by rename, never written into."""
    path = tmp_path / "checkpoint.json"
    path.write_text("{}")
    page = b" " * (PAGE - 1) + b"\n"
    assert checkpoint._overwrite_page(path, page, False) is False
    assert path.read_text() == "{}"
    save_checkpoint(path, "boot", records(1), sync=False, sync_dir=False)
    (tmp_path / "link").hardlink_to(path)
    assert checkpoint._overwrite_page(path, page, False) is False
