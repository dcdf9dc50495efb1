"""The placement bench scripts run end to end on a small stream: their figures are what the
issue closing notes quote, so a script that no longer runs (or leaves the scorer's constants
changed behind it) must fail here, not when somebody next wants a figure. The queue model's
backfill rule is checked on a hand-made stream."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_queue_model_reports_every_policy_both_hint_settings_and_the_targets() -> None:
    out, err = _run(
        "placement.py", "--cluster", "mixed", "--jobs", "40", "--seeds", "2", "--draws", "2"
    )
    assert out["model"] == "queue" and set(out["runs"]) == {"hints", "no_hints"}
    for run in out["runs"].values():
        seed = run["seeds"]["2"]
        assert set(seed) == {"scorer", "ladder", "careful", "plain", "first-fit"}
        for name, fig in seed.items():
            assert fig["jobs"] == 40 and fig["unplaced"] == 0, name
            assert 0 < fig["mean_wait_s"] + 1 and fig["mean_jct_s"] > 0, name
            assert fig["p95_jct_s"] >= fig["mean_wait_s"], name
            assert 0.0 < fig["useful_utilisation"] <= 1.0, name
            assert fig["mean_stretch"] >= 1.0, name
            has_se = name in ("ladder", "careful", "plain")
            assert ("mean_jct_s_se" in fig) is has_se, name
            if has_se:
                assert math.isfinite(fig["mean_jct_s_se"]) and fig["mean_jct_s_se"] >= 0
        assert set(run["targets"]["met"]) == {
            "scorer_mean_jct",
            "scorer_p95_jct",
            "scorer_utilisation",
            "ladder_mean_jct",
        }
    assert "[hints] seed 2 targets: scorer mean JCT" in err and " ± " in err
    assert set(out["targets_met"]) == set(out["runs"]["hints"]["targets"]["met"])


@pytest.mark.parametrize("draws", ["1", "3"])
def test_rejection_model_reports_every_policy_with_standard_errors(draws: str) -> None:
    out, err = _run(
        "placement.py",
        "--cluster",
        "mixed",
        "--model",
        "reject",
        "--jobs",
        "40",
        "--seeds",
        "2",
        "--draws",
        draws,
    )
    seed = out["seeds"]["2"]
    assert set(seed) == {"scorer", "ladder", "careful", "plain"}
    for name, fig in seed.items():
        assert fig["admitted"] <= 40 and fig["gpu_hours"] > 0, name
        assert 0.0 < fig["nic_locality"] <= 1.0, name
        # a standard error only where there is more than one node order to take it over
        has_se = name != "scorer" and draws != "1"
        assert ("gpu_hours_se" in fig) is has_se, name
        if has_se:
            assert math.isfinite(fig["gpu_hours_se"]) and fig["gpu_hours_se"] >= 0
    assert "seed 2 targets: scorer busbw" in err and " ± " in err


def test_easy_backfill_keeps_the_heads_reservation() -> None:
    """One DGX: A holds 6 GPUs for 100 s; B (8 GPUs) waits for it and reserves the node
    from t=100; C (2 GPUs, 50 s) may start before that, D (2 GPUs, 500 s) may not."""
    from bench.queue_sim import Decision, SimJob, View, simulate
    from scorer.request import Request
    from scorer.search import place
    from scorer.topology import from_graph, rename_graph
    from tests.scorer_support import machine

    dgx = from_graph(rename_graph(machine("dgx-h100").graph, "dgx"))

    def first(job: SimJob, view: View) -> Decision:
        found = place(view.nodes, view.occ, job.req, top=1)
        return Decision(found[0] if found else None)

    def job(i: int, t: float, gpus: int, run: float) -> SimJob:
        return SimJob(i, t, run, Request(gpus=gpus, name=f"j{i}"), run)

    jobs = [job(0, 0.0, 6, 100.0), job(1, 1.0, 8, 10.0), job(2, 2.0, 2, 50.0)]
    jobs.append(job(3, 3.0, 2, 500.0))
    res = simulate([dgx], jobs, first, hints=True)
    start = {s.job.id: s.start for s in res.started}
    assert start[0] == 0.0 and start[2] == 2.0  # C backfilled: it ends before t=100
    assert start[1] == 100.0  # the head started at its reservation
    assert start[3] == 110.0  # D could have started at 3 but would have delayed the head


def test_levers_script_restores_the_scorer_constants() -> None:
    import scorer.score as score_mod
    import scorer.search as search_mod

    out, _ = _run("scorer_levers.py", "--jobs", "40", "--seeds", "2", "--draws", "2")
    rows = {r["lever"]: r for r in out["rows"]}
    assert "shipped" in rows and "WHOLE_NODE=0.0" in rows and "NIC_FLOOR=0.2" in rows
    assert any(k.startswith("runtime(") for k in rows)
    for r in rows.values():
        assert set(r["seeds"]) == {"2"} and r["seeds"]["2"]["busbw_x"] > 0
    # In-process: the context manager puts every constant back, caches cleared.
    from bench.scorer_levers import patched

    before = (search_mod.WHOLE_NODE, score_mod.FRAGMENTATION_WEIGHT, score_mod.NIC_FLOOR)
    with patched([(search_mod, "WHOLE_NODE", 9.0), (score_mod, "NIC_FLOOR", 0.0)]):
        assert (search_mod.WHOLE_NODE, score_mod.NIC_FLOOR) == (9.0, 0.0)
    assert (search_mod.WHOLE_NODE, score_mod.FRAGMENTATION_WEIGHT, score_mod.NIC_FLOOR) == before


def test_large_cluster_rejection_model_prints_its_figures() -> None:
    """``--model reject`` on the large cluster (issue #34: it died with UnboundLocalError on
    the first admitted job, the memory-bound flag of the departure heap never set)."""
    out, err = _run("placement.py", "--model", "reject", "--jobs", "120")
    assert set(out["policies"]) == {"scorer", "first-fit", "random"}
    for name, fig in out["policies"].items():
        assert fig["jobs"] == 120 and 0 < fig["admitted"] <= 120, name
        assert fig["gpu_hours"] > 0 and fig["mean_busbw_gbps"] > 0, name
        assert 0.0 <= fig["stranded_gpu_frac"] <= 1.0, name
    assert "targets: admitted" in err and "busbw ratio" in err


def test_rejection_model_releases_memory_bound_marks_with_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A departing job frees its devices and, when it was memory bound, their memory-bound
    marks; a compute job admitted after a memory-bound one departed is not marked."""
    import bench.placement as bp
    from scorer.request import Occupancy, Request
    from scorer.topology import from_graph, rename_graph
    from tests.scorer_support import machine

    made: list[Occupancy] = []

    class Recording(Occupancy):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(bp, "Occupancy", Recording)
    dgx = from_graph(rename_graph(machine("dgx-h100").graph, "dgx"))

    def job(i: int, t: float, run: float, bound: str) -> bp.Job:
        return bp.Job(i, t, run, Request(gpus=1, bound=bound, name=f"j{i}"))

    # A (memory) leaves at 10, B (compute) arrives after it, C (memory) outlives the stream.
    jobs = [job(0, 0.0, 10.0, "memory"), job(1, 20.0, 10.0, "compute")]
    jobs += [job(2, 40.0, 1000.0, "memory"), job(3, 50.0, 5.0, "compute")]
    for policy in ("scorer", "first-fit", "random"):
        made.clear()
        fig = bp.run_policy(policy, [dgx], jobs, seed=1)
        assert fig["admitted"] == 4, policy
        (occ,) = made
        allocated = occ.allocated.get(dgx.pool, set())
        marked = occ.memory_bound.get(dgx.pool, set())
        # C and D still hold a GPU each; only C's is memory bound
        assert len(allocated) == 2 and len(marked) == 1 and marked < allocated, policy


