"""The kube-scheduler extender at cluster size: filter and prioritize latency at N nodes,
and the requests it makes to node endpoints per call (target: p99 <= 20 ms each at
N=1000, 0 requests per call in steady state; issue #22).

The extender runs as ``toposlice scorer serve`` assembles it (ClusterCache, GraphSource,
Extender, ExtenderServer on the project's HTTP stack), fed as its informers feed it: N
Node objects (half dgx-h100, half pcie-8gpu), one ResourceSlice each, and claims that
take a random share of the GPUs (``--fill``). Every node's ``/v1/topology`` is served by
one fake exporter process-local server (``/<node>/v1/topology``, ETag, 304), which counts
its requests; the graphs are fetched in the background as a real start fetches them. A
client in a process of its own, on one kept-alive connection, then POSTs ExtenderArgs as
kube-scheduler does with ``nodeCacheCapable: true`` (``NodeNames``, capitalised keys) for
five request shapes:

* **cold**: the first filters of each shape (every distinct node state searched once,
  at most ``SEARCH_BUDGET_S`` of searching per call, the rest answered from the bound
  until a later call searched it): the first call's time, the calls until no node is
  left unsearched, and the slowest of them;
* **steady**: ``--rounds`` rounds of filter + prioritize per shape, nothing changing;
* **in-process**: the steady calls again without HTTP (parse, answer), in this process;
* **churn**: the same while another thread allocates or releases a claim on a random
  node ``--churn-rate`` times a second (what the claim informer does with the
  scheduler's bindings): those nodes' entries are searched again when next asked;
* **objects**: filter with whole Node objects (``nodeCacheCapable: false``), for scale;
* **refetch**: every node's slices republished and its graph changed (new ETag): the
  fetch workers fetch and parse 1,000 graphs while the calls run (the background
  requests of this phase are those, none made by a call);
* **hung**: ``--hung`` nodes' endpoints stop answering and their slices change (so their
  graphs are fetched again, and hang): the calls go on at the same speed.

    python3 bench/extender.py [--nodes 1000] [--rounds 40] [--fill 0.5] [--seed 1]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import multiprocessing as mp
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import pct
from driver.plumbing.http_transport import HttpTransport, Reply, Request
from normalize.graph import build_graph
from scorer.cluster_cache import ClusterCache
from scorer.extender import Extender
from scorer.extender_server import ExtenderServer
from scorer.graph_source import GraphSource
from scorer.request import PROFILE_ANNOTATION
from scorer.topology import rename_graph
from toposlice.discover import discover

MACHINES = ("dgx-h100", "pcie-8gpu")
SHAPES: list[dict[str, Any]] = [
    {"gpus": 1},
    {"gpus": 2, "pattern": "tensor-parallel", "bound": "communication"},
    {"gpus": 2, "nicsPerGpu": 1},
    {"gpus": 4, "nicsPerGpu": 1, "pattern": "data-parallel"},
    {"gpus": 8, "nicsPerGpu": 1, "pattern": "tensor-parallel"},
]
DRIVER = "toposlice.dev"


class FakeExporters(HttpTransport):
    """``/<node>/v1/topology`` for every node on one port, with ETag/304; a hung node's
    request is never answered."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        super().__init__("127.0.0.1:0", thread_name="fake-exporters")
        self.bodies = bodies
        self.etags = {
            n: b'"' + hashlib.sha256(b).hexdigest()[:16].encode() + b'"' for n, b in bodies.items()
        }
        self.hung: set[str] = set()
        self.requests = 0

    def respond(self, req: Request) -> Reply:
        self.requests += 1
        node = req.path.strip("/").split("/", 1)[0]
        if node in self.hung:
            assert self.loop is not None
            return self.loop.create_future()  # never done: the client waits out its timeout
        body = self.bodies.get(node)
        if body is None:
            return self.text("topology", 404, b"no such node\n", req.keep_alive)
        etag = self.etags[node]
        if req.if_none_match == etag:
            self.stats.count("topology", 304)
            return self.head(
                304, None, None, close=not req.keep_alive, extra=b"ETag: %s\r\n" % etag
            )
        extra = b"ETag: %s\r\n" % etag
        return self.response(
            "topology", 200, b"application/json", body, req.keep_alive, False, extra
        )


