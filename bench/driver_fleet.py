#!/usr/bin/env python3
"""What a fleet of drivers asks of the API server (issue #22, item 4).

DRIVERS real `toposlice run --fake MACHINE` processes (dgx-h100 and pcie-8gpu in turn),
each on a Node of its own, as the chart's ServiceAccount with a token bound to a Pod on
that node (tests/e2e/toposlice_setup.py's NodeDriver: RBAC and the admission policy are
the chart's; this process registers each driver as its kubelet would), against one real
v1.36.2 control plane (tests/e2e/cluster.py). STATIC more Nodes carry the slices
`toposlice slices` prints and no driver, so each driver's field-selected LIST and WATCH
are served from a larger set. The controller-manager's node-lifecycle controller is off
(no kubelets renew Leases), so nothing but the drivers and the scheduler's and
controller-manager's own informers talk to the API server.

Counted on the server, two ways:

  audit     kube-apiserver's audit log (level Metadata for the drivers' ServiceAccount
            only): every request of every driver, attributed by the node its token is
            bound to (user extra ``authentication.kubernetes.io/node-name``; the drivers
            also name it in their User-Agent), at the time it was received;
  metrics   ``apiserver_request_total`` deltas by verb and resource, all clients (a
            WATCH counts when it ends; kube-apiserver restarts from zero, so the
            API-server-restart column is the new server's count).

Three phases: STEADY seconds after WARMUP (requests per driver per minute), a
simultaneous restart of every driver (all killed with SIGKILL, all started at once;
requests per driver from the kill until every driver is ready again plus SETTLE seconds)
and an API-server restart (the same, from the restart). Targets (issue #22): 0 LISTs and
0 writes per driver per minute in steady state; at most 3 requests per driver per
resource after either restart. The last line is JSON. With 100 nodes or more in all it
takes /tmp/toposlice-heavy.lock.

Usage: python3 bench/driver_fleet.py [--drivers 30] [--static 50] [--warmup 30]
  [--steady 60] [--settle 20] [--resync 10] [--src DIR] [--json FILE]

``--src DIR`` runs the drivers from another source tree (``git archive REV | tar -x -C
DIR``), e.g. the driver before its publisher watched its slices.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/http.py would shadow the standard library's http package: drop the script's folder.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.cluster_scale import heavy_lock  # noqa: E402
from tests.e2e.cluster import SKIP_REASON, Cluster, find_assets, poll  # noqa: E402
from tests.e2e.toposlice_setup import NAMESPACE, SERVICE_ACCOUNT, NodeDriver, install  # noqa: E402

MACHINES = ("dgx-h100", "pcie-8gpu")
NODE_EXTRA = "authentication.kubernetes.io/node-name"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: Targets of issue #22: per driver per minute in steady state; per driver per resource
#: after a restart.
STEADY_LIST_WRITES_PER_MIN = 0.0
RESTART_PER_RESOURCE = 3
PHASES = ("steady", "driver_restart", "apiserver_restart")
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"]
  - level: None
"""


class FleetDriver(NodeDriver):
    """A NodeDriver that can run another source tree (``--src``)."""

    src: Path | None = None

    def start(self) -> FleetDriver:
        env = dict(os.environ, TOPOSLICE_FAKE_TMPDIR=str(self.fake_tmp))
        argv = self.argv()
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src)
            argv.insert(1, "-P")  # `-m` would put this tree (the cwd) first on sys.path
        self.proc = self.cluster.spawn(self.name, argv, env=env)
        return self

    def wait_started(self, timeout: float = 60.0) -> FleetDriver:
        """As the kubelet does: registration retried when a call times out (dozens of
        drivers starting at once on a small machine answer slowly)."""
        import grpc

        deadline = time.monotonic() + timeout
        while True:
            try:
                super().wait_started(max(1.0, deadline - time.monotonic()))
                return self
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)


# --------------------------------------------------------------------------- set-up


def start_cluster(dir: Path) -> tuple[Cluster, Path]:
    assets = find_assets()
    if assets is None:
        raise SystemExit(SKIP_REASON)
    policy = dir / "audit-policy.yaml"
    dir.mkdir(parents=True, exist_ok=True)
    policy.write_text(AUDIT_POLICY)
    audit = dir / "audit.log"
    cluster = Cluster.start(
        dir / "cluster",
        assets,
        extra_args={
            "kube-apiserver": [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
            ],
            "kube-controller-manager": ["--controllers=*,-node-lifecycle-controller"],
        },
    )
    return cluster, audit


def slices_template(machine: str) -> str:
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "toposlice", "-q", "slices", "--fake", machine),
            *("--node-name", "node-name-placeholder", "-o", "json"),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return proc.stdout


def node_body(name: str, machine: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "e2e.toposlice.dev/machine": machine},
        },
    }


