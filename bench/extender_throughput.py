#!/usr/bin/env python3
"""The scheduler's throughput with toposlice's extender profile against without it, on the
real v1.36.2 control plane at N nodes (issue #22: >= 0.8x at N=1000).

The cluster is bench/cluster_scale.py's (N Node objects, half dgx-h100, half pcie-8gpu,
each with the slices `toposlice slices` prints, the chart's DeviceClasses, no kubelets),
plus:

* `toposlice scorer serve` as a process of its own, reading the API as its informers do,
  with every node's `/v1/topology` served by a fake exporter in this process (ETag, 304;
  it counts requests: the extender must make none per call);
* a second kube-scheduler with examples/scheduler/kube-scheduler-config.yaml (the
  `toposlice-scheduler` profile, the extender with `nodeCacheCapable: true`), its
  urlPrefix pointed at the scorer and its client limits raised as the default
  scheduler's are (`--kube-api-qps=300 --kube-api-burst=600`).

Per claim kind, the same batch of pods (each with its own ResourceClaim, created at once)
runs on the default profile and on the extender profile in turns, `--rounds` times each
(default, extender, default, extender, ...), each batch deleted before the next, so both
see the same cluster and the same machine load. Printed per kind: pods/s of each turn,
p50/p99 creation -> bound, the ratio extender/default (bound pods over summed seconds),
and what the scorer says it did (calls, mean seconds per call, requests to node
endpoints while scheduling).

    python3 bench/extender_throughput.py --nodes 1000 [--pods 80] [--rounds 2] [--fill 90]
      [--kinds "plain 2 GPUs,gpus-2-nics-ladder"] [--json FILE]

``--fill 90``: 90 % of the GPUs taken first by plain claims, as cluster_scale's full
cluster (most nodes full, some with one to four GPUs free).

The run takes /tmp/toposlice-heavy.lock (flock) at N >= 200.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/http.py would shadow the standard library's http package: drop the script's folder.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import contextlib
import json
import os
import signal
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import urllib3  # noqa: E402
import yaml  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.cluster_scale import (  # noqa: E402
    DRIVER,
    MACHINES,
    Api,
    KindResult,
    fill,
    heavy_lock,
    new_claims,
    plain_spec,
    populate,
    run_kind,
    start_cluster,
)
from bench.extender import FakeExporters  # noqa: E402
from tests.e2e.cluster import FEATURE_GATES, Cluster, free_ports, poll  # noqa: E402

PROFILE = "toposlice-scheduler"
CONFIG = REPO / "examples" / "scheduler" / "kube-scheduler-config.yaml"
DEFAULT_KINDS = ("plain 2 GPUs", "gpus-2-nics-ladder")


@dataclass
class ScorerCounts:
    """The scorer's own counters (its /metrics), read before and after a batch."""

    calls: dict[str, float]
    seconds: dict[str, float]
    graph_requests: float
    buckets: dict[str, dict[float, float]]
    """verb -> upper bound (s) -> calls at most that long (the histogram's buckets)."""

    def minus(self, before: ScorerCounts) -> ScorerCounts:
        return ScorerCounts(
            {v: n - before.calls.get(v, 0.0) for v, n in self.calls.items()},
            {v: s - before.seconds.get(v, 0.0) for v, s in self.seconds.items()},
            self.graph_requests - before.graph_requests,
            {
                v: {le: n - before.buckets.get(v, {}).get(le, 0.0) for le, n in b.items()}
                for v, b in self.buckets.items()
            },
        )

    def p99_bound_ms(self, verb: str) -> float | None:
        """The histogram bucket the 99th percentile call fell in (its upper bound)."""
        total = self.calls.get(verb, 0.0)
        for le, n in sorted(self.buckets.get(verb, {}).items()):
            if total and n >= 0.99 * total:
                return 1000 * le
        return None


