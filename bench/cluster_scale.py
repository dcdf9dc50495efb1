#!/usr/bin/env python3
"""toposlice's claims at cluster size, on the real v1.36.2 control plane (issue #22).

N Node objects (half dgx-h100, half pcie-8gpu), each with the ResourceSlices that
`toposlice slices --fake MACHINE --node-name NODE` prints and the `toposlice.dev/` labels
NFD would put on it from the driver's NodeFeature (normalize/node_feature.py), and the
DeviceClasses the chart installs. No kubelet runs: the controller-manager's node-lifecycle
controller is off, so the nodes stay Ready (and untainted) without Lease renewals. For
every claim kind (plain GPU counts, every example in examples/ that names only toposlice's
classes, and the `toposlice claim` shapes) PODS pods are created at once, each with its
own ResourceClaim (created first, so the resourceclaim controller's template work is not
what is timed) and the node affinity of the example's Pod where it has one, on an empty
cluster and on one whose GPUs are 90 % taken by plain claims (allocated by the admin in
one claim per node, a seeded mix of full and partly free nodes). Per kind:

  pods/s      bound pods / (last bind - first pod created), through a watch
  p50, p99    pod created -> bound (spec.nodeName seen), seconds
  filter ms   kube-scheduler's own DynamicResources Filter time per node (the mean of its
              sampled scheduler_plugin_execution_duration_seconds histogram), all
              outcomes; `fail` the Unschedulable ones alone
  ×plain      the ratio to the plain GPU count of as many devices as the kind takes at
              its first choice (at most 8), measured in the same run

`--claims old|new|both`: the new claims are what this tree writes (with its examples' pod
affinities); the old ones are the frozen copy in bench/data/cluster_scale_old_claims.json
(what the tree wrote at the revision it names, affinities included once frozen with them;
`--freeze` rewrites it from the current tree). Both run against the same slices and node
labels (this tree's), taking turns kind by kind; a kind whose claim and affinity did not
change runs once and fills both columns. kube-scheduler and controller-manager run at
`--kube-api-qps=300 --kube-api-burst=600`; `--default-limits` adds a pass on an empty
cluster with the scheduler restarted at its default client rate limits.

A kind whose pods do not all bind within --run-timeout seconds (or with no bind for
--stall seconds: the cluster is full for it) is reported from the pods that bound. The
run takes /tmp/toposlice-heavy.lock (flock) for its whole length (under `flock` on the same
file it uses the descriptor it inherits).

`--profile DIR` also records kube-scheduler's CPU profile (/debug/pprof) of each kind's run
and prints the CPU the DynamicResources Filter took per bound pod, over every node and
retry, and the share of it in CEL selector evaluation: a cost figure that, unlike the
sampled Filter histogram, weighs nodes by how often they are filtered.

Usage: python3 bench/cluster_scale.py --nodes 1000 [--claims both] [--pods 100]
  [--pods-full 50] [--fill 0,90] [--kinds a,b] [--default-limits] [--json FILE]
  [--profile DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/http.py would shadow the standard library's http package: drop the script's folder.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import contextlib
import fcntl
import functools
import json
import os
import random
import re
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import urllib3  # noqa: E402
import yaml  # noqa: E402

from bench import pprof  # noqa: E402
from bench.stats import pct  # noqa: E402
from driver.plumbing.atomic import write_atomic  # noqa: E402
from tests.e2e.cluster import SKIP_REASON, Cluster, find_assets, node_object  # noqa: E402

DRIVER = "toposlice.dev"
MACHINES = ("dgx-h100", "pcie-8gpu")
NAMESPACE = "bench"
RAISED_LIMITS = ("--kube-api-qps=300", "--kube-api-burst=600")
OLD_CLAIMS = REPO / "bench" / "data" / "cluster_scale_old_claims.json"
HEAVY_LOCK = "/tmp/toposlice-heavy.lock"
GPU_CLASS = f"gpu.{DRIVER}"
#: `toposlice claim` shapes measured besides the examples (the 2-GPU, 1-NIC one is
#: examples/gpus-2-nics-ladder.yaml, measured under that name).
CLAIM_SHAPES: dict[str, tuple[str, ...]] = {
    "claim --gpus 1": ("--gpus", "1"),
    "claim --gpus 4": ("--gpus", "4"),
    "claim --gpus 4 --nics-per-gpu 1": ("--gpus", "4", "--nics-per-gpu", "1"),
    "claim --gpus 2 --nics-per-gpu 1 --cpu-groups 1": (
        *("--gpus", "2", "--nics-per-gpu", "1", "--cpu-groups", "1"),
    ),
    "claim --gpus 2 --nics-per-gpu 1 --pattern tensor-parallel": (
        *("--gpus", "2", "--nics-per-gpu", "1", "--pattern", "tensor-parallel"),
    ),
}
#: The heavy shapes (issue #31): the standard pod of a multi-node training job and the
#: widest NIC shape, which before windowed claims made the scheduler search for seconds.
HEAVY_SHAPES: dict[str, tuple[str, ...]] = {
    "claim --gpus 8 --nics-per-gpu 1": ("--gpus", "8", "--nics-per-gpu", "1"),
    "claim --gpus 8 --nics-per-gpu 1 --pattern tensor-parallel": (
        *("--gpus", "8", "--nics-per-gpu", "1", "--pattern", "tensor-parallel"),
    ),
    "claim --gpus 4 --nics-per-gpu 2": ("--gpus", "4", "--nics-per-gpu", "2"),
}
CLAIM_SHAPES.update(HEAVY_SHAPES)
#: Busy GPUs per node at the 90 % fill, with their share of nodes: most nodes full,
#: some with one or two GPUs free (where paired claims fail after a search), a few
#: half or wholly free (where the big kinds fit). Mean 7.2 of 8 = 90 %.
FILL_MIX: tuple[tuple[int, float], ...] = ((8, 0.64), (7, 0.20), (6, 0.08), (4, 0.04), (0, 0.04))
#: Concurrent creates (nodes, slices, fill claims): the API server's latency per write, not
#: its CPU, bounded the 1,000-node populate at 8 (158 s under load).
CREATE_WORKERS = 32


# --------------------------------------------------------------------------- claims


def plain_spec(gpus: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": gpus}}]
        }
    }


def example_specs() -> dict[str, dict[str, Any]]:
    """The ResourceClaimTemplate spec of every example that names only this driver's
    DeviceClasses (the vendor-GPU one needs the NVIDIA driver's slices)."""
    return {k: spec for k, (spec, _) in _examples().items()}


def example_affinities() -> dict[str, dict[str, Any]]:
    """The Pod's ``affinity`` of each of those examples that has one: the bench's pods
    carry it as the example's would."""
    return {k: aff for k, (_, aff) in _examples().items() if aff}


def _examples() -> dict[str, tuple[dict[str, Any], dict[str, Any] | None]]:
    out: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for path in sorted((REPO / "examples").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        pods = [d for d in docs if d.get("kind") == "Pod"]
        affinity = pods[0]["spec"].get("affinity") if pods else None
        for doc in docs:
            if doc.get("kind") != "ResourceClaimTemplate":
                continue
            spec = doc["spec"]["spec"]
            if all(c.endswith(f".{DRIVER}") for c in classes_of(spec)):
                out[path.stem] = (spec, affinity)
    return out


def classes_of(spec: Mapping[str, Any]) -> set[str]:
    out = set()
    for r in spec["devices"]["requests"]:
        for alt in r.get("firstAvailable") or [r.get("exactly") or {}]:
            out.add(alt.get("deviceClassName", ""))
    return out


def claim_shape_spec(args: Sequence[str]) -> dict[str, Any]:
    """What `toposlice claim ARGS -o json` writes: the template's spec."""
    proc = subprocess.run(
        [sys.executable, "-m", "toposlice", "-q", "claim", *args, "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    doc = json.loads(proc.stdout)
    for item in doc["items"]:
        if item["kind"] == "ResourceClaimTemplate":
            spec: dict[str, Any] = item["spec"]["spec"]
            return spec
    raise RuntimeError(f"toposlice claim {' '.join(args)}: no ResourceClaimTemplate")


def new_claims() -> dict[str, dict[str, Any]]:
    out = example_specs()
    for name, args in CLAIM_SHAPES.items():
        out[name] = claim_shape_spec(args)
    return out


def old_claims(path: Path = OLD_CLAIMS) -> dict[str, dict[str, Any]]:
    data = json.loads(path.read_text())
    kinds: dict[str, dict[str, Any]] = data["kinds"]
    return kinds


def old_affinities(path: Path = OLD_CLAIMS) -> dict[str, dict[str, Any]]:
    """The frozen copy's pod affinities (none in a copy frozen before they existed)."""
    data = json.loads(path.read_text())
    affinities: dict[str, dict[str, Any]] = data.get("affinities") or {}
    return affinities


def gpus_of(spec: Mapping[str, Any]) -> int:
    """Devices the claim takes at its first choice, at most 8 (an ``All`` request: 8): the
    GPU count of the plain claim it is compared with. A plain claim for as many devices
    takes as many first-fit steps when all goes well, so the ratio shows what the claim's
    structure costs beyond its size."""
    n = 0
    for r in spec["devices"]["requests"]:
        alt = (r.get("firstAvailable") or [r.get("exactly") or {}])[0]
        n += 8 if alt.get("allocationMode") == "All" else int(alt.get("count", 1))
    return max(1, min(8, n))


# --------------------------------------------------------------------------- API access


class Api:
    """Raw JSON over one urllib3 pool with the admin's client certificate: the bench's
    own CPU use stays small next to the control plane it measures on a 2-core VM."""

    def __init__(self, cluster: Cluster, size: int = CREATE_WORKERS) -> None:
        ctx = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        ctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
        self.base = cluster.api_url
        self.ctx = ctx
        self.http = urllib3.PoolManager(maxsize=size, ssl_context=ctx, retries=False)
        sctx = ssl.create_default_context()
        sctx.check_hostname = False
        sctx.verify_mode = ssl.CERT_NONE
        sctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
        # kube-scheduler serves /metrics with a self-signed certificate of its own.
        warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
        self.sched = urllib3.PoolManager(maxsize=2, ssl_context=sctx, retries=False)
        self.sched_url = f"https://127.0.0.1:{cluster.sched_port}"

    def call(
        self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200, 201, 202)
    ) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        for attempt in range(6):
            resp = self.http.request(
                method, self.base + path, body=data, headers=headers, timeout=60
            )
            if resp.status == 429 or resp.status >= 500:
                time.sleep(0.2 * (attempt + 1))  # throttled or busy: bounded retry
                continue
            break
        if resp.status not in ok:
            raise RuntimeError(f"{method} {path}: {resp.status} {resp.data[:300]!r}")
        return json.loads(resp.data) if resp.data else None

    def metrics(self) -> str:
        resp = self.sched.request("GET", self.sched_url + "/metrics", timeout=30)
        if resp.status != 200:
            raise RuntimeError(f"scheduler /metrics: {resp.status}")
        return str(resp.data.decode())


def parallel(fn: Any, items: Sequence[Any], workers: int = 8) -> list[Any]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


# --------------------------------------------------------------------------- cluster


def node_slices(nodes: Sequence[tuple[str, str]]) -> dict[str, list[dict[str, Any]]]:
    """Per node, exactly what `toposlice slices --fake M --node-name NODE -o json` prints
    (the CLI is run once per machine; the node name only appears in the pool, nodeName
    and generateName, so it is substituted in the text)."""
    template: dict[str, str] = {}
    for machine in MACHINES:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "toposlice",
                "-q",
                "slices",
                "--fake",
                machine,
                "--node-name",
                "node-name-placeholder",
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        template[machine] = proc.stdout
    # `slices -o json` prints a v1 List (as kubectl does for several objects).
    return {
        n: json.loads(template[m].replace("node-name-placeholder", n))["items"] for n, m in nodes
    }


def node_names(n: int) -> list[tuple[str, str]]:
    return [(f"n{i:04d}-{MACHINES[i % 2].split('-')[0]}", MACHINES[i % 2]) for i in range(n)]


@functools.cache
def _machine_labels(machine: str) -> tuple[tuple[str, str], ...]:
    from normalize.node_feature import PREFIX, topology_labels
    from toposlice.discover import discover

    labels = topology_labels(discover("/", fake=machine), "node-name-placeholder")
    return tuple(sorted((f"{PREFIX}/{k}", v) for k, v in labels.items()))


def node_labels(name: str, machine: str) -> dict[str, str]:
    """The ``toposlice.dev/`` labels NFD's master gives the node from the NodeFeature the
    driver writes (``--node-feature``) on ``machine``: what a claim's node affinity
    reads. The node name only appears in ``nvlink-domain`` of a node-local domain."""
    return {k: v.replace("node-name-placeholder", name) for k, v in _machine_labels(machine)}


def node_body(name: str, machine: str) -> dict[str, Any]:
    """A Node created Ready with its status (the API keeps a Node's status on create)."""
    res = {"cpu": "256", "memory": "2Ti", "pods": "250"}
    body = node_object(name, {"bench.toposlice.dev/machine": machine, **node_labels(name, machine)})
    body["status"] = {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        "capacity": res,
        "allocatable": res,
    }
    return body


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the chart installs (tests/test_chart.py pins the chart's to
    these; rendering the chart needs Helm's SDK, which the bench does not)."""
    from normalize.deviceclasses import device_classes as classes

    return classes(DRIVER)


@dataclass
class Populated:
    nodes: list[tuple[str, str]]
    slices: dict[str, list[dict[str, Any]]]
    seconds: float
    slice_bytes: dict[str, int]


def populate(api: Api, n: int) -> Populated:
    t0 = time.monotonic()
    for c in device_classes():
        api.call("POST", "/apis/resource.k8s.io/v1/deviceclasses", c, ok=(201, 409))
    api.call(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        ok=(201, 409),
    )
    nodes = node_names(n)
    slices = node_slices(nodes)
    parallel(lambda nm: api.call("POST", "/api/v1/nodes", node_body(*nm)), nodes, CREATE_WORKERS)
    flat = [s for name, _ in nodes for s in slices[name]]
    slice_path = "/apis/resource.k8s.io/v1/resourceslices"
    parallel(lambda s: api.call("POST", slice_path, s), flat, CREATE_WORKERS)
    sizes = {m: len(json.dumps(slices[next(x for x, mm in nodes if mm == m)])) for m in MACHINES}
    # The default ServiceAccount must exist before pods are accepted.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(RuntimeError):
            api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
            break
        time.sleep(0.3)
    return Populated(nodes, slices, time.monotonic() - t0, sizes)


def gpu_names(slices: list[dict[str, Any]]) -> list[str]:
    return [
        d["name"]
        for s in slices
        for d in s["spec"]["devices"]
        if d["attributes"].get("type", {}).get("string") == "gpu"
    ]


def allocate_as_admin(api: Api, namespace: str, node: str, devices: Sequence[str]) -> None:
    """A claim ``fill-NODE`` whose allocation (``devices`` of the node's pool) the admin
    writes into its status directly: the scheduler then sees those devices in use, as if
    another pod held them."""
    name = f"fill-{node}"
    req = {"name": "fill", "exactly": {"deviceClassName": GPU_CLASS, "count": len(devices)}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {"bench": "fill"}},
        "spec": {"devices": {"requests": [req]}},
    }
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    created = api.call("POST", path, claim)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    results = [{"request": "fill", "driver": DRIVER, "pool": node, "device": d} for d in devices]
    created["status"] = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [term]},
        }
    }
    api.call("PUT", f"{path}/{name}/status", created)


