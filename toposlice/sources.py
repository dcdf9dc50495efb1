"""Where a command's inventory comes from, and the normalization options: shared flags.

Every command that reads a node (``discover``, ``slices``, ``graph``, ``run``, ``serve``,
``score``, ...) takes the same source flags and builds its inventory through here, so a
new command module only calls :func:`add_source_args` and :func:`load_inventory`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from discovery.model import Inventory

if TYPE_CHECKING:
    from normalize.options import NormalizeOptions


def add_source_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--root",
        "--sysfs-root",
        dest="root",
        default=None,
        metavar="DIR",
        help="filesystem root to read (sysfs at DIR/sys); default: $HOST_ROOT, else this host",
    )
    src.add_argument(
        "--fake",
        metavar="NAME",
        help="run against built-in fake hardware (see `toposlice machines`) or a YAML file",
    )
    src.add_argument(
        "--inventory",
        metavar="FILE",
        help="read a saved `toposlice discover -o json` inventory instead of a host",
    )
    src.add_argument(
        "--gathered",
        metavar="FILE",
        help="replay a `toposlice gather` archive (its files and NVML answers)",
    )
    p.add_argument(
        "--probes",
        metavar="LIST",
        help="comma-separated probe names to run (default: all installed)",
    )


def add_normalize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--driver", default="toposlice.dev", help="DRA driver name (default %(default)s)"
    )
    p.add_argument(
        "--numa-list",
        action="store_true",
        help="publish numaNode in the list form (needs the DRAListTypeAttributes gate)",
    )
    p.add_argument(
        "--cpu-grouping",
        choices=["numa", "l3", "core"],
        default="numa",
        help="how CPUs are partitioned into devices (default %(default)s)",
    )
    p.add_argument(
        "--matrix-nics",
        choices=["rdma", "all"],
        default="rdma",
        help="NICs in the graph's relation matrix: RDMA physical functions as nvidia-smi "
        "lists them (default), or every network function",
    )
    p.add_argument(
        "--legacy-aliases",
        action="store_true",
        help="also publish dra.net/numaNode and dra.cpu/numaNodeID",
    )


def load_inventory(args: argparse.Namespace) -> Inventory:
    """One inventory from the source the flags name."""
    return inventory_loader(args)()


def inventory_loader(args: argparse.Namespace) -> Callable[[], Inventory]:
    """A callable that rediscovers the source each time it is called (daemons call it on
    a timer and on hot-plug; a saved inventory file is re-read)."""
    if args.inventory:
        path = args.inventory

        def from_file() -> Inventory:
            import json

            with open(path, encoding="utf-8") as fh:
                return Inventory.from_dict(json.load(fh))

        return from_file

    probes = [p.strip() for p in args.probes.split(",") if p.strip()] if args.probes else None
    gathered = getattr(args, "gathered", None)
    if gathered:

        def from_gathered() -> Inventory:
            from toposlice.replay import discover_gathered

            return discover_gathered(gathered, probes=probes)

        return from_gathered

    root, fake = host_root(args.root), args.fake

    def from_host() -> Inventory:
        from toposlice.discover import discover

        nvml = None
        if (
            fake is None
            and os.path.abspath(root) != "/"
            and os.path.exists(os.path.join(root, "nvml.json"))
        ):
            # An extracted `toposlice gather` archive keeps the NVML answers beside sys/
            # (checked first: the replay module's imports cost a cold start ~10 ms).
            from discovery.replay import gathered_nvml

            nvml = gathered_nvml(root)
        return discover(root, fake=fake, probes=probes, nvml=nvml)

    return from_host


def host_root(flag: str | None) -> str:
    """The filesystem root to read: ``--root``, else ``$HOST_ROOT`` (a daemon whose
    container mounts the host at ``/host``), else ``/``."""
    return flag or os.environ.get("HOST_ROOT") or "/"


def normalize_options(args: argparse.Namespace) -> NormalizeOptions:
    from normalize.options import NormalizeOptions

    return NormalizeOptions(
        driver=args.driver,
        numa_list=args.numa_list,
        cpu_grouping=args.cpu_grouping,
        legacy_aliases=args.legacy_aliases,
        matrix_nics=getattr(args, "matrix_nics", "rdma"),
    )
