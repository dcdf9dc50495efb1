"""``toposlice score`` end to end on fake machines and graph files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scorer.allocator import Allocator
from tests.scorer_support import machine
from toposlice.cli import main

REQ = {"name": "tp2", "gpus": 2, "nicsPerGpu": 1, "cpus": 8, "pattern": "tensor-parallel"}


def _write(tmp_path: Path, name: str, doc: object) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def _json_out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_json_shape_best_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = _write(tmp_path, "req.yaml", REQ)
    out = _json_out(
        capsys,
        ["score", "--request", req, "--fake", "pcie-8gpu", "--fake", "dgx-h100", "-o", "json"],
    )
    ps = out["placements"]
    assert ps and all(set(p) >= {"node", "devices", "score", "parts"} for p in ps)
    scores = [p["score"] for p in ps]
    assert scores == sorted(scores, reverse=True)
    best = ps[0]
    assert best["node"] == "dgx-h100"
    assert sum(d.startswith("gpu-") for d in best["devices"]) == 2
    assert sum(d.startswith("nic-") for d in best["devices"]) == 2
    assert {"bandwidth", "nic_locality", "cpu_locality", "contention", "fragmentation"} <= set(
        best["parts"]
    )


def test_devices_scores_a_given_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = tmp_path / "pcie.json"
    g.write_text(json.dumps(machine("pcie-8gpu").graph))
    req = _write(tmp_path, "req.yaml", {"gpus": 2, "pattern": "tensor-parallel"})
    base = ["score", "--request", req, "--graph", str(g), "-o", "json", "--devices"]
    same = _json_out(capsys, [*base, "gpu-0000-18-00-0,gpu-0000-19-00-0"])["placements"][0]
    far = _json_out(capsys, [*base, "gpu-0000-18-00-0,gpu-0000-9a-00-0"])["placements"][0]
    assert same["parts"]["busbw_gbps"] == 24.0
    assert far["parts"]["busbw_gbps"] == 22.0
    assert same["score"] > far["score"]


def test_emit_claim_lands_on_the_chosen_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    req = _write(tmp_path, "req.yaml", REQ)
    occ = _write(tmp_path, "occ.yaml", {"allocated": {"pcie-8gpu": ["gpu-0000-18-00-0"]}})
    claim = tmp_path / "claim.yaml"
    out = _json_out(
        capsys,
        [
            "score",
            "--request",
            req,
            "--fake",
            "pcie-8gpu",
            "--occupancy",
            occ,
            "-o",
            "json",
            "--emit-claim",
            str(claim),
        ],
    )
    chosen = out["placements"][0]["devices"]
    assert "gpu-0000-18-00-0" not in chosen
    doc = yaml.safe_load(claim.read_text())
    assert doc["kind"] == "List"
    kinds = [(i["apiVersion"], i["kind"]) for i in doc["items"]]
    assert kinds[0] == ("resource.k8s.io/v1", "ResourceClaimTemplate")
    classes = [i for i in doc["items"] if i["kind"] == "DeviceClass"]
    assert {c["metadata"]["name"] for c in classes} == {
        "gpu.toposlice.dev",
        "nic.toposlice.dev",
        "cpu.toposlice.dev",
    }
    m = machine("pcie-8gpu")
    got = Allocator(m.slices, classes, "pcie-8gpu").allocate(
        doc["items"][0]["spec"]["spec"], [("toposlice.dev", "pcie-8gpu", "gpu-0000-18-00-0")]
    )
    assert got is not None
    assert sorted(r.device for r in got) == sorted(chosen)


def test_table_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = _write(tmp_path, "req.yaml", {"gpus": 2, "pattern": "inference-decode"})
    assert main(["score", "--request", req, "--fake", "mi300x-8", "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("#1  score") and "busbw 48.0 GB/s" in text
    bad = _write(tmp_path, "bad.yaml", {"gpus": 2, "patern": "x"})
    assert main(["score", "--request", bad, "--fake", "mi300x-8"]) == 2
    assert "unknown key 'patern'" in capsys.readouterr().err
    huge = _write(tmp_path, "huge.yaml", {"gpus": 64})
    assert main(["score", "--request", huge, "--fake", "mi300x-8"]) == 1
    assert "no placement" in capsys.readouterr().err
