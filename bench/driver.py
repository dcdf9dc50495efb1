#!/usr/bin/env python3
"""The DRA driver's figures, side by side in one run, against the targets of issue #6.

  registered   seconds from starting `toposlice run --fake dgx-h100` until the kubelet
               side has registered it (registration socket answered GetInfo and took
               NotifyRegistrationStatus), best of --starts starts; target <= 1 s
  prepare      NodePrepareResources latency, p50/p99, one claim with one device per call,
               over one open gRPC connection after a warm-up, with 1 and with 16
               concurrent callers. Every call prepares a claim not prepared before, so
               it includes the driver's GET of the ResourceClaim from the test API
               server, the CDI spec, the NCCL topology file and the checkpoint; each is
               unprepared again (not timed) before its device is used again.
               Target: p99 <= 5 ms at 1 caller
  RSS          resident memory of the driver process after the prepare runs (and its
               peak, VmHWM); target <= 80 MiB on dgx-h100
  API writes   5,000 simulated nodes' ResourceSlice publishers (one pool each, the
               dgx-h100 devices) against one test API server: writes of the first
               reconcile of every node, then of a steady-state reconcile of every node
               (target 0), then after one device change on 1% of the nodes (target 1
               write each)

The API server is `python3 -m tests.kubeapi` in a process of its own, the driver another;
this process plays the kubelet. Usage: python3 bench/driver.py [--calls 1000] [--nodes 5000]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/http.py would shadow the standard library's http package: drop the script's folder.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import concurrent.futures
import copy
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench.stats import pct  # noqa: E402
from tests.kubeapi import write_kubeconfig  # noqa: E402
from tests.kubelet import (  # noqa: E402
    NodeClient,
    allocated_claim,
    register_retrying,
    run_argv,
    wait_for_socket,
)

DRIVER = "toposlice.dev"
NODE = "bench-node"
CLEANUP: list[Path] = []


class ApiProcess:
    """``python3 -m tests.kubeapi`` as a child process."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        port_file = tmp / f"port-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kubeapi", "--port-file", str(port_file), *extra],
            cwd=REPO,
        )
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("test API server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"
        self.kubeconfig = write_kubeconfig(tmp / f"kubeconfig-{port_file.name}", self.url)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def counts(self) -> dict[str, Any]:
        out: dict[str, Any] = self.call("GET", "/debug/counts")
        return out

    def reset(self) -> None:
        self.call("GET", "/debug/reset")

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        ns = claim["metadata"]["namespace"]
        base = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
        created = self.call("POST", base, claim)
        created["status"] = claim["status"]
        out: dict[str, Any] = self.call(
            "PUT", f"{base}/{created['metadata']['name']}/status", created
        )
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cdi_root(base: Path) -> Path:
    """CDI specs on tmpfs where there is one, as ``/var/run/cdi`` is on a node; the
    checkpoint stays on the disk ``base`` is on."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="tsb-cdi-", dir=shm))
        CLEANUP.append(path)
        return path
    return base / "cdi"


def driver_argv(base: Path, kubeconfig: Path) -> list[str]:
    return run_argv(
        base,
        kubeconfig,
        NODE,
        "--http-addr",
        "127.0.0.1:0",
        "--log-level",
        "warning",
        cdi_root=cdi_root(base),
    )


def start_driver(base: Path, kubeconfig: Path) -> tuple[subprocess.Popen[bytes], float, Any]:
    reg_socket = base / "reg" / f"{DRIVER}-reg.sock"
    t0 = time.monotonic()
    proc = subprocess.Popen(driver_argv(base, kubeconfig), cwd=REPO)
    wait_for_socket(reg_socket, 60, poll=0.001)
    reg = register_retrying(reg_socket, 30)
    return proc, time.monotonic() - t0, reg


def measure_registration(tmp: Path, api: ApiProcess, starts: int) -> list[float]:
    times = []
    for i in range(starts):
        base = tmp / f"start-{i}"
        proc, seconds, _reg = start_driver(base, api.kubeconfig)
        times.append(seconds)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return times


def prepare_latency(
    api: ApiProcess, endpoint: str, devices: list[str], callers: int, calls: int, warmup: int
) -> tuple[list[float], list[float]]:
    """Per call seconds of prepare and of unprepare, ``callers`` threads on one channel."""
    per_caller = max(1, (calls + callers - 1) // callers)
    warm_each = max(1, warmup // callers)
    claims: list[list[tuple[str, str, str]]] = []
    for c in range(callers):
        refs = []
        for k in range(per_caller + warm_each):
            name = f"c{callers}-{c}-{k}-{time.monotonic_ns()}"
            obj = api.add_claim(allocated_claim(name, [devices[c]], pool=NODE, driver=DRIVER))
            refs.append(("default", name, obj["metadata"]["uid"]))
        claims.append(refs)
    prep: list[float] = []
    unprep: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(callers)
    with NodeClient(endpoint) as kubelet:

        def caller(refs: list[tuple[str, str, str]]) -> None:
            mine_p, mine_u = [], []
            barrier.wait()
            for k, ref in enumerate(refs):
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
                    mine_p.append(dt)
                    mine_u.append(du)
            with lock:
                prep.extend(mine_p)
                unprep.extend(mine_u)

        with concurrent.futures.ThreadPoolExecutor(callers) as pool:
            for f in [pool.submit(caller, refs) for refs in claims]:
                f.result()
    return prep, unprep


def publishers_writes(tmp: Path, nodes: int, workers: int) -> dict[str, Any]:
    from driver.plumbing.kube import build_api_client
    from driver.publisher.slices import SlicePublisher
    from normalize.snapshot import build_snapshot
    from toposlice.discover import discover

    api = ApiProcess(tmp, "--nodes", str(nodes))
    pubs: list[SlicePublisher] = []
    try:
        devices = [dict(d) for d in build_snapshot(discover("/", fake="dgx-h100"), "x").devices]
        client = build_api_client(str(api.kubeconfig))
        client.rest_client.pool_manager.connection_pool_kw["maxsize"] = workers
        pubs = [
            SlicePublisher(client, DRIVER, f"node-{i:05d}", resync_seconds=3600)
            for i in range(nodes)
        ]
        for p in pubs:
            p.set_devices(devices)

        def round_of(targets: list[SlicePublisher]) -> tuple[int, float]:
            api.reset()
            t = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda p: p.reconcile(), targets))
            return int(api.counts()["writes"]), time.perf_counter() - t

        first, first_s = round_of(pubs)
        steady, steady_s = round_of(pubs)
        changed = pubs[:: max(1, nodes // max(1, nodes // 100))][: max(1, nodes // 100)]
        for p in changed:
            d2 = copy.deepcopy(devices)
            d2[0]["attributes"]["model"] = {"string": "changed"}
            p.set_devices(d2)
        change, change_s = round_of(pubs)
        steady2, steady2_s = round_of(pubs)
        return {
            "nodes": nodes,
            "first": (first, first_s),
            "steady": (steady, steady_s),
            "changed_nodes": len(changed),
            "change": (change, change_s),
            "steady_after": (steady2, steady2_s),
        }
    finally:
        for p in pubs:  # each watches its slices (driver/plumbing/server_view.py)
            p.view.stop()
        api.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000, help="timed prepares per scenario")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--starts", type=int, default=3, help="driver starts for registered time")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=8, help="threads driving the publishers")
    args = ap.parse_args()

    # Warm this process's gRPC (the kubelet's is long running) before timing starts.
    grpc.insecure_channel("unix:///nonexistent").close()

    try:
        return _run(args)
    finally:
        for path in CLEANUP:
            shutil.rmtree(path, ignore_errors=True)


def _run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="tsb-") as d:
        tmp = Path(d)
        api = ApiProcess(tmp, "--node", NODE)
        try:
            reg_times = measure_registration(tmp, api, args.starts)
            base = tmp / "main"
            proc, _seconds, reg = start_driver(base, api.kubeconfig)
            try:
                time.sleep(2.0)  # let the publisher and exporter start before timing
                snap_devices = [
                    d["name"]
                    for s in api.call(
                        "GET",
                        "/apis/resource.k8s.io/v1/resourceslices?fieldSelector="
                        f"spec.nodeName={NODE}",
                    )["items"]
                    for d in s["spec"]["devices"]
                ]
                lat = {}
                cpu = {}
                for callers in (1, 16):
                    before = cpu_s(proc.pid), cpu_s(api.proc.pid)
                    lat[callers] = prepare_latency(
                        api, reg.info.endpoint, snap_devices, callers, args.calls, args.warmup
                    )
                    n = len(lat[callers][0]) + max(1, args.warmup // callers) * callers
                    cpu[callers] = (
                        (cpu_s(proc.pid) - before[0]) / n,
                        (cpu_s(api.proc.pid) - before[1]) / n,
                    )
                rss, hwm = rss_mib(proc.pid)
            finally:
                proc.send_signal(signal.SIGTERM)
                rc = proc.wait(30)
        finally:
            api.stop()
        pubs = publishers_writes(tmp, args.nodes, args.workers)

    ms = 1000.0
    print("toposlice DRA driver, fake dgx-h100 (targets from issue #6)")
    print(f"{'figure':44} {'value':>22} {'target':>12}")
    print(
        f"{'start-to-registered (best / worst of ' + str(args.starts) + ')':44} "
        f"{min(reg_times):>10.3f} s / {max(reg_times):.3f} s {'<= 1 s':>12}"
    )
    for callers, (prep, unprep) in lat.items():
        label = f"NodePrepareResources p50 / p99, {callers:2d} caller(s)"
        target = "p99 <= 5 ms" if callers == 1 else ""
        print(f"{label:44} {pct(prep, 50) * ms:>8.2f} / {pct(prep, 99) * ms:6.2f} ms {target:>12}")
        label = f"  (unprepare p50 / p99, {len(prep)} calls)"
        print(f"{label:44} {pct(unprep, 50) * ms:>8.2f} / {pct(unprep, 99) * ms:6.2f} ms")
        label = "  (CPU per prepare+unprepare: driver / API)"
        drv_cpu, api_cpu = cpu[callers]
        print(f"{label:44} {drv_cpu * ms:>8.2f} / {api_cpu * ms:6.2f} ms")
    print(f"{'driver RSS after the runs (peak)':44} {rss:>10.1f} MiB ({hwm:.1f}) {'<= 80 MiB':>12}")
    print(f"{'driver exit status after SIGTERM':44} {rc:>22d} {'0':>12}")
    n = pubs["nodes"]
    print(
        f"{'API writes, ' + str(n) + ' publishers, first reconcile':44} "
        f"{pubs['first'][0]:>14d} ({pubs['first'][1]:.1f} s) {n:>12}"
    )
    print(
        f"{'API writes, steady-state reconcile':44} "
        f"{pubs['steady'][0]:>14d} ({pubs['steady'][1]:.1f} s) {0:>12}"
    )
    print(
        f"{'API writes, 1 device changed on ' + str(pubs['changed_nodes']) + ' nodes':44} "
        f"{pubs['change'][0]:>14d} ({pubs['change'][1]:.1f} s) {pubs['changed_nodes']:>12}"
    )
    print(
        f"{'API writes, steady state again':44} "
        f"{pubs['steady_after'][0]:>14d} ({pubs['steady_after'][1]:.1f} s) {0:>12}"
    )
    load = os.getloadavg()[0]
    print(f"(host: {os.cpu_count()} CPUs, load average {load:.1f} at the end)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