def fill(api: Api, pop: Populated, percent: int, seed: int = 22) -> float:
    """Take ``percent`` % of the GPUs with plain claims the admin allocates (one claim per
    node, status written directly: the scheduler then sees those devices in use); the
    real share taken is returned."""
    if percent <= 0:
        return 0.0
    rng = random.Random(seed)
    scale = percent / 90.0
    mix = [(busy, share) for busy, share in FILL_MIX]
    total = busy_total = 0
    jobs = []
    for name, _ in pop.nodes:
        gpus = gpu_names(pop.slices[name])
        busy = rng.choices([b for b, _ in mix], [s for _, s in mix])[0]
        busy = min(len(gpus), round(busy * scale))
        total += len(gpus)
        busy_total += busy
        if busy:
            jobs.append((name, sorted(rng.sample(gpus, busy))))

    parallel(lambda job: allocate_as_admin(api, NAMESPACE, *job), jobs, CREATE_WORKERS)
    time.sleep(2)  # the scheduler's claim informer catches up
    return 100.0 * busy_total / max(total, 1)


# --------------------------------------------------------------------------- one kind


@dataclass
class KindResult:
    kind: str
    claims: str
    fill: int
    limits: str
    gpus: int
    pods: int
    bound: int
    seconds: float
    pods_per_s: float
    p50_s: float | None
    p99_s: float | None
    filter_ms: float | None
    filter_fail_ms: float | None
    filter_samples: int
    allocations: list[dict[str, Any]] = field(default_factory=list)
    #: With ``--profile``: kube-scheduler's CPU ms in DynamicResources Filter per bound pod
    #: (every node and retry of the kind's run, from its CPU profile), and the share of it
    #: spent evaluating CEL selectors.
    filter_cpu_ms_per_pod: float | None = None
    cel_share: float | None = None


