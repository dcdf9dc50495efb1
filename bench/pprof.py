"""Go CPU profiles (the gzipped ``profile.proto`` that ``/debug/pprof/profile`` serves)
read without a Go toolchain: how many seconds a process spent under the frames whose
function names match, and the hottest functions, flat and cumulative.

kube-scheduler serves its profile to any client its authorizer admits (the bench's
admin certificate); bench/cluster_scale.py ``--profile DIR`` records one per claim kind so
the allocator's time can be split into CEL evaluations and the rest.

The messages are built from a hand-written descriptor of the fields read here (names and
numbers as in github.com/google/pprof's proto/profile.proto) and parsed by protobuf.

Usage: python3 bench/pprof.py PROFILE.pb.gz [...] [--match SUBSTRING] [--top N]
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

_F = descriptor_pb2.FieldDescriptorProto

#: (message, [(field, number, type, repeated, message type)]) of profile.proto, the subset read.
_MESSAGES: tuple[tuple[str, tuple[tuple[str, int, int, bool, str], ...]], ...] = (
    (
        "Profile",
        (
            ("sample_type", 1, _F.TYPE_MESSAGE, True, "ValueType"),
            ("sample", 2, _F.TYPE_MESSAGE, True, "Sample"),
            ("location", 4, _F.TYPE_MESSAGE, True, "Location"),
            ("function", 5, _F.TYPE_MESSAGE, True, "Function"),
            ("string_table", 6, _F.TYPE_STRING, True, ""),
        ),
    ),
    ("ValueType", (("type", 1, _F.TYPE_INT64, False, ""), ("unit", 2, _F.TYPE_INT64, False, ""))),
    (
        "Sample",
        (
            ("location_id", 1, _F.TYPE_UINT64, True, ""),
            ("value", 2, _F.TYPE_INT64, True, ""),
        ),
    ),
    (
        "Location",
        (
            ("id", 1, _F.TYPE_UINT64, False, ""),
            ("line", 4, _F.TYPE_MESSAGE, True, "Line"),
        ),
    ),
    ("Line", (("function_id", 1, _F.TYPE_UINT64, False, ""),)),
    ("Function", (("id", 1, _F.TYPE_UINT64, False, ""), ("name", 2, _F.TYPE_INT64, False, ""))),
)


def _profile_class() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(
        name="toposlice_bench_pprof.proto", package="perftools.profiles", syntax="proto3"
    )
    for name, fields in _MESSAGES:
        msg = fd.message_type.add(name=name)
        for fname, number, ftype, repeated, mtype in fields:
            f = msg.field.add(name=fname, number=number, type=ftype)
            f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if mtype:
                f.type_name = f".perftools.profiles.{mtype}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("perftools.profiles.Profile"))


_PROFILE = _profile_class()


@dataclass(frozen=True)
class Stacks:
    """CPU nanoseconds per call stack (leaf first), summed over profiles."""

    stacks: dict[tuple[str, ...], int]

    @property
    def total_s(self) -> float:
        return sum(self.stacks.values()) / 1e9

    def seconds_under(self, match: str) -> float:
        """Seconds of the samples with a frame whose function name contains ``match``."""
        ns = sum(v for st, v in self.stacks.items() if any(match in f for f in st))
        return ns / 1e9

    def top(self, n: int = 20) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """(flat, cumulative): the ``n`` functions with most seconds."""
        flat: dict[str, int] = defaultdict(int)
        cum: dict[str, int] = defaultdict(int)
        for st, v in self.stacks.items():
            if st:
                flat[st[0]] += v
            for f in set(st):
                cum[f] += v

        def best(d: dict[str, int]) -> list[tuple[str, float]]:
            return [(k, v / 1e9) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]]

        return best(flat), best(cum)


def parse(data: bytes) -> Stacks:
    """One profile (gzipped or not) -> its stacks. The last sample value is CPU ns.
    Raises ValueError on what is not a profile."""
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        prof = _PROFILE()
        prof.ParseFromString(data)
    except (OSError, EOFError, message.DecodeError) as e:
        raise ValueError(f"not a pprof profile: {e}") from None
    strings = list(prof.string_table)
    fname = {f.id: strings[f.name] if 0 <= f.name < len(strings) else "?" for f in prof.function}
    loc = {lo.id: tuple(fname.get(ln.function_id, "?") for ln in lo.line) for lo in prof.location}
    out: dict[tuple[str, ...], int] = defaultdict(int)
    for s in prof.sample:
        if not s.value:
            continue
        stack = tuple(f for lid in s.location_id for f in loc.get(lid, ()))
        out[stack] += int(s.value[-1])
    return Stacks(dict(out))


def merge(profiles: Iterable[Stacks]) -> Stacks:
    out: dict[tuple[str, ...], int] = defaultdict(int)
    for p in profiles:
        for st, v in p.stacks.items():
            out[st] += v
    return Stacks(dict(out))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--match", action="append", default=[], help="seconds under SUBSTRING")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    try:
        stacks = merge(parse(open(p, "rb").read()) for p in args.profiles)
    except (OSError, ValueError) as e:
        print(f"pprof: {e}", file=sys.stderr)
        return 2
    total = stacks.total_s or 1.0
    print(f"# {stacks.total_s:.2f} s of CPU samples in {len(args.profiles)} profile(s)")
    for m in args.match:
        s = stacks.seconds_under(m)
        print(f"under {m}: {s:.2f} s ({100 * s / total:.1f} %)")
    flat, cum = stacks.top(args.top)
    for title, rows in (("flat", flat), ("cumulative", cum)):
        print(f"-- {title}")
        for name, s in rows:
            print(f"{100 * s / total:6.1f} %  {s:7.2f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
