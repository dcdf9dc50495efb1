"""``toposlice machines [list]``, ``capture``, ``tree`` and ``mock-nvml``.

``list`` (the default) prints the built-in fake machines. ``tree`` writes a machine's
generated tree (``sys/``, ``proc/cpuinfo``, ...) to a directory, for another driver to
run on with it bind-mounted over ``/sys`` (docs/fake-hardware.md, "Running another
driver on a fake machine"). ``capture`` writes a machine
file in the fake format from a live host, a dump, a gathered archive or a saved
inventory: ``--fake node.yaml`` then generates a machine that discovery reads back as
the same inventory (docs/fake-hardware.md, "Captured machines"). After writing, the
file is loaded, generated and discovered once more; differences go to stderr and make
the exit status 1. ``mock-nvml`` writes the profile NVIDIA's mock NVML library reads, so a
vendor GPU driver run on the machine's tree describes the same GPUs as toposlice.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    import argparse as ap

    from toposlice.cli import examples

    sub = p.add_subparsers(dest="machines_command", metavar="{list,capture,tree,mock-nvml}")
    sub.add_parser(
        "list",
        help="list the built-in fake machines (the default)",
        description="List the built-in fake machines (names for --fake).",
        epilog=examples("toposlice machines list"),
        formatter_class=ap.RawDescriptionHelpFormatter,
    )
    cap = sub.add_parser(
        "capture",
        help="write a machine YAML that reproduces a host",
        description="Write a fake-machine YAML that reproduces a host (--fake FILE replays it).",
        epilog=examples(
            "toposlice machines capture --output-file node.yaml",
            "toposlice machines capture --gathered node.tar.gz --output-file node.yaml",
        ),
        formatter_class=ap.RawDescriptionHelpFormatter,
    )
    from toposlice.output import add_output_file_arg
    from toposlice.sources import add_source_args

    add_source_args(cap)
    cap.add_argument(
        "-o",
        "--output",
        choices=["yaml"],
        default="yaml",
        help="format: the fake-machine YAML `--fake FILE` reads, the only one "
        "(default %(default)s)",
    )
    add_output_file_arg(cap, "the machine file")
    cap.add_argument(
        "--no-check", action="store_true", help="do not regenerate the machine to compare"
    )
    tree = sub.add_parser(
        "tree",
        help="write a machine's sysfs tree to a directory (for other drivers)",
        description="Write a fake machine's generated tree (sys/, proc/cpuinfo, etc/hostname, "
        "...) under DIR, for another driver to run on with DIR/sys bind-mounted over /sys "
        "in a mount namespace of its own.",
        epilog=examples(
            "toposlice machines tree dgx-h100 --to /tmp/fake",
            "sudo unshare -m --propagation private "
            "sh -c 'mount --bind /tmp/fake/sys /sys && exec DRIVER ...'",
        ),
        formatter_class=ap.RawDescriptionHelpFormatter,
    )
    tree.add_argument(
        "machine", metavar="NAME|FILE.yaml", help="a shipped machine (machines list) or a file"
    )
    tree.add_argument(
        "--to", required=True, metavar="DIR", help="where to write (made when missing)"
    )
    tree.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty DIR, replacing the top-level paths the tree has there",
    )
    mock = sub.add_parser(
        "mock-nvml",
        help="write a mock-NVML profile of a machine's GPUs (for NVIDIA's DRA driver)",
        description="Write the YAML profile NVIDIA's mock NVML library reads "
        "(MOCK_NVML_CONFIG; NVIDIA/k8s-test-infra pkg/gpu/mocknvml) for a fake machine: its "
        "GPUs' bus ids, UUIDs, model, memory and driver version, so NVIDIA's DRA GPU driver "
        "run on the machine's tree (machines tree) publishes the GPUs toposlice describes.",
        epilog=examples(
            "toposlice machines mock-nvml gb200-nvl72-tray --output-file gb200.yaml",
            "MOCK_NVML_CONFIG=gb200.yaml gpu-kubelet-plugin ...",
        ),
        formatter_class=ap.RawDescriptionHelpFormatter,
    )
    mock.add_argument(
        "machine", metavar="NAME|FILE.yaml", help="a shipped machine (machines list) or a file"
    )
    add_output_file_arg(mock, "the profile")


def run(args: argparse.Namespace) -> int:
    command = getattr(args, "machines_command", None)
    if command == "tree":
        return _tree(args)
    if command == "mock-nvml":
        return _mock_nvml(args)
    if command != "capture":
        from discovery.fake import list_machines

        for name in list_machines():
            print(name)
        return 0
    return _capture(args)


def _origin(args: argparse.Namespace) -> str:
    for flag in ("inventory", "gathered", "fake"):
        value = getattr(args, flag, None)
        if value:
            return f"--{flag} {value}"
    from toposlice.sources import host_root

    root = host_root(getattr(args, "root", None))
    return "this host" if root == "/" else f"--root {root}"


def _capture(args: argparse.Namespace) -> int:
    from toposlice.capture import capture_yaml
    from toposlice.output import OUTPUT_FILE, check_output_file, write_output_file
    from toposlice.sources import check_source, load_inventory

    check_source(args)
    if args.output_file:
        check_output_file(OUTPUT_FILE, args.output_file)
    inv = load_inventory(args)
    text = capture_yaml(inv, _origin(args))
    if args.output_file:
        write_output_file(OUTPUT_FILE, args.output_file, text.encode())
    else:
        sys.stdout.write(text)
    if args.no_check:
        return 0
    diffs = _check(inv, text)
    if diffs:
        print(
            "toposlice: warning: the captured machine differs from the source in: "
            + ", ".join(diffs),
            file=sys.stderr,
        )
        return 1
    return 0


def _check(inv: object, text: str) -> list[str]:
    from discovery.fake import fake_host, load_yaml
    from discovery.model import Inventory
    from toposlice.capture import capture_differences
    from toposlice.discover import discover

    assert isinstance(inv, Inventory)
    spec = load_yaml(text, source="<capture>")
    with fake_host(spec) as host:
        replayed = discover(str(host.root), nvml=host.nvml)
    return capture_differences(inv, replayed)


def _tree(args: argparse.Namespace) -> int:
    """Build the tree in a scratch folder inside DIR, then move each top-level entry into
    place (over an existing one only with --force); one line per entry on stdout."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from discovery.fake import load_machine
    from discovery.fake.sysfs_builder import build_sysfs

    to = Path(args.to)
    if to.resolve() == Path("/"):
        raise ValueError(f"--to {args.to}: refusing to write over the root filesystem")
    if to.exists() and not to.is_dir():
        raise ValueError(f"--to {args.to}: not a directory")
    if to.is_dir() and any(to.iterdir()) and not args.force:
        raise ValueError(f"--to {args.to}: not empty (--force replaces what the tree writes)")
    spec = load_machine(args.machine)  # ValueError for an unknown name or a bad file
    to.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".toposlice-tree-", dir=to))
    try:
        build_sysfs(spec, scratch)
        entries = sorted(os.listdir(scratch))
        for name in entries:
            target = to / name
            if os.path.ismount(target):
                raise ValueError(f"--to {args.to}: {target} is a mount point; not replaced")
        for name in entries:
            target = to / name
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.exists():
                shutil.rmtree(target)
            os.rename(scratch / name, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name in entries:
        print(to / name)
    sysdir = (to / "sys").resolve()
    print(
        f"toposlice: {spec.name}'s tree is in {to}; run a driver on it (as root) with\n"
        f"  unshare -m --propagation private sh -c 'mount --bind {sysdir} /sys && exec DRIVER ...'",
        file=sys.stderr,
    )
    return 0


def _mock_nvml(args: argparse.Namespace) -> int:
    from discovery.fake import load_machine
    from discovery.fake.mock_nvml_profile import mock_nvml_yaml
    from toposlice.output import OUTPUT_FILE, check_output_file, write_output_file

    if args.output_file:
        check_output_file(OUTPUT_FILE, args.output_file)
    text = mock_nvml_yaml(load_machine(args.machine))  # ValueError: unknown, or no GPUs
    if args.output_file:
        write_output_file(OUTPUT_FILE, args.output_file, text.encode())
    else:
        sys.stdout.write(text)
    return 0
