#!/usr/bin/env python3
"""The DRA driver's figures against a real Kubernetes v1.36.2 control plane (issue #13).

  published    seconds from starting `toposlice run --fake dgx-h100` (as the chart's
               ServiceAccount, pod-bound token) until its ResourceSlices are listed by the
               real API server, best / worst of --starts starts on fresh nodes
  prepare      NodePrepareResources latency, p50/p99, one claim with one device per call,
               over one open gRPC connection after a warm-up, 1 and 16 concurrent callers.
               Every call prepares a claim not prepared before, so it includes the driver's
               GET of the ResourceClaim from the real API server (TLS, token auth, RBAC,
               the admission chain does not apply to reads), the CDI spec, the NCCL file
               and the checkpoint; each is unprepared again (timed apart). The claims are
               created and their allocation written by this process as admin (the
               scheduler's part is the next figure). Target: p99 <= 5 ms at 1 caller
  scheduled    the real kube-scheduler's time from a pod's creation to its claim's
               allocation (seen through a watch), for --pods pods each with a one-GPU
               claim from a template, on 4 nodes (dgx-h100, pcie-8gpu, mi300x-8,
               gb200-nvl72-tray: 28 GPUs), created in waves of at most 25 and deleted
               between waves; p50 / p99 / max, and the waves' pods per second. The
               prepare figures use a fifth node, kept out of the pods' node selector

--baseline-src DIR adds a sixth node whose driver runs the toposlice sources in DIR (e.g.
`git archive <commit> | tar -x -C DIR`): the prepare figures are taken for both drivers in
this one run, taking turns (call by call at one caller, in rounds at 16), so that a
change is compared under the same load.
--only prepare skips the start and scheduling figures.

The control plane comes from tests/e2e/cluster.py ($TOPOSLICE_KUBE_ASSETS or
../shared/kube, docs/e2e.md). Usage: python3 bench/kube_api.py [--calls 500] [--pods 100]
[--baseline-src DIR] [--only prepare]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/http.py would shadow the standard library's http package: drop the script's folder.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import concurrent.futures
import json
import tempfile
import threading
import time
import uuid
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.stats import pct  # noqa: E402
from tests.e2e.cluster import SKIP_REASON, Cluster, find_assets, poll  # noqa: E402
from tests.e2e.toposlice_setup import (  # noqa: E402
    DRIVER,
    NodeDriver,
    install,
    published_slices,
)
from tests.kubelet import NodeClient  # noqa: E402

NAMESPACE = "bench"
PREP_NAMESPACE = "bench-prep"
SCHED_NODES = {
    "bench-dgx": "dgx-h100",
    "bench-pcie": "pcie-8gpu",
    "bench-mi300x": "mi300x-8",
    "bench-gb200": "gb200-nvl72-tray",
}
SCHED_LABEL = "bench.toposlice.dev/scheduling"
#: The node whose driver answers the prepare calls; the claims prepared there (allocated
#: by this process) stay off the scheduling nodes.
PREP_NODE = "bench-prep"
BASE_NODE = "bench-prep-base"
WAVE = 25


class SourceDriver(NodeDriver):
    """A NodeDriver whose ``toposlice run`` imports toposlice from another source tree
    (``python -m`` would put the working directory, this tree, first on the path)."""

    def __init__(self, cluster: Cluster, node: str, machine: str, src: Path) -> None:
        super().__init__(cluster, node, machine)
        self.src = src

    def argv(self) -> list[str]:
        argv = super().argv()
        at = argv.index("-m")
        boot = (
            f"import runpy, sys; sys.path.insert(0, {str(self.src)!r}); "
            "runpy.run_module('toposlice', run_name='__main__', alter_sys=True)"
        )
        argv[at : at + 2] = ["-c", boot]
        return argv


def measure_published(cluster: Cluster, starts: int) -> list[float]:
    times = []
    for i in range(starts):
        node = f"bench-start-{i}"
        cluster.add_node(node)
        drv = NodeDriver(cluster, node, "dgx-h100")
        t0 = time.monotonic()
        drv.start()
        # The kubelet side registers it meanwhile, as a kubelet would.
        reg = threading.Thread(target=drv.wait_started, daemon=True)
        reg.start()
        poll(lambda n=node: published_slices(cluster, n), 60, 0.005, f"slices of {node}")
        times.append(time.monotonic() - t0)
        reg.join(60)
        drv.cleanup()
        cluster.kubectl("delete", "resourceslices", f"--field-selector=spec.nodeName={node}")
        cluster.remove_node(node)
    return times


def allocated_claim(api: Any, node: str, device: str, name: str) -> tuple[str, str, str]:
    """A ResourceClaim created, allocated to ``device`` and reserved for a pod, as the
    scheduler would leave it (status written by admin); its (namespace, name, uid)."""
    from kubernetes import client

    rapi = client.ResourceV1Api(api)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": PREP_NAMESPACE},
        "spec": {
            "devices": {"requests": [{"name": "req", "exactly": {"deviceClassName": "gpu.x"}}]}
        },
    }
    created = rapi.create_namespaced_resource_claim(PREP_NAMESPACE, body, _preload_content=False)
    obj = json.loads(created.data)
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "req", "driver": DRIVER, "pool": node, "device": device}]
            }
        },
        "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": str(uuid.uuid4())}],
    }
    rapi.replace_namespaced_resource_claim_status(name, PREP_NAMESPACE, obj, _preload_content=False)
    return PREP_NAMESPACE, name, obj["metadata"]["uid"]


def prepare_latency(
    cluster: Cluster, targets: list[NodeDriver], callers: int, calls: int, warmup: int
) -> list[tuple[list[float], list[float]]]:
    """(prepare, unprepare) seconds per target driver. With several targets they take
    turns under the same load: with one caller call by call, with more in rounds of
    ``callers`` calls per driver, all callers of a round on one driver (a barrier between
    turns), the drivers' order alternating from round to round."""
    api = cluster.api_client()
    per_caller = max(1, (calls + callers - 1) // callers)
    warm_each = max(1, warmup // callers)
    steps = per_caller + warm_each
    claims = []
    for drv in targets:
        devices = [
            d["name"] for s in published_slices(cluster, drv.node) for d in s["spec"]["devices"]
        ]
        claims.append(
            [
                [
                    allocated_claim(api, drv.node, devices[c], f"{drv.node}-p{callers}-{c}-{k}")
                    for k in range(steps)
                ]
                for c in range(callers)
            ]
        )
    chunk = 1 if callers == 1 else max(1, min(steps, 4))
    prep: list[list[float]] = [[] for _ in targets]
    unprep: list[list[float]] = [[] for _ in targets]
    lock = threading.Lock()
    barrier = threading.Barrier(callers)
    kubelets = [NodeClient(drv.endpoint) for drv in targets]

    def caller(c: int) -> None:
        try:
            timed(c)
        except BaseException:
            barrier.abort()  # the other callers stop at their next turn instead of hanging
            raise

    def timed(c: int) -> None:
        mine_p: list[list[float]] = [[] for _ in targets]
        mine_u: list[list[float]] = [[] for _ in targets]
        for r, k0 in enumerate(range(0, steps, chunk)):
            order = list(range(len(targets)))
            if r % 2:
                order.reverse()
            for i in order:
                barrier.wait()
                kubelet = kubelets[i]
                for k in range(k0, min(steps, k0 + chunk)):
                    ref = claims[i][c][k]
                    t = time.perf_counter()
                    resp = kubelet.prepare([ref])
                    dt = time.perf_counter() - t
                    if resp.claims[ref[2]].error:
                        raise RuntimeError(resp.claims[ref[2]].error)
                    t = time.perf_counter()
                    un = kubelet.unprepare([ref])
                    du = time.perf_counter() - t
                    if un.claims[ref[2]].error:
                        raise RuntimeError(un.claims[ref[2]].error)
                    if k >= warm_each:
                        mine_p[i].append(dt)
                        mine_u[i].append(du)
        with lock:
            for i in range(len(targets)):
                prep[i].extend(mine_p[i])
                unprep[i].extend(mine_u[i])

    try:
        with concurrent.futures.ThreadPoolExecutor(callers) as pool:
            for f in [pool.submit(caller, c) for c in range(callers)]:
                f.result()
    finally:
        for kubelet in kubelets:
            kubelet.close()
    return list(zip(prep, unprep, strict=True))


def watch_allocations(
    resp: Any, seen: dict[str, float], allocated: dict[str, float], n: int
) -> None:
    """Read a ResourceClaim watch stream (JSON lines); record when each owning pod's
    claim is first seen (made by the controller-manager) and first seen allocated (by
    the scheduler), until ``n`` are allocated."""
    buf = b""
    for chunk in resp.stream(4096):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            obj = json.loads(line)["object"]
            owners = obj["metadata"].get("ownerReferences") or []
            if not owners:
                continue
            now = time.monotonic()
            seen.setdefault(owners[0]["name"], now)
            if (obj.get("status") or {}).get("allocation"):
                allocated.setdefault(owners[0]["name"], now)
            if len(allocated) >= n:
                return


def get_latency(cluster: Cluster, drv: NodeDriver, calls: int) -> list[float]:
    """The floor under prepare: GET of one ResourceClaim through the driver's own client
    code (driver/plumbing/kube.py, the node's pod-bound token), from this process, one caller."""
    from driver.plumbing.kube import build_api_client, request_json

    api = cluster.api_client()
    ns, name, _uid = allocated_claim(api, drv.node, "cpu-numa0", f"{drv.node}-get-floor")
    client = build_api_client(str(drv.kubeconfig))
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
    out = []
    for k in range(calls + 20):
        t = time.perf_counter()
        request_json(client, "GET", path)
        if k >= 20:
            out.append(time.perf_counter() - t)
    return out


def scheduling_latency(
    cluster: Cluster, pods: int
) -> tuple[list[float], list[float], list[float], float]:
    """Per pod seconds from its create call to its claim's allocation (watch), split into
    create -> claim made and claim made -> allocated; and the pods per second over the
    waves (first create to last allocation, per wave)."""
    from kubernetes import client

    api = cluster.api_client()
    core, rapi = client.CoreV1Api(api), client.ResourceV1Api(api)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}]
                }
            }
        },
    }
    rapi.create_namespaced_resource_claim_template(NAMESPACE, template)
    latencies: list[float] = []
    to_claim: list[float] = []
    to_alloc: list[float] = []
    busy = 0.0
    done = 0
    wave_no = 0
    while done < pods:
        n = min(WAVE, pods - done)
        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        allocated: dict[str, float] = {}
        resp = rapi.list_namespaced_resource_claim(
            NAMESPACE, watch=True, timeout_seconds=120, _preload_content=False
        )
        th = threading.Thread(
            target=watch_allocations, args=(resp, seen, allocated, n), daemon=True
        )
        th.start()
        time.sleep(0.5)  # the watch is established before the first create
        for i in range(n):
            name = f"w{wave_no}-p{i}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {
                    "nodeSelector": {SCHED_LABEL: "yes"},
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    "containers": [
                        {"name": "c", "image": "pause", "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                },
            }
            created[name] = time.monotonic()
            core.create_namespaced_pod(NAMESPACE, pod)
        th.join(120)
        resp.release_conn()
        missing = set(created) - set(allocated)
        if missing:
            raise RuntimeError(f"wave {wave_no}: not allocated within 120 s: {sorted(missing)}")
        latencies += [allocated[p] - created[p] for p in created]
        to_claim += [seen[p] - created[p] for p in created]
        to_alloc += [allocated[p] - seen[p] for p in created]
        busy += max(allocated.values()) - min(created.values())
        done += n
        wave_no += 1
        cluster.kubectl("-n", NAMESPACE, "delete", "pods", "--all", "--force", "--grace-period=0")
        poll(
            lambda: not rapi.list_namespaced_resource_claim(NAMESPACE).items,
            120,
            0.1,
            "the wave's claims deleted",
        )
    return latencies, to_claim, to_alloc, pods / busy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=500, help="timed prepares per scenario")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument(
        "--baseline-src",
        type=Path,
        help="also measure GET and prepare with a driver running the sources in this folder",
    )
    ap.add_argument("--only", choices=("all", "prepare"), default="all")
    args = ap.parse_args()
    assets = find_assets()
    if assets is None:
        print(f"bench/kube_api.py: {SKIP_REASON}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tsb-kube-") as d:
        cluster = Cluster.start(Path(d) / "cluster", assets)
        try:
            return _run(cluster, args)
        finally:
            cluster.stop()


