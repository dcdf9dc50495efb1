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
        help="read a saved `toposlice discover -o json` (or -o yaml) inventory instead of a host",
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


def add_normalize_args(p: argparse.ArgumentParser, *, driver_env: bool = False) -> None:
    """The normalization flags; ``driver_env``: ``--driver`` defaults to ``$DRIVER_NAME``
    (``run``, whose chart sets it)."""
    if driver_env:
        from driver.plumbing.checks import driver_default

        p.add_argument(
            "--driver",
            default=driver_default(),
            help="DRA driver name ($DRIVER_NAME; default toposlice.dev)",
        )
    else:
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
        "--bridge",
        type=bridge_arg,
        default=(os.environ.get("BRIDGE") or "auto") if driver_env else "none",
        metavar="DRIVERS",
        help="neighbour drivers whose NUMA attribute every device also carries, so claims "
        "can tie them with matchAttribute: dra.cpu,dra.net (both: dra.net/numaNode; "
        "dra.cpu adds dra.cpu/numaNodeID on CPUs), none"
        + (", or auto: those whose slices are on the node ($BRIDGE" if driver_env else " (")
        + "; default %(default)s)",
    )
    p.add_argument(
        "--legacy-aliases",
        action="store_const",
        const="dra.cpu,dra.net",
        dest="bridge",
        help="the same as --bridge dra.cpu,dra.net (kept for old charts)",
    )


