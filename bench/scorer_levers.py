"""What-if probes for the scorer's levers on the mixed cluster (issue #15).

``bench/placement.py --cluster mixed --model reject`` compares the scorer with the careful
user at the scorer's shipped settings. This script replays the same streams with one lever
changed at a time and prints, per seed, the scorer's busbw as a multiple of the careful user's, its
GPU-hours minus theirs and its NIC locality — the three things the issue's target joins —
so a claim such as "no setting of X meets seed 4 without losing another seed" is a command,
not a sentence. The careful user's figures are the mean over ``--draws`` node orders, as in
placement.py.

Levers (module constants of ``scorer/``, restored after each row):

* ``WHOLE_NODE`` — the charge for breaking a whole free network-ready node;
* ``FRAGMENTATION_WEIGHT`` — the weight of what a set takes from the node's future blocks;
* ``FUTURE_SIZES`` — the future 2/4/8-GPU demand mix those blocks are valued for;
* ``NIC_FLOOR`` — the least NIC-locality weight of a request with NICs;
* ``runtime`` — not a shipped lever: every job's true run time scales its whole-node charge
  by ``(run time / median) ** a``. An oracle: it shows what knowing run times would buy.

Run: ``python3 bench/scorer_levers.py [--seeds 1-5] [--draws 40]`` (about 3 minutes on
2 cores). The last line is one JSON object ``{"baseline": {...}, "rows": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Run as a script, sys.path[0] is bench/, whose sibling bench/http.py would shadow the
# standard module: put the repository root in its place.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import scorer.score as score_mod
import scorer.search as search_mod
from bench.placement import (
    RUN_MEDIAN_S,
    Job,
    MixedNode,
    _seeds,
    build_mixed,
    mean_over_draws,
    mixed_stream,
    run_mixed,
)
from scorer.request import Request

Setting = tuple[Any, str, Any]
"""(module, constant name, value)."""


def _clear_caches() -> None:
    """The scorer caches node searches and block values on the node state, not on the
    constants: a changed constant needs fresh caches."""
    search_mod._NODE_CACHE.clear()
    score_mod._BLOCK_CACHE.clear()


@contextmanager
def patched(settings: Sequence[Setting]) -> Iterator[None]:
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in settings]
    for mod, name, value in settings:
        setattr(mod, name, value)
    _clear_caches()
    try:
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)
        _clear_caches()


def runtime_charge(runtimes: dict[str, float], scale: float, a: float) -> Setting:
    """The oracle lever: the whole-node charge of each request scaled by its job's true run
    time, ``scale × (run time / median) ** a``; ``runtimes`` (job name → seconds) is read
    at call time, so the caller refills it per stream."""
    inner = search_mod._whole_node_adjusted

    def adjusted(out: Any, nodes: Any, states: Any, req: Request) -> Any:
        run = runtimes.get(req.name or "")
        factor = (run / RUN_MEDIAN_S) ** a if run else 1.0
        before = search_mod.WHOLE_NODE
        search_mod.WHOLE_NODE = scale * factor
        try:
            return inner(out, nodes, states, req)
        finally:
            search_mod.WHOLE_NODE = before

    return (search_mod, "_whole_node_adjusted", adjusted)


def levers(runtimes: dict[str, float]) -> list[tuple[str, list[Setting]]]:
    rows: list[tuple[str, list[Setting]]] = [("shipped", [])]
    rows += [(f"WHOLE_NODE={w}", [(search_mod, "WHOLE_NODE", w)]) for w in (0.0, 1.5, 2.5)]
    rows += [
        (f"FRAGMENTATION_WEIGHT={f}", [(score_mod, "FRAGMENTATION_WEIGHT", f)])
        for f in (0.0, 0.01, 0.1)
    ]
    rows += [
        (f"FUTURE_SIZES={m}", [(score_mod, "FUTURE_SIZES", m)])
        for m in ({2: 0.4, 4: 0.4, 8: 0.2}, {2: 0.3, 4: 0.4, 8: 0.3})
    ]
    rows += [(f"NIC_FLOOR={f}", [(score_mod, "NIC_FLOOR", f)]) for f in (0.3, 0.2)]
    rows += [
        (f"runtime(scale={s}, a={a})", [runtime_charge(runtimes, s, a)])
        for s, a in ((0.5, 1.0), (1.0, 0.5), (2.0, 0.5))
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1-5")
    ap.add_argument("--draws", type=int, default=40, help="node orders for the careful user")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--load", type=float, default=0.7)
    args = ap.parse_args(argv)
    nodes: list[MixedNode] = build_mixed()
    total = sum(len(n.topo.gpus) for n in nodes)
    streams: dict[int, list[Job]] = {
        s: mixed_stream(args.jobs, total, args.load, s) for s in _seeds(args.seeds)
    }
    careful = {
        s: mean_over_draws("careful", nodes, jobs, s, args.draws) for s, jobs in streams.items()
    }
    print(
        "careful user: "
        + ", ".join(
            f"seed {s} {c['mean_busbw_gbps']:.1f} GB/s ± {c.get('mean_busbw_gbps_se', 0):.1f}, "
            f"{c['gpu_hours']:.1f} GPU-hours ± {c.get('gpu_hours_se', 0):.1f}"
            for s, c in careful.items()
        ),
        file=sys.stderr,
    )
    runtimes: dict[str, float] = {}  # the seed being replayed: job names repeat across seeds
    out_rows = []
    for label, settings in levers(runtimes):
        per_seed: dict[str, dict[str, float]] = {}
        with patched(settings):
            for s, jobs in streams.items():
                runtimes.clear()
                runtimes.update({j.req.name or "": j.duration for j in jobs})
                r = run_mixed("scorer", nodes, jobs, s)
                c = careful[s]
                per_seed[str(s)] = {
                    "busbw_x": round(r["mean_busbw_gbps"] / c["mean_busbw_gbps"], 3),
                    "gpu_hours_delta": round(r["gpu_hours"] - c["gpu_hours"], 1),
                    "nic_locality": r["nic_locality"],
                }
        met = [
            s
            for s, v in per_seed.items()
            if v["busbw_x"] >= 1.3 and v["gpu_hours_delta"] >= 0 and v["nic_locality"] >= 0.98
        ]
        cells = "  ".join(
            f"{v['busbw_x']:.3f}x/{v['gpu_hours_delta']:+.0f}h/{v['nic_locality']:.3f}"
            for v in per_seed.values()
        )
        print(f"{label:38s} {cells}  met: {','.join(met) or '-'}", file=sys.stderr)
        out_rows.append({"lever": label, "seeds": per_seed, "met": met})
    baseline = {
        str(s): {k: c.get(k) for k in ("mean_busbw_gbps", "mean_busbw_gbps_se", "gpu_hours")}
        for s, c in careful.items()
    }
    print(json.dumps({"baseline": baseline, "rows": out_rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