def _run(cluster: Cluster, args: argparse.Namespace) -> int:
    drivers: dict[str, NodeDriver] = {}
    try:
        return _measure(cluster, args, drivers)
    finally:
        for drv in drivers.values():
            drv.cleanup()


def _measure(cluster: Cluster, args: argparse.Namespace, drivers: dict[str, NodeDriver]) -> int:
    install(cluster)
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("create", "namespace", PREP_NAMESPACE)
    everything = args.only == "all"
    published = measure_published(cluster, args.starts) if everything else []

    nodes = [*SCHED_NODES.items()] if everything else []
    for node, machine in [*nodes, (PREP_NODE, "dgx-h100")]:
        cluster.add_node(node, {SCHED_LABEL: "yes"} if node in SCHED_NODES else None)
        drivers[node] = NodeDriver(cluster, node, machine).start()
    if args.baseline_src is not None:
        cluster.add_node(BASE_NODE)
        src = args.baseline_src.resolve()
        drivers[BASE_NODE] = SourceDriver(cluster, BASE_NODE, "dgx-h100", src).start()
    for drv in drivers.values():
        drv.wait_started()
    # label -> driver; with a baseline, the two take turns in each figure.
    prep = {"": drivers[PREP_NODE]}
    if args.baseline_src is not None:
        prep = {" [baseline]": drivers[BASE_NODE], "": drivers[PREP_NODE]}
    floor = get_latency(cluster, drivers[PREP_NODE], args.calls)
    lat: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
    for callers in (1, 16):
        figures = prepare_latency(cluster, list(prep.values()), callers, args.calls, args.warmup)
        for tag, figure in zip(prep, figures, strict=True):
            lat[callers, tag] = figure
    sched: list[float] = []
    if everything:
        # The prepare claims go before the scheduling figure, not while it is measured.
        cluster.kubectl("delete", "namespace", PREP_NAMESPACE, "--timeout=600s")
        sched, to_claim, to_alloc, rate = scheduling_latency(cluster, args.pods)

    ms = 1000.0
    print("toposlice DRA driver against kube-apiserver/kube-scheduler v1.36.2 (issue #13)")
    if args.baseline_src is not None:
        print(f"[baseline]: the driver from {args.baseline_src}, measured in the same run")
    print(f"{'figure':48} {'value':>24} {'target':>12}")
    if published:
        print(
            f"{'start-to-slices-published (best / worst of ' + str(args.starts) + ')':48} "
            f"{min(published):>12.3f} s / {max(published):.3f} s"
        )
    for (callers, tag), (p, unprep) in lat.items():
        label = f"NodePrepareResources p50 / p99, {callers:2d} caller(s){tag}"
        target = "p99 <= 5 ms" if callers == 1 and not tag else ""
        print(f"{label:48} {pct(p, 50) * ms:>10.2f} / {pct(p, 99) * ms:6.2f} ms {target:>12}")
        label = f"  (unprepare p50 / p99, {len(p)} calls){tag}"
        print(f"{label:48} {pct(unprep, 50) * ms:>10.2f} / {pct(unprep, 99) * ms:6.2f} ms")
    label = "  (ResourceClaim GET alone, same client, p50 / p99)"
    print(f"{label:48} {pct(floor, 50) * ms:>10.2f} / {pct(floor, 99) * ms:6.2f} ms")
    if not sched:
        return 0
    label = f"pod created -> claim allocated, {len(sched)} pods"
    print(
        f"{label:48} {pct(sched, 50) * ms:>6.0f} / {pct(sched, 99) * ms:.0f} / "
        f"{max(sched) * ms:.0f} ms (p50/p99/max)"
    )
    for label, values in (
        ("  (pod created -> claim made: controller-manager)", to_claim),
        ("  (claim made -> allocated: scheduler)", to_alloc),
    ):
        print(
            f"{label:48} {pct(values, 50) * ms:>6.0f} / {pct(values, 99) * ms:.0f} / "
            f"{max(values) * ms:.0f} ms"
        )
    print(f"{'  (pods allocated per second, in waves of ' + str(WAVE) + ')':48} {rate:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
