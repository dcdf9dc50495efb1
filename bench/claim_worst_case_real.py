"""The worst cases of bench/claim_worst_case.py on the real kube-scheduler v1.36.2.

One Node per case (its machine's slices as `toposlice slices` prints them, its occupancy
allocated to an admin claim), and per case one pod pinned to that node by node affinity
on ``metadata.name``, so that the scheduler's Filter runs on that node alone. The figure
is the scheduler's own time for the pod's scheduling attempts (the exact sum and count of
``scheduler_scheduling_attempt_duration_seconds`` before and after), which on one node is
the DynamicResources Filter plus a fixed overhead: a plain 2-GPU count on the same nodes,
measured in the same run, gives that overhead. Used by the bench (``--real``) and by the
e2e tier (tests/e2e/test_claim_worst_case.py).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster_scale import (
    Api,
    allocate_as_admin,
    device_classes,
    heavy_lock,
    parallel,
    start_cluster,
)
from tests.e2e.cluster import Cluster, node_object

NAMESPACE = "worst"
DRIVER = "toposlice.dev"
_ATTEMPT = re.compile(r"^scheduler_scheduling_attempt_duration_seconds_(sum|count)\{[^}]*\} (\S+)$")


@dataclass
class Measured:
    shape: str
    node: str
    machine: str
    occupancy: str
    attempts: int
    ms: float
    """Mean scheduling attempt, milliseconds."""
    outcome: str
    """``bound``, ``unschedulable`` or the scheduler's error (``timed out ...``)."""


@dataclass(frozen=True)
class NodeCase:
    machine: str
    occupancy: str
    busy: tuple[str, ...]


def attempt_totals(metrics: str) -> tuple[float, int]:
    """(seconds, attempts) summed over results and profiles."""
    total, count = 0.0, 0
    for line in metrics.splitlines():
        m = _ATTEMPT.match(line)
        if m:
            if m.group(1) == "sum":
                total += float(m.group(2))
            else:
                count += int(float(m.group(2)))
    return total, count


def _slices(machine: str, node: str) -> list[dict[str, Any]]:
    from bench.claim_worst_case import machine_slices

    return machine_slices(machine, node)


