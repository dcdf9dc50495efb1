"""The pods fingerprint of a NodeResourceTopology: which pods the object's figures account for.

The NodeResourceTopology scheduler plugin, in its cached ("overreserve") mode, subtracts
the pods it placed on a node from that node's zones until it trusts a fresh object again.
It trusts one only when the object's ``nodeTopologyPodsFingerprint`` attribute equals the
fingerprint it computes itself from the pods its informer sees bound to that node; without
the attribute a node, once reserved, stays reserved for good.

The fingerprint is the k8stopologyawareschedwg ``podfingerprint`` format, version 1, as
NFD's topology updater writes it and the plugin checks it: ``pfp0v001`` followed by the
hex xxHash64 of the pods' hashes, each pod hashed as xxHash64 of its name seeded with the
xxHash64 of its namespace, sorted, each written as 8 little-endian bytes. The order the
pods are listed in does not matter.

Which pods count (:func:`counted`): those bound to the node whose phase is ``Running``.
That is the set the kubelet's pod-resources API lists (what NFD's topology updater signs)
and the set the plugin's shared-informer mode keeps; its dedicated-informer mode also
keeps pods that finished (Succeeded/Failed) until they are deleted, so on a node with
finished pods the two disagree until those are gone (docs/integrations.md). Pure
functions: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

#: The NodeResourceTopology attribute the plugin reads.
ATTRIBUTE = "nodeTopologyPodsFingerprint"
PREFIX = "pfp0"
VERSION = "v001"


def _pod_hash(namespace: str, name: str) -> int:
    seed = xxhash.xxh64_intdigest(namespace.encode())
    return int(xxhash.xxh64_intdigest(name.encode(), seed=seed))


def sign(pods: Iterable[tuple[str, str]]) -> str:
    """The fingerprint of a set of (namespace, name) pairs."""
    digest = xxhash.xxh64()
    for value in sorted(_pod_hash(ns, name) for ns, name in pods):
        digest.update(struct.pack("<Q", value))
    return f"{PREFIX}{VERSION}{digest.hexdigest()}"


def counted(pod: Mapping[str, Any], node_name: str) -> bool:
    """Whether a pod (an API object as a dict) belongs in ``node_name``'s fingerprint."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return spec.get("nodeName") == node_name and status.get("phase") == "Running"
