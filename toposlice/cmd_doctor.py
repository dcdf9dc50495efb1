"""``toposlice doctor``: checks the other DRA drivers' ResourceSlices of a node against its
hardware (from a kubeconfig or from slice files) and exits non-zero on findings."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from toposlice.sources import (
    add_node_name_arg,
    add_normalize_args,
    add_source_args,
    check_source,
    load_inventory,
    node_name_of,
    normalize_options,
)

if TYPE_CHECKING:
    from discovery.model import Inventory
    from normalize.crossdriver import Finding


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_source_args(p)
    add_normalize_args(p)
    add_node_name_arg(p)
    p.add_argument("--kubeconfig", help="read the node's ResourceSlices from this cluster")
    p.add_argument(
        "--slices",
        action="append",
        metavar="FILE",
        help="read ResourceSlices from a YAML/JSON file instead (repeatable): one object, a "
        "v1 List (kubectl get -o json/yaml), a YAML stream or a JSON array",
    )
    reg = p.add_mutually_exclusive_group()
    reg.add_argument(
        "--plugins-registry",
        metavar="DIR",
        help="kubelet plugin-registration directory: flag slices of drivers not registered",
    )
    reg.add_argument(
        "--drivers",
        metavar="LIST",
        help="comma-separated drivers registered on the node (instead of --plugins-registry)",
    )
    p.add_argument(
        "--cdi-spec-dirs",
        metavar="DIRS",
        help="CDI spec directories the container runtime reads (comma-separated): report "
        "GPUs with a bound kernel driver but no usable vendor CDI device (default on this "
        "host: /etc/cdi,/var/run/cdi; not checked for --fake/--inventory unless given)",
    )
    p.add_argument(
        "--kubernetes-version",
        metavar="MAJOR.MINOR",
        help="the cluster's Kubernetes version, for advice that depends on the scheduler "
        "(default: the API server's, with --kubeconfig; unknown with --slices)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml"],
        default="table",
        help="table: drivers and findings for people; json/yaml: the normalization report "
        "(default %(default)s)",
    )
    p.add_argument(
        "--fail-on",
        choices=["warning", "error"],
        default="warning",
        help="exit 1 when a finding of this severity or worse exists (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from driver.publisher.observe import ApiSlices, registered_drivers
    from normalize.crossdriver import normalization_report
    from normalize.snapshot import build_snapshot
    from toposlice.output import dump

    if not args.slices and not args.kubeconfig:
        print("toposlice: error: doctor needs --kubeconfig or --slices", file=sys.stderr)
        return 2
    check_source(args)
    if args.slices:
        slices = _slice_files(args.slices)
    else:
        from driver.plumbing.checks import check_kubeconfig

        check_kubeconfig(args.kubeconfig)
    inv = load_inventory(args)
    node = node_name_of(args, inv)
    snap = build_snapshot(inv, node, normalize_options(args))
    version = _version_flag(args.kubernetes_version)
    if args.slices:
        _check_for_node(slices, node)
    else:
        api = ApiSlices(node, args.kubeconfig)
        slices = api.list()
        if version is None:
            version = api.server_version()
    drivers: set[str] | None = None
    if args.drivers is not None:
        drivers = {d.strip() for d in args.drivers.split(",") if d.strip()}
    elif args.plugins_registry:
        drivers = registered_drivers(args.plugins_registry)
        if drivers is None:
            print(
                f"toposlice: warning: {args.plugins_registry} not readable; "
                "not checking for drivers gone from the node",
                file=sys.stderr,
            )
    report = normalization_report(snap, slices, node, drivers, version)
    report.findings.extend(vendor_cdi_findings(args, inv))
    if args.output == "table":
        sys.stdout.write(report_table(report.to_dict()))
    else:
        dump(report.to_dict(), args.output)
    failing = report.errors if args.fail_on == "error" else report.errors + report.warnings
    return 1 if failing else 0


def _version_flag(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    import re

    m = re.match(r"^v?(\d+)\.(\d+)(\.\d+)?$", text.strip())
    if m is None:
        raise ValueError(f"--kubernetes-version {text!r}: want MAJOR.MINOR, e.g. 1.36")
    return int(m.group(1)), int(m.group(2))


VENDOR_CDI_CHECK = "vendor-cdi-missing"


def vendor_cdi_findings(args: argparse.Namespace, inv: Inventory) -> list[Finding]:
    """One warning per GPU whose kernel driver is bound but that has no usable vendor CDI
    device (discovery/vendor_cdi.py): its pods would get no driver libraries."""
    from discovery.vendor_cdi import DEFAULT_SPEC_DIRS, KERNEL_DRIVERS, KIND_OF, VendorCdi
    from normalize.crossdriver import Finding
    from toposlice.sources import host_root

    live = not (args.fake or args.inventory or getattr(args, "gathered", None))
    if args.cdi_spec_dirs is None and not live:
        return []
    dirs = DEFAULT_SPEC_DIRS
    if args.cdi_spec_dirs is not None:
        dirs = tuple(d.strip() for d in args.cdi_spec_dirs.split(",") if d.strip())
    vendor = VendorCdi(dirs, host_root(args.root))
    out: list[Finding] = []
    for gpu in inv.gpus:
        pci = inv.pci(gpu.bus_id)
        want = KERNEL_DRIVERS.get(gpu.vendor)
        if pci is None or want is None or pci.driver != want:
            continue
        found = vendor.find(inv, gpu)
        if found.device is None:
            out.append(
                Finding(
                    driver=KIND_OF[gpu.vendor],
                    check=VENDOR_CDI_CHECK,
                    device=gpu.bus_id,
                    message=f"{found.problem}: pods get no driver libraries (docs/deploy.md)",
                )
            )
    for path, error in sorted(vendor.errors().items()):
        out.append(
            Finding(driver="cdi", check=VENDOR_CDI_CHECK, message=f"{path}: skipped: {error}")
        )
    return out


def _slice_files(paths: list[str]) -> list[dict[str, Any]]:
    """The ResourceSlices of each ``--slices`` file; ValueError for a file with none (a YAML
    string, another kind), naming it."""
    from driver.publisher.observe import load_slice_files

    out: list[dict[str, Any]] = []
    for path in paths:
        found = load_slice_files([path])
        if not found:
            raise ValueError(f"--slices {path}: no ResourceSlice in it")
        out.extend(found)
    return out


def _check_for_node(slices: list[dict[str, Any]], node: str) -> None:
    """Slice files all for other nodes would check nothing and pass: refuse them."""
    nodes = {(s.get("spec") or {}).get("nodeName") for s in slices if isinstance(s, dict)}
    if node in nodes:
        return
    others = sorted(str(n) for n in nodes if n)
    raise ValueError(
        f"--slices: none of the {len(slices)} ResourceSlices is for node {node!r} (they are "
        f"for {', '.join(others) or 'no node'}): give --node-name, or that node's slices"
    )


def report_table(report: dict[str, Any]) -> str:
    s = report["summary"]
    from toposlice.render import plural

    out = [
        f"node {report['node']}: {plural(s['devices'], 'device')} of "
        f"{plural(s['drivers'], 'driver')}, {s['matched']} matched to hardware; "
        f"{plural(s['errors'], 'error')}, {plural(s['warnings'], 'warning')}"
        + (f", {plural(s['infos'], 'note')}" if s.get("infos") else ""),
        "",
    ]
    rows: list[tuple[str, ...]] = [("DRIVER", "POOLS", "DEVICES", "MATCHED", "ON NODE", "FINDINGS")]
    for d in report["drivers"]:
        on = "?" if d["on_node"] is None else ("yes" if d["on_node"] else "NO")
        rows.append(
            (
                d["driver"],
                ",".join(d["pools"]),
                str(d["devices"]),
                str(d["matched"]),
                on,
                str(d["findings"]),
            )
        )
    out += _columns(rows)
    if report["findings"]:
        out.append("")
        rows = [("SEVERITY", "DRIVER", "DEVICE", "CHECK", "FINDING")]
        for f in report["findings"]:
            rows.append(
                (f["severity"], f["driver"], f.get("device", "-"), f["check"], f["message"])
            )
        out += _columns(rows)
    if report.get("not_published"):
        out += ["", "NOT PUBLISHED IN FULL (this node's own devices, over an API limit)"]
        for d in report["not_published"]:
            instead = f"published {d['published']}" if d.get("published") else "left out"
            out.append(f"  {d['device']}: {d['attribute']} {d['reason']}; {instead}")
    return "\n".join(out) + "\n"


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]).rstrip()
        for r in rows
    ]
