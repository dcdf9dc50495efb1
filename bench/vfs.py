#!/usr/bin/env python3
"""Scaling with SR-IOV functions: 16 GPUs + 8 ConnectX-7 PFs with 250, 500 and 1,000 VFs.

For each size it generates the machine (hack/vf_machine.py, through the fake builder),
then times in this process, as medians of N runs: discovery (backends + probes),
``build_slices``, ``build_graph`` with its JSON, and the graph table; and prints the
sizes of the slices JSON, the graph JSON and the table. Each step should grow linearly
with the number of functions (time per 1,000 functions roughly constant across rows),
and the graph JSON should stay under 1 MiB at 1,000 VFs (issue #9).

Usage: python3 bench/vfs.py [--runs 5] [--sizes 250,500,1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from discovery.fake import fake_host  # noqa: E402
from discovery.root import Root  # noqa: E402
from hack.vf_machine import vf_machine  # noqa: E402
from normalize.graph import build_graph  # noqa: E402
from normalize.slices import build_slices  # noqa: E402
from toposlice.discover import discover_root  # noqa: E402
from toposlice.render import graph_table  # noqa: E402

PFS = 8
GPUS = 16


def median_ms(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    result = fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="250,500,1000", help="total VFs per row")
    args = ap.parse_args()
    print(f"{GPUS} GPUs, {PFS} PFs; median ms of {args.runs} runs; sizes in bytes")
    hdr = f"{'VFs':>6}{'funcs':>7}{'discover':>10}{'slices':>8}{'graph':>8}{'table':>8}"
    print(hdr + f"{'slices B':>10}{'graph B':>10}{'table B':>9}{'matrix':>8}{'ms/1k fn':>10}")
    for total in (int(x) for x in args.sizes.split(",")):
        per_pf = -(-total // PFS)
        spec = vf_machine(GPUS, PFS, per_pf)
        with fake_host(spec) as host:
            root = Root(host.root, live=False)
            t_disc, inv = median_ms(lambda root=root: discover_root(root), args.runs)
        t_sl, slices = median_ms(lambda inv=inv: json.dumps(build_slices(inv, "node-a")), args.runs)
        t_gr, graph = median_ms(lambda inv=inv: build_graph(inv), args.runs)
        graph_json = json.dumps(graph)
        t_tb, table = median_ms(lambda graph=graph: graph_table(graph), args.runs)
        funcs = len(inv.pci_devices)
        labels = len(graph["relations"]["labels"])
        per_k = (t_disc + t_sl + t_gr + t_tb) / funcs * 1000
        print(
            f"{per_pf * PFS:>6}{funcs:>7}{t_disc:>10.1f}{t_sl:>8.1f}{t_gr:>8.1f}{t_tb:>8.1f}"
            f"{len(slices):>10}{len(graph_json):>10}{len(table):>9}{labels:>8}{per_k:>10.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