def add_static(cluster: Cluster, n: int) -> None:
    """``n`` Nodes without a driver, with their slices as `toposlice slices` prints them."""
    if n <= 0:
        return
    templates = {m: slices_template(m) for m in MACHINES}
    nodes = [(f"fleet-static-{i:04d}", MACHINES[i % 2]) for i in range(n)]
    cluster.apply([node_body(name, m) for name, m in nodes])
    objs: list[dict[str, Any]] = []
    for name, m in nodes:
        items = json.loads(templates[m].replace("node-name-placeholder", name))["items"]
        for s in items:
            s["metadata"]["name"] = s["metadata"].pop("generateName") + "fleet"
        objs.extend(items)
    for i in range(0, len(objs), 50):
        cluster.apply(objs[i : i + 50])


def make_drivers(cluster: Cluster, n: int, resync: float, src: Path | None) -> list[FleetDriver]:
    nodes = [(f"fleet-drv-{i:03d}", MACHINES[i % 2]) for i in range(n)]
    cluster.apply([node_body(name, m) for name, m in nodes])
    FleetDriver.src = src
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda nm: FleetDriver(cluster, nm[0], nm[1], resync_s=resync), nodes))


def start_all(drivers: Sequence[FleetDriver], timeout: float = 600.0) -> float:
    """Start every driver at once; seconds until the last is registered and ready."""
    t0 = time.monotonic()
    for d in drivers:
        d.start()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda d: d.wait_started(timeout), drivers))
    return time.monotonic() - t0


def kill_all(cluster: Cluster, drivers: Sequence[FleetDriver]) -> None:
    cluster.kill_all([d.name for d in drivers], signal.SIGKILL)
    for d in drivers:
        d.proc = None


def all_ready(drivers: Sequence[FleetDriver]) -> bool:
    return all(d.http("/readyz")[0] == 200 for d in drivers)


# --------------------------------------------------------------------------- counting


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


_UA_NODE = re.compile(r"\(node ([^)]+)\)")


@dataclass
class Request:
    """One driver request in the audit log."""

    ts: datetime.datetime
    node: str
    verb: str
    resource: str
    code: int
    """The answer's HTTP status (200 for a WATCH whose stream started)."""
    streaming: bool
    """A WATCH with ``sendInitialEvents=true``: a streaming list."""


def audit_events(path: Path) -> list[Request]:
    """(received, node, verb, resource) of each driver request in the audit log, once per
    request (a watch has two stages)."""
    seen: set[str] = set()
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut by the API server's restart
            aid = ev.get("auditID")
            if aid in seen:
                continue
            seen.add(aid)
            extra = (ev.get("user") or {}).get("extra") or {}
            node = (extra.get(NODE_EXTRA) or [None])[0]
            if node is None:
                m = _UA_NODE.search(ev.get("userAgent") or "")
                node = m[1] if m else "?"
            ref = ev.get("objectRef") or {}
            resource = ref.get("resource") or ev.get("requestURI", "?")
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            ts = datetime.datetime.fromisoformat(ev["requestReceivedTimestamp"])
            code = int((ev.get("responseStatus") or {}).get("code") or 0)
            streaming = "sendInitialEvents=true" in (ev.get("requestURI") or "")
            out.append(Request(ts, str(node), str(ev.get("verb")), str(resource), code, streaming))
    return out


def answers(events: Sequence[Request], start: datetime.datetime, end: datetime.datetime) -> dict:
    """Over all drivers in [start, end): requests answered 4xx/5xx by (verb, resource,
    code), and the WATCHes that were streaming lists (``sendInitialEvents=true``). A
    WATCH from a version the server no longer has is answered 200 with a 410 ERROR event
    in the stream: it is not among the refused."""
    refused: Counter[str] = Counter()
    streaming = 0
    for ev in events:
        if start <= ev.ts < end:
            if ev.code >= 400:
                refused[f"{ev.verb} {ev.resource} {ev.code}"] += 1
            streaming += ev.streaming
    return {"refused": dict(sorted(refused.items())), "streaming_lists": streaming}


def state_back(
    events: Sequence[Request], start: datetime.datetime, end: datetime.datetime
) -> dict[str, float]:
    """Seconds from ``start`` until each driver's slice state came back: its first LIST
    or streaming list of resourceslices answered 200 in [start, end) (mean / max over the
    drivers that fetched it), how stale the drivers' view was after an API-server
    restart."""
    first: dict[str, float] = {}
    for ev in events:
        fetch = ev.verb == "list" or ev.streaming
        if start <= ev.ts < end and ev.resource == "resourceslices" and fetch and ev.code == 200:
            first.setdefault(ev.node, (ev.ts - start).total_seconds())
    vals = list(first.values())
    if not vals:
        return {}
    return {"mean_s": round(sum(vals) / len(vals), 2), "max_s": round(max(vals), 2)}


