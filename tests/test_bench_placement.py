"""The placement bench scripts run end to end on a small stream: their figures are what the
issue closing notes quote, so a script that no longer runs (or leaves the scorer's constants
changed behind it) must fail here, not when somebody next wants a figure."""

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


@pytest.mark.parametrize("draws", ["1", "3"])
def test_mixed_cluster_reports_every_policy_with_standard_errors(draws: str) -> None:
    out, err = _run(
        "placement.py", "--cluster", "mixed", "--jobs", "40", "--seeds", "2", "--draws", draws
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