FILTER_SAMPLE = re.compile(
    r"^scheduler_plugin_execution_duration_seconds_(sum|count)\{(?P<labels>[^}]*)\} (?P<v>\S+)$"
)


def dra_filter(text: str) -> dict[str, tuple[float, float]]:
    """status -> (sum seconds, count) of kube-scheduler's sampled DynamicResources Filter
    durations (one observation per node and pod, in 10 % of scheduling cycles)."""
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        m = FILTER_SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        if labels.get("plugin") != "DynamicResources" or labels.get("extension_point") != "Filter":
            continue
        st = labels.get("status", "")
        total, count = out.get(st, (0.0, 0.0))
        if m[1] == "sum":
            out[st] = (total + float(m["v"]), count)
        else:
            out[st] = (total, count + float(m["v"]))
    return out


class BindWatch:
    """Pod name -> monotonic time its spec.nodeName was first seen, from one watch."""

    def __init__(self, api: Api, label: str) -> None:
        self.bound: dict[str, float] = {}
        self.node: dict[str, str] = {}
        self.lock = threading.Lock()
        lst = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={label}")
        rv = lst["metadata"]["resourceVersion"]
        path = (
            f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&labelSelector={label}"
            f"&resourceVersion={rv}&allowWatchBookmarks=false"
        )
        # A pool of its own: a half-read stream must never go back to the shared pool.
        self.pool = urllib3.PoolManager(maxsize=1, ssl_context=api.ctx, retries=False)
        self.resp = self.pool.request(
            "GET", api.base + path, preload_content=False, timeout=urllib3.Timeout(read=None)
        )
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        buf = b""
        with contextlib.suppress(Exception):
            for chunk in self.resp.stream(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    node = (obj.get("spec") or {}).get("nodeName")
                    name = (obj.get("metadata") or {}).get("name")
                    if node and name:
                        with self.lock:
                            if name not in self.bound:
                                self.bound[name] = time.monotonic()
                                self.node[name] = node

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.resp.shutdown()
        self.thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.resp.close()
        self.pool.clear()


#: Frames of kube-scheduler's CPU profile: the DRA plugin's Filter, and the allocator's CEL
#: selector evaluation inside it (any allocator variant: stable, incubating, experimental).
FILTER_FRAME = "dynamicresources.(*DynamicResources).Filter"
CEL_FRAME = ".(*allocator).isSelectable"


class SchedProfile:
    """Back-to-back CPU profiles of kube-scheduler (``/debug/pprof/profile``, 2 s each)
    while a kind runs, kept under ``dir`` as ``<stem>-<i>.pb.gz``; Go serves one profile at
    a time, so the run is covered but for the few milliseconds between requests."""

    SECONDS = 2

    def __init__(self, api: Api, dir: Path, stem: str) -> None:
        self.api, self.dir, self.stem = api, dir, stem
        self.parts: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        url = f"{self.api.sched_url}/debug/pprof/profile?seconds={self.SECONDS}"
        while not self.stop.is_set():
            try:
                resp = self.api.sched.request("GET", url, timeout=self.SECONDS + 30)
            except urllib3.exceptions.HTTPError:
                time.sleep(0.5)
                continue
            if resp.status != 200:
                return  # not served (profiling off, not authorized): no figures, no retry
            self.parts.append(resp.data)

    def finish(self) -> tuple[float | None, float | None]:
        """(Filter CPU seconds, CEL CPU seconds); None without profiles."""
        self.stop.set()
        self.thread.join(timeout=self.SECONDS + 35)
        self.dir.mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(self.parts):
            write_atomic(self.dir / f"{self.stem}-{i}.pb.gz", data)
        if not self.parts:
            return None, None
        stacks = pprof.merge(pprof.parse(d) for d in self.parts)
        return stacks.seconds_under(FILTER_FRAME), stacks.seconds_under(CEL_FRAME)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def run_kind(
    api: Api,
    kind: str,
    claims: str,
    spec: dict[str, Any],
    pods: int,
    fill_pct: int,
    limits: str,
    run_timeout: float,
    stall: float,
    scheduler_name: str | None = None,
    affinity: Mapping[str, Any] | None = None,
    profile_dir: Path | None = None,
) -> KindResult:
    """``scheduler_name``: the pods' schedulerName (None: the default profile);
    ``affinity``: the pods' affinity (the example Pod's); ``profile_dir``: record
    kube-scheduler's CPU profile of the run there (:class:`SchedProfile`)."""
    run = uuid.uuid4().hex[:8]
    label = f"bench-run={run}"
    ns = NAMESPACE
    cpath = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    names = [f"p-{run}-{i:03d}" for i in range(pods)]

    def claim(name: str) -> None:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": {"bench-run": run}},
            "spec": spec,
        }
        api.call("POST", cpath, body)

    parallel(claim, names)
    before = dra_filter(api.metrics())
    watch = BindWatch(api, label)
    created: dict[str, float] = {}

    def pod(name: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"bench-run": run}},
            "spec": {
                **({"schedulerName": scheduler_name} if scheduler_name else {}),
                **({"affinity": affinity} if affinity else {}),
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "c", "resourceClaimName": name}],
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"claims": [{"name": "c"}]}}
                ],
            },
        }
        api.call("POST", f"/api/v1/namespaces/{ns}/pods", body)
        created[name] = time.monotonic()

    stem = f"fill{fill_pct}-{limits}-{slug(kind)}-{claims}"
    prof = SchedProfile(api, profile_dir, stem) if profile_dir else None
    t0 = time.monotonic()
    parallel(pod, names)
    last_progress, seen = time.monotonic(), 0
    while True:
        time.sleep(0.2)
        now = time.monotonic()
        n = len(watch.bound)
        if n != seen:
            seen, last_progress = n, now
        if n >= pods or now - t0 > run_timeout or now - last_progress > stall:
            break
    watch.close()
    filter_cpu, cel_cpu = prof.finish() if prof else (None, None)
    after = dra_filter(api.metrics())
    with watch.lock:
        bound = dict(watch.bound)
    lat = [bound[p] - created[p] for p in bound if p in created]
    first = min(created.values()) if created else t0
    span = (max(bound.values()) - first) if bound else 0.0
    diff = {
        st: (after[st][0] - before.get(st, (0, 0))[0], after[st][1] - before.get(st, (0, 0))[1])
        for st in after
    }
    tot_s = sum(v[0] for v in diff.values())
    tot_n = sum(v[1] for v in diff.values())
    fail_s = sum(v[0] for st, v in diff.items() if st != "Success")
    fail_n = sum(v[1] for st, v in diff.items() if st != "Success")
    allocations = collect_allocations(api, run)
    cleanup(api, run)
    return KindResult(
        kind=kind,
        claims=claims,
        fill=fill_pct,
        limits=limits,
        gpus=gpus_of(spec),
        pods=pods,
        bound=len(bound),
        seconds=round(span, 2),
        pods_per_s=round(len(bound) / span, 2) if span > 0 else 0.0,
        p50_s=round(pct(lat, 50), 2) if lat else None,
        p99_s=round(pct(lat, 99), 2) if lat else None,
        filter_ms=round(1000 * tot_s / tot_n, 3) if tot_n else None,
        filter_fail_ms=round(1000 * fail_s / fail_n, 3) if fail_n else None,
        filter_samples=int(tot_n),
        allocations=allocations,
        filter_cpu_ms_per_pod=(
            round(1000 * filter_cpu / len(bound), 2) if filter_cpu is not None and bound else None
        ),
        cel_share=round(cel_cpu / filter_cpu, 3) if cel_cpu is not None and filter_cpu else None,
    )


