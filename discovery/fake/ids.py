"""Deterministic ids for fake devices: MACs, GUIDs, GPU UUIDs, all derived from the
machine name and bus id, so a machine file generates the same tree on every run."""

from __future__ import annotations

import hashlib


def digest(*parts: str) -> bytes:
    return hashlib.sha256("/".join(parts).encode()).digest()


def mac(seed: bytes) -> str:
    b = bytearray(seed[:6])
    b[0] = (b[0] & 0xFC) | 0x02  # locally administered, unicast
    return ":".join(f"{x:02x}" for x in b)


def ipoib_address(guid: bytes) -> str:
    # 20-byte IPoIB hardware address: QPN (4 bytes) + port GID (16 bytes).
    raw = bytes([0x00, 0x00, 0x10, 0x49]) + bytes([0xFE, 0x80] + [0] * 6) + guid
    return ":".join(f"{x:02x}" for x in raw)


def guid(seed: bytes) -> str:
    h = seed[:8].hex()
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


def gpu_uuid(machine: str, bdf: str) -> str:
    h = digest("gpu-uuid", machine, bdf)[:16].hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def nonzero_bytes(seed: bytes) -> bytes:
    # ctypes c_char arrays stop at the first NUL: keep derived ids NUL-free.
    return bytes(b or 1 for b in seed)


# --------------------------------------------------------------------------- reader