def server_counts(cluster: Cluster) -> Counter[tuple[str, str]]:
    """kube-apiserver's apiserver_request_total by (verb, resource), all clients."""
    out: Counter[tuple[str, str]] = Counter()
    text = cluster.kubectl("get", "--raw", "/metrics")
    for fam in text_string_to_metric_families(text):
        if fam.name != "apiserver_request":
            continue
        for s in fam.samples:
            if s.name.endswith("_total") and s.labels.get("resource"):
                out[(s.labels["verb"].lower(), s.labels["resource"])] += s.value
    return out


@dataclass
class Phase:
    name: str
    seconds: float
    per_minute: bool
    per_driver: dict[str, Counter[tuple[str, str]]] = field(default_factory=dict)
    server: Counter[tuple[str, str]] = field(default_factory=Counter)
    answers: dict[str, Any] = field(default_factory=dict)

    def value(self, counts: Counter[tuple[str, str]], key: tuple[str, str]) -> float:
        n = float(counts.get(key, 0))
        return n * 60.0 / self.seconds if self.per_minute else n

    def mean_max(self, key: tuple[str, str], nodes: Sequence[str]) -> tuple[float, float]:
        vals = [self.value(self.per_driver.get(n, Counter()), key) for n in nodes]
        return (sum(vals) / len(vals), max(vals)) if vals else (0.0, 0.0)

    def per_resource_max(self, nodes: Sequence[str]) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for n in nodes:
            by_res: Counter[str] = Counter()
            for (_verb, res), c in self.per_driver.get(n, Counter()).items():
                by_res[res] += c
            for res, c in by_res.items():
                out[res] = max(out[res], float(c))
        return dict(out)


def window(
    events: Sequence[Request],
    start: datetime.datetime,
    end: datetime.datetime,
) -> dict[str, Counter[tuple[str, str]]]:
    out: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    for ev in events:
        if start <= ev.ts < end:
            out[ev.node][(ev.verb, ev.resource)] += 1
    return dict(out)


def fmt(v: float) -> str:
    return f"{v:.2f}" if v and v != int(v) else f"{int(v)}"


def table(phases: Sequence[Phase], nodes: Sequence[str]) -> str:
    keys = sorted({k for p in phases for c in p.per_driver.values() for k in c})
    lines = [
        "requests per driver, from kube-apiserver's audit log (mean / max over drivers); "
        "steady: per minute, restarts: in all",
        "| verb × resource | steady /min | all drivers restarted | API server restarted | target |",
        "|---|---|---|---|---|",
    ]
    for verb, res in keys:
        cells = []
        for p in phases:
            mean, mx = p.mean_max((verb, res), nodes)
            cells.append(f"{fmt(mean)} / {fmt(mx)}")
        steady_target = "0 /min" if verb == "list" or verb in WRITE_VERBS else "–"
        lines.append(f"| {verb} {res} | {' | '.join(cells)} | {steady_target} |")
    restart = [p.per_resource_max(nodes) for p in phases[1:]]
    for res in sorted({r for d in restart for r in d}):
        vals = " | ".join(fmt(d.get(res, 0)) for d in restart)
        lines.append(f"| all verbs on {res} (max per driver) | – | {vals} | ≤ 3 |")
    lines += ["", "answers refused (all drivers) and streaming lists, per phase"]
    for p in phases:
        lines.append(f"  {p.name}: {json.dumps(p.answers)}")
    lines += [
        "",
        "kube-apiserver's apiserver_request_total, all clients (scheduler and "
        "controller-manager included), delta per phase; steady per minute",
        "| verb × resource | " + " | ".join(p.name for p in phases) + " |",
        "|---|" + "---|" * len(phases),
    ]
    skeys = sorted({k for p in phases for k, v in p.server.items() if v})
    for key in skeys:
        cells = [fmt(p.value(p.server, key)) for p in phases]
        lines.append(f"| {key[0]} {key[1]} | {' | '.join(cells)} |")
    return "\n".join(lines)


def verdict(phases: Sequence[Phase], nodes: Sequence[str]) -> dict[str, Any]:
    steady = phases[0]
    worst = 0.0
    for counts in steady.per_driver.values():
        bad = sum(c for (v, _r), c in counts.items() if v == "list" or v in WRITE_VERBS)
        worst = max(worst, bad * 60.0 / steady.seconds)
    restarts = {p.name: p.per_resource_max(nodes) for p in phases[1:]}
    worst_restart = max((v for d in restarts.values() for v in d.values()), default=0.0)
    return {
        "steady_list_and_writes_per_driver_per_min_max": round(worst, 3),
        "restart_requests_per_driver_per_resource_max": restarts,
        "targets_met": worst <= STEADY_LIST_WRITES_PER_MIN
        and worst_restart <= RESTART_PER_RESOURCE,
    }