def _node(name: str, machine: str, full: bool) -> dict[str, Any]:
    """A Node as the API server returns it; ``full``: with the status a kubelet writes
    (what nodeCacheCapable: false puts in every call)."""
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "toposlice.dev/machine": machine,
                "topology.kubernetes.io/zone": f"zone-{hash(name) % 4}",
            },
        },
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]},
    }
    if full:
        node["status"] |= {
            "capacity": {"cpu": "224", "memory": "2113929216Ki", "pods": "110"},
            "allocatable": {"cpu": "222", "memory": "2100000000Ki", "pods": "110"},
            "conditions": [
                {
                    "type": t,
                    "status": "False" if t != "Ready" else "True",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "reason": f"Kubelet{t}",
                    "message": f"kubelet reports {t}",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.36.2",
                "containerRuntimeVersion": "containerd://2.3.4",
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
            "images": [
                {"names": [f"registry.example/image-{i}@sha256:{'0' * 64}"], "sizeBytes": 1 << 30}
                for i in range(8)
            ],
        }
    return node


def _slice(node: str, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": f"00000-{DRIVER}-{node}-aaaaa", "resourceVersion": "1"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation},
        },
    }


def _claim(name: str, node: str, devices: list[str]) -> dict[str, Any]:
    results = [{"request": "g", "driver": DRIVER, "pool": node, "device": d} for d in devices]
    return {
        "metadata": {"namespace": "bench", "name": name, "resourceVersion": "1"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _args(shape: dict[str, Any], names: list[str], objects: list[dict[str, Any]] | None) -> bytes:
    pod = {
        "metadata": {
            "name": "job-0",
            "namespace": "bench",
            "annotations": {PROFILE_ANNOTATION: json.dumps(shape)},
        },
        "spec": {
            "schedulerName": "toposlice-scheduler",
            "containers": [{"name": "c", "image": "x"}],
        },
    }
    if objects is not None:
        body = {"Pod": pod, "Nodes": {"items": objects}, "NodeNames": None}
    else:
        body = {"Pod": pod, "Nodes": None, "NodeNames": names}
    return json.dumps(body).encode()


def _client_loop(url: str, conn: Any) -> None:
    """The scheduler's side, in a process of its own (as kube-scheduler is): POST each
    body it is sent on one kept-alive connection, answer (ms, nodes passed or ranked)."""
    import http.client  # after the sys.path fix above: bench/http.py is not it

    host, port = url.removeprefix("http://").split(":")
    http_conn = http.client.HTTPConnection(host, int(port), timeout=60)
    while True:
        job = conn.recv()
        if job is None:
            return
        verb, body = job
        t0 = time.perf_counter()
        http_conn.request("POST", f"/{verb}", body, {"Content-Type": "application/json"})
        resp = http_conn.getresponse()
        data = resp.read()
        elapsed = (time.perf_counter() - t0) * 1000.0
        answer = json.loads(data)
        size = len(answer["NodeNames"] or []) if verb == "filter" else len(answer)
        conn.send((resp.status, elapsed, size))


class Client:
    def __init__(self, url: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_client_loop, args=(url, child), daemon=True)
        self.proc.start()

    def post(self, verb: str, body: bytes) -> tuple[float, int]:
        self.conn.send((verb, body))
        status, ms, size = self.conn.recv()
        assert status == 200, status
        return ms, size

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10)


class GcPauses:
    """The garbage collector's pauses in this (the extender's) process, by generation."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append((int(info["generation"]), (time.perf_counter() - self._t) * 1e3))

    def take(self) -> dict[str, Any]:
        out = {
            "collections": len(self.pauses),
            "gen2": sum(1 for g, _ in self.pauses if g == 2),
            "max_ms": round(max((ms for _, ms in self.pauses), default=0.0), 2),
            "tracked": len(gc.get_objects()),
        }
        self.pauses = []
        return out


class Churn(threading.Thread):
    """Claims allocated and released on random nodes at ``rate`` per second, from
    another thread, as the claim informer applies the scheduler's bindings."""

    def __init__(self, apply: Any, rate: float) -> None:
        super().__init__(name="churn", daemon=True)
        self.apply, self.rate = apply, rate
        self.done = threading.Event()
        self.changes = 0

    def run(self) -> None:
        while not self.done.wait(1.0 / self.rate):
            self.apply()
            self.changes += 1


def _summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50": round(pct(ms, 50), 2),
        "p99": round(pct(ms, 99), 2),
        "max": round(max(ms), 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--fill", type=float, default=0.5, help="share of nodes with GPUs taken")
    ap.add_argument("--hung", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fetch-workers", type=int, default=8)
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval for this process (default: Python's, 5 ms)",
    )
    ap.add_argument(
        "--churn-rate", type=float, default=50.0, help="claim changes per second (churn phase)"
    )
    a = ap.parse_args(argv)
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval)
    rng = random.Random(a.seed)
    # The hung phase's fetches time out by design; their warnings are not news here.
    logging.basicConfig(level=logging.ERROR)

    graphs = {m: build_graph(discover("/", fake=m)) for m in MACHINES}
    names = [f"node-{i:04d}" for i in range(a.nodes)]
    machine_of = {n: MACHINES[i % 2] for i, n in enumerate(names)}
    bodies = {n: json.dumps(rename_graph(graphs[machine_of[n]], n)).encode() for n in names}
    gpus_of = {
        m: [v["attrs"]["dra_device"] for v in graphs[m]["vertices"] if v["kind"] == "gpu"]
        for m in MACHINES
    }

    exporters = FakeExporters(bodies).start()
    source = GraphSource(
        url_template=exporters.url + "/{node}/v1/topology",
        workers=a.fetch_workers,
        read_timeout_s=30.0,
    ).start()
    cache = ClusterCache(DRIVER, source)
    ext = Extender(cache)
    t0 = time.perf_counter()
    for n in names:
        cache.apply("Node", "ADDED", _node(n, machine_of[n], False))
        cache.apply("ResourceSlice", "ADDED", _slice(n))
    claims: dict[str, tuple[str, list[str]]] = {}
    for n in names:
        if rng.random() < a.fill:
            taken = rng.sample(gpus_of[machine_of[n]], rng.randint(1, 6))
            claims[f"c-{n}"] = (n, taken)
            cache.apply("ResourceClaim", "ADDED", _claim(f"c-{n}", n, taken))
    while len(source.nodes()) < a.nodes or not source.idle():
        time.sleep(0.05)
    fetched_s = time.perf_counter() - t0
    fetch_requests = exporters.requests
    print(
        f"N={a.nodes}: {len(claims)} claims; every graph fetched in the background in "
        f"{fetched_s:.2f} s ({fetch_requests} requests, {a.fetch_workers} workers, "
        f"{exporters.stats.connections} connections)",
        file=sys.stderr,
    )

    gc.freeze()  # what scorer.extender_server.serve does once a burst of fetches is done
    server = ExtenderServer("127.0.0.1:0", ext).start()
    client = Client(server.url)
    bodies_by_shape = [_args(s, names, None) for s in SHAPES]
    out: dict[str, Any] = {
        "nodes": a.nodes,
        "claims": len(claims),
        "graphs_fetched_s": round(fetched_s, 2),
    }

    gcp = GcPauses()
    # A shape's first call searches for SEARCH_BUDGET_S and answers the rest from the
    # bound; its next calls go on searching until every node has its verdict.
    cold: list[float] = []
    cold_calls: list[float] = []
    fill_calls: list[int] = []
    for body in bodies_by_shape:
        calls = 0
        while True:
            bounded = ext.bounded
            ms, _ = client.post("filter", body)
            calls += 1
            cold_calls.append(ms)
            if calls == 1:
                cold.append(round(ms, 1))
            if ext.bounded == bounded:
                break
        fill_calls.append(calls)
    out["cold_filter_ms"] = cold
    out["cold_fill_calls"] = fill_calls
    out["cold_max_ms"] = round(max(cold_calls), 1)
    out["cold_searches"] = ext.searches
    out["cold_gc"] = gcp.take()

    def rounds(churn: bool) -> dict[str, Any]:
        gc.freeze()  # what scorer.extender_server.serve does every 30 s
        gcp.take()
        times: dict[str, list[float]] = {"filter": [], "prioritize": []}
        before = exporters.requests
        searches = ext.searches
        kept: list[int] = []
        changer = Churn(
            lambda: _churn(cache, claims, names, machine_of, gpus_of, rng), a.churn_rate
        )
        if churn:
            changer.start()
        for _ in range(a.rounds):
            for body in bodies_by_shape:
                for verb in ("filter", "prioritize"):
                    ms, size = client.post(verb, body)
                    times[verb].append(ms)
                    if verb == "filter":
                        kept.append(size)
        changer.done.set()
        return {
            "gc": gcp.take(),
            "filter": _summary(times["filter"]),
            "prioritize": _summary(times["prioritize"]),
            "endpoint_requests": exporters.requests - before,
            "searches": ext.searches - searches,
            "calls": 2 * len(times["filter"]),
            "mean_nodes_kept": round(sum(kept) / len(kept), 1),
            "claim_changes": changer.changes,
        }

    out["steady"] = rounds(False)
    # The same calls without HTTP, in this process: the extender's own work per call.
    own: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for _ in range(a.rounds):
        for body in bodies_by_shape:
            t0 = time.perf_counter()
            ext.filter_json(json.loads(body))
            t1 = time.perf_counter()
            ext.prioritize_json(json.loads(body))
            own["filter"].append((t1 - t0) * 1e3)
            own["prioritize"].append((time.perf_counter() - t1) * 1e3)
    out["in_process"] = {verb: _summary(ms) for verb, ms in own.items()}
    out["churn"] = rounds(True)

    gc.freeze()
    objects = [_node(n, machine_of[n], True) for n in names]
    big = _args(SHAPES[1], names, objects)
    obj_ms = [client.post("filter", big)[0] for _ in range(max(5, a.rounds // 4))]
    out["objects"] = {"body_bytes": len(big), "filter": _summary(obj_ms)}
    out["names_body_bytes"] = len(bodies_by_shape[1])

    # Every node's slices republished with a graph that changed (new ETags): 1,000
    # refetches, each parsed into a view by the fetch workers while the calls run.
    exporters.etags = {n: e[:-1] + b'-2"' for n, e in exporters.etags.items()}
    fetched = source.stats.fetched
    for n in names:
        cache.apply("ResourceSlice", "MODIFIED", _slice(n, 2))
    refetch_run = rounds(False)
    refetch_run["graphs_refetched_during"] = source.stats.fetched - fetched
    out["refetch"] = refetch_run

    hung = names[: a.hung]
    exporters.hung.update(hung)
    for n in hung:
        cache.apply("ResourceSlice", "MODIFIED", _slice(n, 3))
    time.sleep(0.5)  # the refetches are out, and hang
    hung_run = rounds(False)
    hung_run["fetches_waiting"] = len(source._running)
    out["hung"] = hung_run

    client.close()
    server.stop()
    source.stop()
    exporters.stop()

    head = ("phase", "verb", "n", "p50 ms", "p99 ms", "max ms", "node requests")
    print("{:<10} {:<11} {:>5} {:>8} {:>8} {:>8} {:>14}".format(*head), file=sys.stderr)
    for phase in ("steady", "churn", "refetch", "hung"):
        for verb in ("filter", "prioritize"):
            s = out[phase][verb]
            print(
                f"{phase:<10} {verb:<11} {s['n']:>5} {s['p50']:>8} {s['p99']:>8} {s['max']:>8} "
                f"{out[phase]['endpoint_requests']:>14}  gc {out[phase]['gc']}",
                file=sys.stderr,
            )
    for verb, s in out["in_process"].items():
        row = ("in-process", verb, s["n"], s["p50"], s["p99"], s["max"], "-")
        print("{:<10} {:<11} {:>5} {:>8} {:>8} {:>8} {:>14}".format(*row), file=sys.stderr)
    s = out["objects"]["filter"]
    row = ("objects", "filter", s["n"], s["p50"], s["p99"], s["max"], "-")
    print("{:<10} {:<11} {:>5} {:>8} {:>8} {:>8} {:>14}".format(*row), file=sys.stderr)
    print(
        f"cold: first filter per shape (ms) {cold}; calls until every node was searched "
        f"{fill_calls}, slowest of them {out['cold_max_ms']} ms; searches {out['cold_searches']}",
        file=sys.stderr,
    )
    print(json.dumps(out))
    return 0


def _churn(
    cache: ClusterCache,
    claims: dict[str, tuple[str, list[str]]],
    names: list[str],
    machine_of: dict[str, str],
    gpus_of: dict[str, list[str]],
    rng: random.Random,
) -> None:
    """One binding or release: a claim allocated on, or removed from, a random node."""
    node = rng.choice(names)
    key = f"c-{node}"
    if key in claims:
        cache.apply("ResourceClaim", "DELETED", _claim(key, node, claims.pop(key)[1]))
    else:
        taken = rng.sample(gpus_of[machine_of[node]], rng.randint(1, 6))
        claims[key] = (node, taken)
        cache.apply("ResourceClaim", "ADDED", _claim(key, node, taken))


if __name__ == "__main__":
    raise SystemExit(main())