def scorer_counts(url: str) -> ScorerCounts:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    calls: dict[str, float] = {}
    seconds: dict[str, float] = {}
    graph_requests = 0.0
    buckets: dict[str, dict[float, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "toposlice_extender_call_seconds_bucket":
                buckets.setdefault(s.labels["verb"], {})[float(s.labels["le"])] = s.value
            elif s.name == "toposlice_extender_call_seconds_count":
                calls[s.labels["verb"]] = s.value
            elif s.name == "toposlice_extender_call_seconds_sum":
                seconds[s.labels["verb"]] = s.value
            elif s.name == "toposlice_extender_graph_requests_total":
                graph_requests += s.value
    return ScorerCounts(calls, seconds, graph_requests, buckets)


def graphs_of(nodes: Sequence[tuple[str, str]]) -> dict[str, bytes]:
    """Each node's /v1/topology body, as its exporter would serve it."""
    from normalize.graph import build_graph
    from scorer.topology import rename_graph
    from toposlice.discover import discover

    graphs = {m: build_graph(discover("/", fake=m)) for m in MACHINES}
    return {n: json.dumps(rename_graph(graphs[m], n)).encode() for n, m in nodes}


def start_scorer(cluster: Cluster, exporters: FakeExporters, nodes: int) -> str:
    """`toposlice scorer serve` on the cluster, its graphs from ``exporters``; returns its
    URL once its informers listed and every node's graph is in."""
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "toposlice", "scorer", "serve", "--http-addr"]
    argv += [f"127.0.0.1:{port}", "--driver", DRIVER, "--log-level", "warning"]
    argv += ["--topology-url", exporters.url + "/{node}/v1/topology"]
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    cluster.spawn("toposlice-scorer", argv, env=env)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                return resp.status == 200
        return False

    poll(ready, 120, 0.2, "scorer /readyz (informers listed)")

    def graphs_in() -> bool:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("toposlice_extender_graphs "):
                    return float(line.split()[1]) >= nodes
        return False

    poll(graphs_in, 300, 0.5, f"the scorer's {nodes} graphs")
    return url


def start_extender_scheduler(cluster: Cluster, scorer_url: str, raised: bool) -> None:
    """A second kube-scheduler serving the shipped extender profile."""
    config = yaml.safe_load(CONFIG.read_text())
    config["extenders"][0]["urlPrefix"] = scorer_url
    conn: dict[str, Any] = {"kubeconfig": str(cluster.dir / "scheduler.kubeconfig")}
    if raised:  # as the default scheduler's --kube-api-qps=300 --kube-api-burst=600
        conn |= {"qps": 300, "burst": 600}
    config["clientConnection"] = conn
    cfg = cluster.dir / "kube-scheduler-toposlice.yaml"
    cfg.write_text(yaml.safe_dump(config))
    gates = ",".join(f"{g}=true" for g in FEATURE_GATES)
    cluster.spawn(
        "kube-scheduler-toposlice",
        [
            str(cluster.bin / "kube-scheduler"),
            f"--config={cfg}",
            "--secure-port=0",
            f"--feature-gates={gates}",
        ],
    )


@dataclass
class Turn:
    kind: str
    profile: str
    result: KindResult
    scorer: ScorerCounts | None
    endpoint_requests: int


def specs(kinds: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    claims = new_claims()
    for k in kinds:
        if k.startswith("plain "):
            out[k] = plain_spec(int(k.split()[1]))
        elif k in claims:
            out[k] = claims[k]
        else:
            raise SystemExit(f"unknown kind {k!r} (plain N GPUs, or one of {sorted(claims)})")
    return out


def run(args: argparse.Namespace) -> list[Turn]:
    turns: list[Turn] = []
    with tempfile.TemporaryDirectory(prefix="extender-throughput-") as tmp:
        cluster = start_cluster(Path(tmp))
        exporters: FakeExporters | None = None
        try:
            api = Api(cluster)
            pop = populate(api, args.nodes)
            taken = fill(api, pop, args.fill)
            exporters = FakeExporters(graphs_of(pop.nodes)).start()
            t0 = time.monotonic()
            url = start_scorer(cluster, exporters, args.nodes)
            print(
                f"# {args.nodes} nodes, slices in {pop.seconds:.0f}s, {taken:.0f} % of GPUs "
                "taken; scorer ready with "
                f"every graph in {time.monotonic() - t0:.1f}s ({exporters.requests} requests)",
                flush=True,
            )
            start_extender_scheduler(cluster, url, raised=True)
            time.sleep(3)  # its informers list before its first pod
            for kind, spec in specs(args.kinds).items():
                for _ in range(args.rounds):
                    for profile in ("default", "extender"):
                        before = scorer_counts(url)
                        requests = exporters.requests
                        r = run_kind(
                            api,
                            kind,
                            profile,
                            spec,
                            args.pods,
                            args.fill,
                            "raised",
                            args.run_timeout,
                            args.stall,
                            scheduler_name=PROFILE if profile == "extender" else None,
                        )
                        delta = scorer_counts(url).minus(before)
                        t = Turn(kind, profile, r, delta, exporters.requests - requests)
                        turns.append(t)
                        print(turn_line(t), flush=True)
        finally:
            if exporters is not None:
                exporters.stop()
            cluster.stop()
    return turns


def turn_line(t: Turn) -> str:
    r, s = t.result, t.scorer
    line = (
        f"  {t.kind:<24} {t.profile:<8} {r.bound:>4}/{r.pods:<4} {r.pods_per_s:>6.2f}/s "
        f"p50 {r.p50_s} p99 {r.p99_s}"
    )
    if s is not None and t.profile == "extender":
        calls = {v: int(n) for v, n in s.calls.items()}
        mean = {v: round(1000 * s.seconds[v] / n, 2) for v, n in s.calls.items() if n}
        p99 = {v: s.p99_bound_ms(v) for v in s.calls}
        line += f"  scorer calls {calls} mean ms {mean} p99 <= ms {p99}"
    return line + f"  node-endpoint requests {t.endpoint_requests}"


def table(turns: Sequence[Turn]) -> str:
    lines = [
        "",
        "kind                     | default pods/s (turns)   | extender pods/s (turns)  | ratio",
        "-" * 86,
    ]
    for kind in dict.fromkeys(t.kind for t in turns):
        cells: dict[str, str] = {}
        rate: dict[str, float] = {}
        for profile in ("default", "extender"):
            rs = [t.result for t in turns if t.kind == kind and t.profile == profile]
            bound, secs = sum(r.bound for r in rs), sum(r.seconds for r in rs)
            rate[profile] = bound / secs if secs else 0.0
            each = ", ".join(f"{r.pods_per_s:.1f}" for r in rs)
            cells[profile] = f"{rate[profile]:.1f} ({each})"
        ratio = rate["extender"] / rate["default"] if rate["default"] else 0.0
        lines.append(f"{kind:<24} | {cells['default']:<24} | {cells['extender']:<24} | {ratio:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=80, help="pods per batch")
    ap.add_argument("--rounds", type=int, default=2, help="batches per profile and kind")
    ap.add_argument(
        "--fill", type=int, default=0, help="%% of GPUs taken first (cluster_scale's mix)"
    )
    ap.add_argument("--kinds", default=",".join(DEFAULT_KINDS), help="comma-separated kinds")
    ap.add_argument("--run-timeout", type=float, default=60.0, help="seconds per batch")
    ap.add_argument("--stall", type=float, default=10.0, help="stop a batch after no bind for S")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # cluster_scale reads the scheduler's /metrics without verifying its self-signed cert.
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    t0 = time.monotonic()
    with heavy_lock() if args.nodes >= 200 else contextlib.nullcontext():
        turns = run(args)
    print(table(turns))
    print(f"\n# {time.monotonic() - t0:.0f}s in all; load average {os.getloadavg()}")
    if args.json:
        doc = [
            {"kind": t.kind, "profile": t.profile, "endpoint_requests": t.endpoint_requests}
            | {"result": asdict(t.result), "scorer": asdict(t.scorer) if t.scorer else None}
            for t in turns
        ]
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
