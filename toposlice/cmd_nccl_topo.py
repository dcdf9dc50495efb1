"""``toposlice nccl-topo [--devices …]``: the NCCL topology XML the driver writes for claims.

The same writer as claim preparation (``normalize.nccl_topo.build_topology``, which the CDI
prepare path calls with the claim's GPUs and NICs): for the whole node by default, or for
the GPUs and NICs ``--devices`` names (``GPU0,NIC3`` as ``toposlice graph`` lists them, DRA
device names, or PCI bus ids). ``--output-file FILE`` writes it atomically (for
``NCCL_TOPO_FILE``); ``-o`` is the format, as in every command (XML, the one NCCL reads).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from toposlice.output import add_output_file_arg
    from toposlice.sources import add_normalize_args, add_source_args

    add_source_args(p)
    add_normalize_args(p)
    p.add_argument(
        "--devices",
        default=None,
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
    p.add_argument(
        "-o",
        "--output",
        choices=["xml"],
        default="xml",
        help="format: NCCL's topology XML, the only one (default %(default)s)",
    )
    add_output_file_arg(p, "the XML")


def run(args: argparse.Namespace) -> int:
    from normalize.device_refs import split_refs
    from normalize.nccl_topo import build_topology, resolve_devices
    from normalize.snapshot import build_snapshot
    from toposlice.output import OUTPUT_FILE, check_output_file, write_output_file
    from toposlice.sources import check_source, load_inventory, normalize_options

    check_source(args)
    if args.output_file:
        check_output_file(OUTPUT_FILE, args.output_file)
    tokens = split_refs(args.devices)
    inv = load_inventory(args)
    if not args.quiet:
        for warning in inv.warnings:
            print(f"toposlice: warning: {warning}", file=sys.stderr)
    opts = normalize_options(args)
    snap = build_snapshot(inv, args.node_name, opts)
    gpus, nics = resolve_devices(inv, tokens, snap.vertex_devices, opts.matrix_nics)
    text = build_topology(inv, gpus, nics, args.name or args.node_name)
    if args.output_file:
        write_output_file(OUTPUT_FILE, args.output_file, text.encode())
    else:
        sys.stdout.write(text)
    return 0