def collect_allocations(api: Api, run: str) -> list[dict[str, Any]]:
    """(node, [(request, device)]) of every claim of the run the scheduler allocated."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    items = api.call("GET", f"{path}?labelSelector=bench-run={run}")["items"]
    out = []
    for c in items:
        alloc = (c.get("status") or {}).get("allocation")
        if not alloc:
            continue
        results = alloc["devices"]["results"]
        out.append(
            {
                "claim": c["metadata"]["name"],
                "node": results[0]["pool"] if results else None,
                "results": sorted((r["request"], r["device"]) for r in results),
            }
        )
    return out


def cleanup(api: Api, run: str, timeout: float = 180) -> None:
    """Delete the run's pods (at once: no kubelet) and claims, and wait until the claims
    are gone (the resourceclaim controller lifts their reservation and finalizer), so
    the next kind starts on the same occupancy."""
    ns = NAMESPACE
    sel = f"labelSelector=bench-run={run}"
    api.call("DELETE", f"/api/v1/namespaces/{ns}/pods?{sel}&gracePeriodSeconds=0")
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    api.call("DELETE", f"{path}?{sel}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = api.call("GET", f"{path}?{sel}&limit=1")["items"]
        pods = api.call("GET", f"/api/v1/namespaces/{ns}/pods?{sel}&limit=1")["items"]
        if not left and not pods:
            time.sleep(1.0)  # the scheduler's caches see the last deletions
            return
        time.sleep(0.5)
    raise RuntimeError(f"run {run}: claims not deleted after {timeout:.0f}s")


# --------------------------------------------------------------------------- whole run


@dataclass
class Plan:
    nodes: int
    claims: str
    pods: int
    pods_full: int
    fills: list[int]
    kinds: list[str] | None
    run_timeout: float
    stall: float
    default_limits: bool
    default_kinds: tuple[str, ...] = ("gpus-2-nics-ladder",)
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    profile_dir: Path | None = None


Kind = tuple[str, str, dict[str, Any], dict[str, Any] | None]


def kinds_to_run(plan: Plan) -> list[Kind]:
    """(kind, claims, spec, pod affinity) in run order: per GPU count its plain claim,
    then each kind needing that many GPUs, old and new taking turns."""
    new = new_claims() if plan.claims in ("new", "both") else {}
    new.update(plan.extra)
    old = old_claims() if plan.claims in ("old", "both") else {}
    new_aff, old_aff = example_affinities(), old_affinities()
    names = sorted(set(new) | set(old), key=lambda k: (gpus_of((new or old)[k]), k))
    if plan.kinds:
        names = [k for k in names if k in plan.kinds or k in plan.extra]
    out: list[Kind] = []
    counts = sorted({gpus_of((new or old)[k]) for k in names} | {2})
    for g in counts:
        out.append((f"plain {g} GPU{'s' if g > 1 else ''}", "plain", plain_spec(g), None))
        for k in names:
            if gpus_of((new or old)[k]) != g:
                continue
            if k in old and k in new and (old[k], old_aff.get(k)) == (new[k], new_aff.get(k)):
                # unchanged: measured once, shown in both
                out.append((k, "same", new[k], new_aff.get(k)))
                continue
            if k in old:
                out.append((k, "old", old[k], old_aff.get(k)))
            if k in new:
                out.append((k, "new", new[k], new_aff.get(k)))
    return out


@contextlib.contextmanager
def heavy_lock(path: str = HEAVY_LOCK) -> Iterator[None]:
    """Hold ``path`` (flock) for the block. Run as ``flock FILE python3 bench/...``, the
    process inherits flock(1)'s descriptor, whose open file holds the lock: locking a new
    descriptor of the same file would wait for that lock forever, so the inherited one is
    used (locking it again returns at once) and left to flock(1) to release."""
    inherited = _inherited_fd(path)
    if inherited is not None:
        fcntl.flock(inherited, fcntl.LOCK_EX)
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _inherited_fd(path: str) -> int | None:
    """A descriptor of this process already open on ``path`` (Linux: /proc/self/fd)."""
    try:
        want = os.stat(path)
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in fds:
        with contextlib.suppress(OSError, ValueError):
            st = os.fstat(int(name))
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                return int(name)
    return None


def start_cluster(dir: Path, raised: bool = True) -> Cluster:
    assets = find_assets()
    if assets is None:
        raise SystemExit(SKIP_REASON)
    limits = list(RAISED_LIMITS) if raised else []
    return Cluster.start(
        dir,
        assets,
        extra_args={
            "kube-controller-manager": ["--controllers=*,-node-lifecycle-controller", *limits],
            "kube-scheduler": limits,
        },
    )


def run(plan: Plan, out: Any = sys.stdout) -> list[KindResult]:
    results: list[KindResult] = []
    with tempfile.TemporaryDirectory(prefix="cluster-scale-") as tmp:
        cluster = start_cluster(Path(tmp))
        try:
            api = Api(cluster)
            pop = populate(api, plan.nodes)
            print(
                f"# {plan.nodes} nodes ({', '.join(MACHINES)}), slices created in "
                f"{pop.seconds:.0f}s; slice bytes per node: "
                + ", ".join(f"{m} {b}" for m, b in pop.slice_bytes.items()),
                file=out,
                flush=True,
            )
            kinds = kinds_to_run(plan)
            for fill_pct in plan.fills:
                real = fill(api, pop, fill_pct)
                pods = plan.pods if fill_pct == 0 else plan.pods_full
                print(
                    f"# fill {fill_pct}% (GPUs taken: {real:.1f}%), {pods} pods per kind",
                    file=out,
                    flush=True,
                )
                for kind, claims, spec, affinity in kinds:
                    r = run_kind(
                        api,
                        kind,
                        claims,
                        spec,
                        pods,
                        fill_pct,
                        "raised",
                        plan.run_timeout,
                        plan.stall,
                        affinity=affinity,
                        profile_dir=plan.profile_dir,
                    )
                    results.append(r)
                    print(progress_line(r), file=out, flush=True)
                unfill(api)
            if plan.default_limits:
                cluster.restart_scheduler([])
                api = Api(cluster)
                print(
                    "# default client rate limits (kube-scheduler restarted without "
                    "--kube-api-qps/--kube-api-burst), empty cluster",
                    file=out,
                    flush=True,
                )
                chosen = [k for k in kinds if k[0] in plan.default_kinds]
                sizes = {gpus_of(k[2]) for k in chosen}
                for kind, claims, spec, affinity in kinds:
                    if (kind, claims, spec, affinity) not in chosen and not (
                        claims == "plain" and gpus_of(spec) in sizes
                    ):
                        continue
                    r = run_kind(
                        api,
                        kind,
                        claims,
                        spec,
                        plan.pods,
                        0,
                        "default",
                        plan.run_timeout,
                        plan.stall,
                        affinity=affinity,
                        profile_dir=plan.profile_dir,
                    )
                    results.append(r)
                    print(progress_line(r), file=out, flush=True)
        finally:
            cluster.stop()
    return results


def unfill(api: Api) -> None:
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    api.call("DELETE", f"{path}?labelSelector=bench=fill")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if not api.call("GET", f"{path}?labelSelector=bench=fill&limit=1")["items"]:
            return
        time.sleep(0.5)


def progress_line(r: KindResult) -> str:
    return (
        f"  {r.kind:<48} {r.claims:<5} {r.bound:>4}/{r.pods:<4} {r.pods_per_s:>6.2f}/s "
        f"p50 {fmt(r.p50_s)} p99 {fmt(r.p99_s)} filter {fmt(r.filter_ms, 2)} ms "
        f"(fail {fmt(r.filter_fail_ms, 2)}, n={r.filter_samples})"
        + (
            f" cpu {r.filter_cpu_ms_per_pod:.1f} ms/pod (CEL {100 * (r.cel_share or 0):.0f} %)"
            if r.filter_cpu_ms_per_pod is not None
            else ""
        )
    )


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(results: Sequence[KindResult]) -> str:
    """Per fill and limits: each kind's old and new figures side by side, with the ratio
    to the plain count of as many GPUs from the same run."""
    return side_by_side(
        results,
        "pods/s (x plain), p50/p99 s, DynamicResources Filter ms per node (x plain)",
        cell,
        40,
    )


def cpu_table(results: Sequence[KindResult]) -> str:
    """With ``--profile``: per fill and limits, the Filter CPU per bound pod of each kind
    (today's and new) with its ratio to the plain count of as many GPUs, and the CEL share."""
    title = "kube-scheduler CPU in DynamicResources Filter, ms per bound pod (x plain), CEL share"
    return side_by_side(results, title, cpu_cell, 22)


def side_by_side(
    results: Sequence[KindResult],
    title: str,
    fmt_cell: Callable[[KindResult | None, KindResult | None], str],
    width: int,
) -> str:
    """One table per (limits, fill): a row per kind, today's and the new claim's cells
    (a plain count's in both), each against the plain count of as many GPUs."""
    lines: list[str] = []
    groups = sorted({(r.limits, r.fill) for r in results}, key=lambda x: (x[0] != "raised", x[1]))
    for limits, fill_pct in groups:
        rs = [r for r in results if r.fill == fill_pct and r.limits == limits]
        plain = {r.gpus: r for r in rs if r.claims == "plain"}
        head = f"{'claim':<48} {'devs':>4} | {'today':<{width}} | {'new':<{width}}"
        lines += ["", f"fill {fill_pct}%, client limits {limits}: {title}", head, "-" * len(head)]
        for k in dict.fromkeys(r.kind for r in rs):
            cells = {r.claims: r for r in rs if r.kind == k}
            g = next(iter(cells.values())).gpus
            base = plain.get(g)
            if "plain" in cells:
                before = after = cells["plain"]
            else:
                before = cells.get("old") or cells.get("same")
                after = cells.get("new") or cells.get("same")
            a, b = fmt_cell(before, base), fmt_cell(after, base)
            lines.append(f"{k:<48} {g:>4} | {a:<{width}} | {b:<{width}}")
    return "\n".join(lines)


def cpu_cell(r: KindResult | None, base: KindResult | None) -> str:
    if r is None or r.filter_cpu_ms_per_pod is None:
        return "-"
    out = f"{r.filter_cpu_ms_per_pod:.0f}"
    if base and base.filter_cpu_ms_per_pod and r is not base:
        out += f" ({r.filter_cpu_ms_per_pod / base.filter_cpu_ms_per_pod:.1f})"
    return out + f" {100 * (r.cel_share or 0):.0f}%"


def cell(r: KindResult | None, base: KindResult | None) -> str:
    if r is None:
        return "-"
    rate = f"{r.pods_per_s:.1f}"
    if base and base.pods_per_s and r is not base:
        rate += f" ({r.pods_per_s / base.pods_per_s:.2f})"
    if r.bound < r.pods:
        rate += f" [{r.bound}/{r.pods}]"
    filt = fmt(r.filter_ms, 2)
    if base and base.filter_ms and r.filter_ms and r is not base:
        filt += f" ({r.filter_ms / base.filter_ms:.1f})"
    return f"{rate} {fmt(r.p50_s)}/{fmt(r.p99_s)} {filt}"


def freeze(path: Path, rev: str) -> None:
    """Write the current tree's claims as the frozen 'today' copy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"rev": rev, "kinds": new_claims(), "affinities": example_affinities()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--claims", choices=["old", "new", "both"], default="both")
    ap.add_argument("--pods", type=int, default=None, help="pods per kind, empty cluster")
    ap.add_argument("--pods-full", type=int, default=None, help="pods per kind, filled")
    ap.add_argument("--fill", default="0,90", help="GPU fill percentages (default 0,90)")
    ap.add_argument("--kinds", default=None, help="comma-separated kinds (default: all)")
    ap.add_argument("--run-timeout", type=float, default=None, help="seconds per kind")
    ap.add_argument("--stall", type=float, default=8.0, help="stop a kind after no bind for S")
    ap.add_argument(
        "--default-limits",
        nargs="?",
        const="gpus-2-nics-ladder",
        default=None,
        metavar="KINDS",
        help="also run KINDS (default: the ladder example) and their plain counts with the "
        "scheduler at its default client rate limits",
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="record kube-scheduler's CPU profile of each kind's run in DIR and print its "
        "DynamicResources Filter CPU per pod and CEL share (bench/pprof.py reads them)",
    )
    ap.add_argument(
        "--extra", default=None, metavar="FILE", help="more kinds: JSON {name: claim spec}"
    )
    ap.add_argument("--freeze", action="store_true", help="rewrite the frozen old claims")
    ap.add_argument("--freeze-rev", default="HEAD")
    args = ap.parse_args(argv)
    if args.freeze:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", args.freeze_rev],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout.strip()
        freeze(OLD_CLAIMS, rev)
        print(f"wrote {OLD_CLAIMS.relative_to(REPO)} (rev {rev})")
        return 0
    big = args.nodes >= 500
    plan = Plan(
        nodes=args.nodes,
        claims=args.claims,
        pods=args.pods or (80 if big else 60),
        pods_full=args.pods_full or (30 if big else 20),
        fills=[int(x) for x in args.fill.split(",") if x != ""],
        kinds=args.kinds.split(",") if args.kinds else None,
        run_timeout=args.run_timeout or 20.0,
        stall=args.stall,
        default_limits=args.default_limits is not None,
        default_kinds=tuple((args.default_limits or "").split(",")),
        extra=json.loads(Path(args.extra).read_text()) if args.extra else {},
        profile_dir=Path(args.profile) if args.profile else None,
    )
    # SIGTERM (a timeout, a CI cancel) unwinds like ^C, so the control plane is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Hundreds of nodes: one such control plane on the machine at a time.
    with heavy_lock() if args.nodes >= 200 else contextlib.nullcontext():
        t0 = time.monotonic()  # from holding the lock: another run's wait is not this one's
        load0 = os.getloadavg()[0]
        results = run(plan)
        load1 = os.getloadavg()[0]
    print(table(results))
    if any(r.filter_cpu_ms_per_pod is not None for r in results):
        print(cpu_table(results))
    print(
        f"\n# {time.monotonic() - t0:.0f}s in all (lock held); "
        f"1-minute load average {load0:.1f} at the start, {load1:.1f} at the end"
    )
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
