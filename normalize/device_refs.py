"""Device references on the command line (``--devices GPU0,NIC3,...``): one parser for
``nccl-topo`` and ``score``, so a name one command takes the other takes too.

A reference is a relation-matrix label (``GPU<n>``/``NIC<n>``, as ``toposlice graph``
prints them, any case), a DRA device name (``gpu-0000-1b-00-0``), or a PCI bus id in any
spelling (``1b:00.0``, ``0000:1b:00.0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from discovery.readers import normalize_bdf

T = TypeVar("T")

__all__ = ["resolve_refs", "split_refs"]


def split_refs(text: str | None, flag: str = "--devices") -> list[str]:
    """``A,B`` as its references; None (the flag left out): []. An empty list given
    (``--devices ""``: a shell variable that was not set) is refused, never "all"."""
    if text is None:
        return []
    refs = [t.strip() for t in text.split(",") if t.strip()]
    if not refs:
        raise ValueError(f"{flag} {text!r}: no device named (leave the flag out for all)")
    return refs


def resolve_refs(
    refs: list[str],
    *,
    labels: Mapping[str, T],
    names: Mapping[str, T],
    buses: Mapping[str, T],
    flag: str = "--devices",
    what: str = "a GPU or NIC",
) -> list[T]:
    """The devices ``refs`` name, in order, each once. ``labels``: ``GPU<n>``-style label
    -> device (upper case); ``names``: DRA device name -> device; ``buses``: normalized
    PCI bus id -> device. ValueError names the first reference that matches nothing."""
    out: list[T] = []
    for ref in refs:
        dev = labels.get(ref.upper())
        if dev is None:
            dev = names.get(ref)
        if dev is None:
            dev = buses.get(normalize_bdf(ref) or ref.lower())
        if dev is None:
            raise ValueError(
                f"{flag}: {ref!r} is not {what} of this node (give GPU<n>/NIC<n> as "
                "toposlice graph lists them, a DRA device name or a PCI bus id)"
            )
        if all(dev is not d for d in out):
            out.append(dev)
    return out