def bridge_arg(value: str) -> str:
    """``--bridge``: ``auto``, ``none`` or a comma-separated list of bridgeable drivers."""
    from normalize.dialects import check_bridges

    value = value.strip()
    if value in ("auto", "none", ""):
        return value or "none"
    try:
        check_bridges(n.strip() for n in value.split(",") if n.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def static_bridges(value: str | None) -> tuple[str, ...]:
    """The drivers a ``--bridge`` value names (``auto`` and ``none``: none)."""
    if not value or value in ("auto", "none"):
        return ()
    return tuple(sorted({n.strip() for n in value.split(",") if n.strip()}))


def add_node_name_arg(p: argparse.ArgumentParser) -> None:
    """``--node-name``, defaulting to ``$NODE_NAME`` as in ``run``, then the host name, so
    ``slices`` in the plugin's pod prints what ``run`` publishes there."""
    from driver.plumbing.checks import node_name_default

    p.add_argument(
        "--node-name",
        default=node_name_default(),
        help="Kubernetes node name, also the pool's name "
        "(default: $NODE_NAME, else the host name, lower-cased)",
    )


def check_node_name(args: argparse.Namespace) -> None:
    """Refuse a ``--node-name`` (or ``$NODE_NAME``) the API server would refuse, an empty
    one included: the rule and wording of ``run`` (``driver.plumbing.checks.node_name_errors``)."""
    name = getattr(args, "node_name", None)
    if name is None:
        return
    from driver.plumbing.checks import node_name_errors

    if not name:
        raise ValueError("--node-name '': give a node name, or leave the flag out")
    errs = node_name_errors(name)
    if errs:
        raise ValueError(errs[0])


def check_object_name(flag: str, name: str, what: str = "object") -> None:
    """Refuse a name the API server (and ``kubectl create``) would refuse for an object:
    a DNS-1123 subdomain, as for node names. ValueError naming the flag."""
    from normalize.validation import is_dns_subdomain

    if not is_dns_subdomain(name):
        raise ValueError(
            f"{flag} {name!r} is not a valid Kubernetes {what} name (lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit, at most 253 "
            "characters)"
        )


def node_name_of(args: argparse.Namespace, inv: Inventory) -> str:
    """The node (and pool) name every command uses: ``--node-name``, else the inventory's
    host name lower-cased as the kubelet does, else this host's name. ValueError, naming
    ``--node-name``, when the host name cannot be a node name."""
    check_node_name(args)
    if getattr(args, "node_name", None):
        return str(args.node_name)
    import socket

    from normalize.names import node_name

    return node_name(inv.hostname or socket.gethostname())


def known_probes() -> list[str]:
    """Names ``--probes`` accepts: the built-in probes and installed entry points."""
    from plugins.registry import BUILTIN, GROUP, scan_entry_points

    names = dict(BUILTIN)
    try:
        names.update(scan_entry_points(GROUP))
    except Exception:  # a broken distribution: the built-ins still run
        pass
    return sorted(names)


def probe_list(text: str | None) -> list[str] | None:
    """``--probes a,b`` as a list (None, the flag left out: all); ValueError for a name no
    probe has, and for an empty list (``--probes ""`` is a mistake, not "all")."""
    if text is None:
        return None
    probes = [p.strip() for p in text.split(",") if p.strip()]
    known = known_probes()
    bad = [p for p in probes if p not in known]
    if bad or not probes:
        raise ValueError(
            f"--probes {text!r}: unknown probe {bad[0]!r} (installed: {', '.join(known)})"
            if bad
            else f"--probes {text!r}: no probe named"
        )
    return probes


def check_source(args: argparse.Namespace) -> None:
    """Cheap checks of the source flags, before a command binds, creates or discovers
    anything: a missing root or file, an unknown fake machine or probe. ValueError with
    one line naming the flag."""
    check_node_name(args)
    probe_list(getattr(args, "probes", None))
    inventory = getattr(args, "inventory", None)
    gathered = getattr(args, "gathered", None)
    fake = getattr(args, "fake", None)
    if inventory:
        read_inventory_file(inventory)
    elif gathered:
        check_gathered(gathered)
    elif fake:
        check_fake(fake)
    else:
        root = host_root(getattr(args, "root", None))
        if not os.path.isdir(root):
            flag = "--root" if getattr(args, "root", None) else "$HOST_ROOT"
            why = "not a directory" if os.path.exists(root) else "no such directory"
            raise ValueError(f"{flag} {root}: {why}")


def check_gathered(path: str) -> None:
    """``--gathered`` names a readable, whole gzip'd tar archive: a directory, a file of
    another kind (an inventory) and a truncated download each get one line naming it."""
    from discovery.replay import check_archive

    if os.path.isdir(path):
        raise ValueError(
            f"--gathered {path}: is a directory (give the archive `toposlice gather` wrote; "
            "an extracted one is read with --root)"
        )
    if not os.path.exists(path):
        raise ValueError(f"--gathered {path}: no such file")
    try:
        check_archive(path)
    except ValueError as exc:
        raise ValueError(f"--gathered {exc}") from exc


def check_fake(fake: str) -> None:
    """An unknown machine name, a missing machine file, or one that is not YAML."""
    from discovery.fake import load_machine, machine_path

    if not (fake.endswith((".yaml", ".yml")) or "/" in fake):
        machine_path(fake)  # ValueError listing the shipped machines
        return
    import yaml

    from driver.plumbing.checks import yaml_error_line

    try:
        with open(fake, encoding="utf-8") as fh:
            yaml.safe_load(fh)
    except OSError as exc:
        raise ValueError(f"--fake {fake}: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"--fake {fake}: not valid YAML: {yaml_error_line(exc)}") from exc
    load_machine(fake)  # the machine's own checks (ValueError naming the file and key)


def read_inventory_file(path: str) -> Inventory:
    """A saved ``toposlice discover -o json`` or ``-o yaml``; ValueError naming the file
    when it is not one. JSON is tried first (the C parser: an inventory is large)."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ValueError(f"--inventory {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"--inventory {path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:  # not JSON: YAML (a superset), or neither
        import yaml

        from driver.plumbing.checks import yaml_error_line

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as yexc:
            raise ValueError(
                f"--inventory {path}: not JSON ({exc}) or YAML ({yaml_error_line(yexc)})"
            ) from yexc
        if not isinstance(data, dict):
            raise ValueError(f"--inventory {path}: not JSON: {exc}") from exc
    if not isinstance(data, dict) or "schema" not in data:
        raise ValueError(
            f'--inventory {path}: not a toposlice inventory (no "schema" key; '
            "save one with `toposlice discover -o json`)"
        )
    try:
        return Inventory.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ValueError(f"--inventory {path}: {exc}") from exc


def load_inventory(args: argparse.Namespace) -> Inventory:
    """One inventory from the source the flags name."""
    return inventory_loader(args)()


def inventory_loader(args: argparse.Namespace) -> Callable[[], Inventory]:
    """A callable that rediscovers the source each time it is called (daemons call it on
    a timer and on hot-plug; a saved inventory file is re-read)."""
    if args.inventory:
        path = args.inventory

        def from_file() -> Inventory:
            return read_inventory_file(path)

        return from_file

    probes = probe_list(args.probes)
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
        bridges=static_bridges(getattr(args, "bridge", None)),
        matrix_nics=getattr(args, "matrix_nics", "rdma"),
    )