# --------------------------------------------------------------------------- run


def run(args: argparse.Namespace, out: Any = sys.stdout) -> dict[str, Any]:
    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=out, flush=True)

    base = Path(tempfile.mkdtemp(prefix="ts-fleet-"))
    cluster, audit = start_cluster(base)
    drivers: list[FleetDriver] = []
    try:
        install(cluster)
        add_static(cluster, args.static)
        say(f"control plane up, chart installed, {args.static} static nodes")
        drivers = make_drivers(cluster, args.drivers, args.resync, args.src)
        nodes = [d.node for d in drivers]
        took = start_all(drivers)
        say(f"{len(drivers)} drivers started and ready in {took:.1f} s")
        time.sleep(args.warmup)

        t0, s0 = utcnow(), server_counts(cluster)
        time.sleep(args.steady)
        t1, s1 = utcnow(), server_counts(cluster)
        steady = Phase("steady", (t1 - t0).total_seconds(), True)
        steady.server = s1 - s0
        say("steady window done; restarting every driver at once")

        t2, s2 = utcnow(), server_counts(cluster)
        kill_all(cluster, drivers)
        took = start_all(drivers)
        time.sleep(args.settle)
        t3, s3 = utcnow(), server_counts(cluster)
        restart = Phase("driver_restart", (t3 - t2).total_seconds(), False)
        restart.server = s3 - s2
        say(f"all drivers ready again {took:.1f} s after the kill; restarting kube-apiserver")

        t4 = utcnow()
        try:
            cluster.restart_apiserver()
        except (RuntimeError, TimeoutError) as exc:  # a start hook timed out on a busy machine
            say(f"kube-apiserver did not come back ({str(exc).splitlines()[0]}); once more")
            cluster.restart_apiserver()
        serving = (utcnow() - t4).total_seconds()
        poll(lambda: all_ready(drivers), 120, 0.5, "every driver ready after the restart")
        back = (utcnow() - t4).total_seconds()
        time.sleep(args.settle)
        t5, s5 = utcnow(), server_counts(cluster)
        api = Phase("apiserver_restart", (t5 - t4).total_seconds(), False)
        api.server = s5  # the new server counts from zero
        say(
            f"every driver ready {back:.1f} s after the API-server restart began"
            f" (the new server ready at {serving:.1f} s)"
        )

        events = audit_events(audit)
        steady.per_driver = window(events, t0, t1)
        restart.per_driver = window(events, t2, t3)
        api.per_driver = window(events, t4, t5)
        phases = [steady, restart, api]
        for p, (start, end) in zip(phases, ((t0, t1), (t2, t3), (t4, t5)), strict=True):
            p.answers = answers(events, start, end)
            p.answers["state_back"] = state_back(events, start, end)
        print(table(phases, nodes), file=out)
        result = {
            "drivers": len(drivers),
            "static_nodes": args.static,
            "src": str(args.src) if args.src else "this tree",
            "steady_s": round(steady.seconds, 1),
            "driver_restart_s": round(restart.seconds, 1),
            "apiserver_restart_s": round(api.seconds, 1),
            "apiserver_ready_s": round(serving, 1),
            "drivers_ready_after_apiserver_restart_s": round(back, 1),
            "answers": {p.name: p.answers for p in phases},
            "per_driver": {
                p.name: {
                    f"{v} {r}": round(p.mean_max((v, r), nodes)[1], 3)
                    for (v, r) in sorted({k for c in p.per_driver.values() for k in c})
                }
                for p in phases
            },
            **verdict(phases, nodes),
        }
        return result
    finally:
        with contextlib.suppress(Exception):
            kill_all(cluster, drivers)
        cluster.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(base)], check=False)
        else:
            say(f"kept {base}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drivers", type=int, default=30, help="driver processes (20-50)")
    p.add_argument("--static", type=int, default=50, help="more nodes, slices, no driver")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds before counting")
    p.add_argument("--steady", type=float, default=60.0, help="steady window, seconds")
    p.add_argument("--settle", type=float, default=20.0, help="seconds counted after ready")
    p.add_argument("--resync", type=float, default=10.0, help="drivers' --resync-interval")
    p.add_argument("--src", type=Path, help="run the drivers from this source tree")
    p.add_argument("--json", type=Path, help="also write the result here")
    p.add_argument("--keep", action="store_true", help="keep the cluster's folder")
    args = p.parse_args(argv)
    if args.drivers < 1:
        p.error("--drivers must be at least 1")
    # A control plane of hundreds of nodes takes the machine's heavy lock (the project's
    # rule); a smaller fleet runs beside other work.
    big = args.drivers + args.static >= 100
    with heavy_lock() if big else contextlib.nullcontext():
        result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, sort_keys=True))
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