class WorstCluster:
    """A control plane with one node per (machine, occupancy)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.api = Api(cluster)
        self.nodes: dict[NodeCase, str] = {}
        self._templates: dict[str, list[dict[str, Any]]] = {}
        for c in device_classes():
            self.api.call("POST", "/apis/resource.k8s.io/v1/deviceclasses", c, ok=(201, 409))
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        self.api.call("POST", "/api/v1/namespaces", ns, ok=(201, 409))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                self.api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
                break
            time.sleep(0.3)

    def add_nodes(self, cases: Sequence[NodeCase]) -> None:
        todo = [c for c in dict.fromkeys(cases) if c not in self.nodes]
        for c in todo:
            self.nodes[c] = f"wc-{len(self.nodes)}"
        parallel(self._add, [(c, self.nodes[c]) for c in todo], 8)
        time.sleep(2)  # the scheduler's informers catch up

    def _add(self, job: tuple[NodeCase, str]) -> None:
        case, name = job
        res = {"cpu": "256", "memory": "2Ti", "pods": "250"}
        body = node_object(name, {"bench.toposlice.dev/machine": case.machine})
        body["status"] = {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "capacity": res,
            "allocatable": res,
        }
        self.api.call("POST", "/api/v1/nodes", body)
        for s in _slices(case.machine, name):
            self.api.call("POST", "/apis/resource.k8s.io/v1/resourceslices", s)
        if case.busy:
            allocate_as_admin(self.api, NAMESPACE, name, sorted(case.busy))

    def measure(
        self, shape: str, spec: Mapping[str, Any], case: NodeCase, timeout: float = 60
    ) -> Measured:
        node = self.nodes[case]
        uid = f"p{time.monotonic_ns() % 10**12}"
        base = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": uid},
            "spec": spec,
        }
        self.api.call("POST", base, claim)
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": uid},
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [term]
                        }
                    }
                },
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "c", "resourceClaimName": uid}],
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"claims": [{"name": "c"}]}}
                ],
            },
        }
        before = attempt_totals(self.api.metrics())
        self.api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        outcome = "pending"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{uid}")
            if got["spec"].get("nodeName"):
                outcome = "bound"
                break
            conds = {c["type"]: c for c in (got.get("status") or {}).get("conditions") or []}
            sched = conds.get("PodScheduled")
            if sched and sched.get("status") == "False":
                msg = str(sched.get("message") or "")
                outcome = "timed out" if "timed out" in msg else "unschedulable"
                break
            time.sleep(0.05)
        after = attempt_totals(self.api.metrics())
        attempts = max(after[1] - before[1], 0)
        ms = 1000.0 * (after[0] - before[0]) / attempts if attempts else float("nan")
        self.api.call(
            "DELETE",
            f"/api/v1/namespaces/{NAMESPACE}/pods/{uid}?gracePeriodSeconds=0",
            ok=(200, 202, 404),
        )
        self.api.call("DELETE", f"{base}/{uid}", ok=(200, 202, 404))
        return Measured(shape, node, case.machine, case.occupancy, attempts, ms, outcome)


@contextlib.contextmanager
def worst_cluster(dir: Path | None = None) -> Iterator[WorstCluster]:
    with contextlib.ExitStack() as stack:
        if dir is None:
            dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="worst-")))
        stack.enter_context(heavy_lock())
        cluster = start_cluster(dir)
        stack.callback(cluster.stop)
        yield WorstCluster(cluster)


def plain(gpus: int = 2) -> dict[str, Any]:
    req = {"name": "gpus", "exactly": {"deviceClassName": f"gpu.{DRIVER}", "count": gpus}}
    return {"devices": {"requests": [req]}}


def pick(cases: Sequence[Any], top: int) -> dict[str, list[NodeCase]]:
    """Per shape, its ``top`` worst model cases (distinct machine and occupancy)."""
    by: dict[str, list[Any]] = {}
    for c in cases:
        by.setdefault(c.shape, []).append(c)
    out: dict[str, list[NodeCase]] = {}
    for shape, cs in by.items():
        cs.sort(key=lambda c: (c.capped, c.ms()), reverse=True)
        seen: list[NodeCase] = []
        for c in cs:
            nc = NodeCase(c.machine, c.occupancy, tuple(sorted(c.busy)))
            if nc not in seen:
                seen.append(nc)
            if len(seen) == top:
                break
        out[shape] = seen
    return out


def run_real(
    shapes: Mapping[str, Mapping[str, Any]], cases: Sequence[Any], machines: Sequence[str], top: int
) -> str:
    chosen = pick(cases, top)
    with worst_cluster() as wc:
        empties = [NodeCase(m, "empty", ()) for m in machines]
        wc.add_nodes([*empties, *(nc for ncs in chosen.values() for nc in ncs)])
        rows = [wc.measure("plain 2 GPUs", plain(2), nc) for nc in empties]
        for shape, ncs in chosen.items():
            rows += [wc.measure(shape, shapes[shape], nc) for nc in ncs]
    return real_table(rows)


def real_table(rows: Sequence[Measured]) -> str:
    worst: dict[str, Measured] = {}
    for r in rows:
        w = worst.get(r.shape)
        if w is None or r.ms > w.ms:
            worst[r.shape] = r
    head = ["shape", "worst on", "attempt ms", "attempts", "outcome"]
    body = [
        [s, f"{r.machine} {r.occupancy}", f"{r.ms:.1f}", str(r.attempts), r.outcome]
        for s, r in worst.items()
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(v.ljust(widths[i]) for i, v in enumerate(x)) for x in [head, *body]]
    return "\n".join(lines)
