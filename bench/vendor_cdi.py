#!/usr/bin/env python3
"""What the vendor CDI lookup (discovery/vendor_cdi.py) adds to a prepare, in this process.

  prepare      DriverState.prepare of a claim of 2 GPUs of the fake dgx-h100, p50/p99
               over --calls calls (each unprepared again, untimed), without a vendor spec
               directory and with an nvidia-ctk style spec of the 8 GPUs, with --claims
               other claims' spec files left in the CDI root (listed, never read)
  registry     VendorCdi.registry() alone once parsed (a directory listing and a stat per
               vendor file), p50/p99
  parse        parsing the 8-GPU YAML spec (done once per change of the file)

No API server and no gRPC: only the driver's own work, on the temp directory of --dir
(default: a tmpfs one when /dev/shm exists, as /var/run/cdi is).
Usage: python3 bench/vendor_cdi.py [--calls 2000] [--claims 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# The repository, not bench/ (whose http.py would shadow the standard library).
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.stats import pct  # noqa: E402
from discovery.vendor_cdi import parse_spec, spec_dirs  # noqa: E402
from driver.kubelet.state import ClaimRef, DriverState  # noqa: E402
from driver.kubelet.vendor_cdi import VendorCdi  # noqa: E402
from tests import vendor_specs  # noqa: E402
from tests.driver_support import FakeClaims, claim, device_names, make_state, snapshot  # noqa: E402


def _prepare_times(
    state: DriverState, reader: FakeClaims, gpus: list[str], calls: int
) -> list[float]:
    out: list[float] = []
    for i in range(calls):
        uid = f"bench-{i}-{time.perf_counter_ns()}"
        c = reader.add(claim(uid, gpus))
        ref = ClaimRef("default", c["metadata"]["name"], uid)
        t0 = time.perf_counter()
        res = state.prepare([ref])[uid]
        out.append((time.perf_counter() - t0) * 1000)
        assert res.error == "", res.error
        state.unprepare([ref])
    return out


def _state(base: Path, with_spec: bool, claims: int) -> tuple[DriverState, FakeClaims]:
    run = base / "run-cdi"
    run.mkdir(parents=True)
    if with_spec:
        inv = snapshot().inventory
        spec = vendor_specs.nvidia_ctk_spec(inv, dev_root="/run/nvidia/driver")
        vendor_specs.write(run / "nvidia.yaml", spec)
    vendor = VendorCdi(
        spec_dirs([str(run)], str(base / "cdi")),
        base / "root",
        own_prefixes=("k8s.toposlice.dev-", "toposlice.dev-"),
    )
    reader = FakeClaims()
    state = make_state(base, reader, vendor_cdi=vendor)
    for i in range(claims):  # other claims' spec files in the CDI root
        (base / "cdi" / f"k8s.toposlice.dev-claim_other-{i}.json").write_text("{}\n")
    return state, reader


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--claims", type=int, default=100)
    p.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    args = p.parse_args()
    gpus = device_names(snapshot(), "gpu-")[:2]
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ts-vcdi-") as tmp:
        labels = (("no vendor spec", False), ("nvidia.yaml, 8 GPUs", True))
        states = [
            _state(Path(tmp) / f"s{n}", spec, args.claims) for n, (_, spec) in enumerate(labels)
        ]
        for state, reader in states:
            _prepare_times(state, reader, gpus, 50)  # warm-up
        # Call by call in turn, so that both see the same load.
        times: list[list[float]] = [[], []]
        for _ in range(args.calls):
            for n, (state, reader) in enumerate(states):
                times[n] += _prepare_times(state, reader, gpus, 1)
        for (label, _), t in zip(labels, times, strict=True):
            rows.append((f"prepare, {label}", t))
        vendor = states[1][0].vendor_cdi
        assert vendor is not None
        reg_times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            vendor.registry()
            reg_times.append((time.perf_counter() - t0) * 1000)
        rows.append(("registry() once parsed", reg_times))
        raw = vendor_specs.write(
            Path(tmp) / "nvidia.yaml", vendor_specs.nvidia_ctk_spec(snapshot().inventory)
        )
        data = raw.read_bytes()
        parse_times = []
        for _ in range(200):
            t0 = time.perf_counter()
            parse_spec(data, str(raw))
            parse_times.append((time.perf_counter() - t0) * 1000)
        rows.append(("parse the 8-GPU YAML spec", parse_times))
    head = f"{'figure':40} {'p50 ms':>8} {'p99 ms':>8}"
    print(f"{head}   ({args.calls} calls, {args.claims} other specs)")
    for name, values in rows:
        print(f"{name:40} {pct(values, 50):8.3f} {pct(values, 99):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