def _bench_imports(path: Path) -> set[str]:
    """The bench modules PATH imports anywhere in it (functions included)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "bench":
                found.update(a.name for a in node.names)
            elif node.module.startswith("bench."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("bench."))
    return found


def test_bench_scripts_import_each_other_without_a_cycle() -> None:
    """bench/placement.py uses bench/queue_sim.py, never the other way round (issue #34: each
    imported the other), and neither (nor bench/scorer_levers.py, built on them) imports
    itself back through other bench modules."""
    graph = {p.stem: _bench_imports(p) for p in sorted((REPO / "bench").glob("*.py"))}
    assert "queue_sim" in graph["placement"]
    assert "placement" not in graph["queue_sim"]

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            mod, path = stack.pop()
            for dep in graph.get(mod, set()):
                if dep == start:
                    return [*path, dep]
                if dep not in seen:
                    seen.add(dep)
                    stack.append((dep, [*path, dep]))
        return None

    cycles = [c for m in ("placement", "queue_sim", "scorer_levers") if (c := cycle_from(m))]
    assert not cycles, cycles


def test_queue_simulator_runs_and_reports_without_the_placement_bench() -> None:
    """In a fresh interpreter: simulate + metrics (NIC locality included) never load
    bench.placement."""
    code = """
import sys
from bench.queue_sim import Decision, SimJob, metrics, scorer_decision, simulate
from scorer.request import Request
from scorer.topology import from_graph, rename_graph
from tests.scorer_support import machine

dgx = from_graph(rename_graph(machine("dgx-h100").graph, "dgx"))
jobs = [SimJob(i, float(i), 100.0, Request(gpus=2, nics_per_gpu=1, name=f"j{i}"), 100.0)
        for i in range(3)]
fig = metrics(simulate([dgx], jobs, scorer_decision, hints=True), [dgx])
assert fig["jobs"] == 3 and 0.0 < fig["nic_locality"] <= 1.0, fig
assert "bench.placement" not in sys.modules, sorted(m for m in sys.modules if "bench" in m)
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
