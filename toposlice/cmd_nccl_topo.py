"""``toposlice nccl-topo [--devices …]``: the NCCL topology XML the driver writes for claims.

The same writer as claim preparation (``driver.nccl_topo.build_topology``, which the CDI
prepare path calls with the claim's GPUs and NICs): for the whole node by default, or for
the GPUs and NICs ``--devices`` names (``GPU0,NIC3`` as ``toposlice graph`` lists them, DRA
device names, or PCI bus ids). ``-o FILE`` writes it atomically (for ``NCCL_TOPO_FILE``).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from toposlice.sources import add_normalize_args, add_source_args

    add_source_args(p)
    add_normalize_args(p)
    p.add_argument(
        "--devices",
        default="",
        metavar="LIST",
        help="comma-separated GPU<n>/NIC<n> (toposlice graph's labels), DRA device names "
        "or PCI bus ids (default: every GPU and NIC)",
    )
    p.add_argument(
        "--node-name", default="node", help="node name for DRA device names (default %(default)s)"
    )
    p.add_argument(
        "--name", default=None, help="the <system name=…> of the file (default: the node name)"
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from driver.atomic import write_atomic
    from driver.nccl_topo import build_topology, resolve_devices
    from normalize.snapshot import build_snapshot
    from toposlice.sources import check_source, load_inventory, normalize_options

    check_source(args)
    inv = load_inventory(args)
    if not args.quiet:
        for warning in inv.warnings:
            print(f"toposlice: warning: {warning}", file=sys.stderr)
    opts = normalize_options(args)
    snap = build_snapshot(inv, args.node_name, opts)
    tokens = [t.strip() for t in args.devices.split(",") if t.strip()]
    gpus, nics = resolve_devices(inv, tokens, snap.vertex_devices, opts.matrix_nics)
    text = build_topology(inv, gpus, nics, args.name or args.node_name)
    if args.output:
        write_atomic(Path(args.output), text.encode())
    else:
        sys.stdout.write(text)
    return 0
