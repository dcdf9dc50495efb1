"""Stable DRA device names derived from hardware identity (never enumeration order).

* GPUs ``gpu-<bdf>`` and NICs ``nic-<bdf>`` where ``0000:1b:00.0`` becomes ``0000-1b-00-0``;
* CPU groups ``cpu-numa<N>``, ``cpu-numa<N>-l3-<cache id>``, ``cpu-numa<N>-core-<pkg>-<core>``.

Every name is a DNS-1123 label (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63 characters).
Anything that would not fit is shortened and given a hash suffix computed from the device's
identity, so the result still does not depend on enumeration order.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence

from .limits import MAX_DNS_LABEL
from .validation import is_dns_label

MAX_LABEL = MAX_DNS_LABEL
_BAD_CHARS = re.compile(r"[^a-z0-9-]+")
_HASH_LEN = 8


def short_hash(identity: str, length: int = _HASH_LEN) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:length]


def bdf_slug(bus_id: str) -> str:
    """``0000:1b:00.0`` -> ``0000-1b-00-0`` (lower-cased; other odd characters become ``-``)."""
    return _BAD_CHARS.sub("-", bus_id.lower().replace(":", "-").replace(".", "-")).strip("-")


def _sanitize(candidate: str) -> str:
    text = _BAD_CHARS.sub("-", candidate.lower())
    text = re.sub(r"-{2,}", "-", text).strip("-")
    return text


def to_label(candidate: str, identity: str | None = None, *, force_hash: bool = False) -> str:
    """Make ``candidate`` a DNS-1123 label.

    Valid candidates are returned unchanged (unless ``force_hash``). Otherwise the sanitised text
    is cut so that ``-<hash>`` fits in 63 characters; the hash is taken from ``identity`` (or the
    original candidate), so different identities give different names.
    """
    key = identity if identity is not None else candidate
    if not force_hash and is_dns_label(candidate):
        return candidate
    text = _sanitize(candidate)
    if not force_hash and is_dns_label(text) and text == candidate.lower():
        return text
    suffix = short_hash(key)
    head = text[: MAX_LABEL - _HASH_LEN - 1].rstrip("-")
    return f"{head}-{suffix}" if head else f"x-{suffix}"


def gpu_name(bus_id: str) -> str:
    return to_label(f"gpu-{bdf_slug(bus_id)}", f"gpu:{bus_id}")


def nic_name(bus_id: str) -> str:
    return to_label(f"nic-{bdf_slug(bus_id)}", f"nic:{bus_id}")


def cpu_numa_name(numa: int) -> str:
    return to_label(f"cpu-numa{numa}")


def cpu_l3_name(numa: int, cache_id: int) -> str:
    return to_label(f"cpu-numa{numa}-l3-{cache_id}")


def cpu_core_name(numa: int, package: int, core: int) -> str:
    return to_label(f"cpu-numa{numa}-core-{package}-{core}")


def unique_names(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Resolve collisions in ``(candidate name, identity)`` pairs; returns names in input order.

    Unique names are kept. Colliding ones get a hash of their identity appended, so the result
    does not depend on the order of ``pairs``; entries that share name *and* identity are then
    numbered in sorted order.
    """
    names = [to_label(name, ident) for name, ident in pairs]
    counts = Counter(names)
    for i, (_, ident) in enumerate(pairs):
        if counts[names[i]] > 1:
            names[i] = to_label(names[i], ident, force_hash=True)
    counts = Counter(names)
    if all(c == 1 for c in counts.values()):
        return names
    seen = {n for n, c in counts.items() if c == 1}
    for i in sorted(range(len(pairs)), key=lambda j: (names[j], pairs[j], j)):
        if counts[names[i]] == 1:
            continue
        name = names[i]
        if name in seen:
            n = 2
            while True:
                tail = f"-{n}"
                candidate = name[: MAX_LABEL - len(tail)].rstrip("-") + tail
                if candidate not in seen and candidate not in counts:
                    break
                n += 1
            name = candidate
        names[i] = name
        seen.add(name)
    return names


def node_name(hostname: str) -> str:
    """The Kubernetes node name (and pool name) for a host name, as the kubelet derives it:
    lower-cased (``GPU-Node-01`` -> ``gpu-node-01``). ValueError, naming the flag to use,
    when even that is not a valid node name."""
    from .validation import is_dns_subdomain

    name = hostname.strip().lower()
    if not is_dns_subdomain(name):
        raise ValueError(
            f"host name {hostname[:80]!r} is not a valid Kubernetes node name "
            "(a lower-case DNS subdomain): give --node-name"
        )
    return name
