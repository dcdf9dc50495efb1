"""One node name everywhere: with ``--node-name`` different from the host name, ``slices``,
``graph``, ``serve`` (its /v1/topology and page) and the scorer all say the same node and
pool, so the scorer's occupancy (matched by pool) sees the devices claims hold."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from normalize.slices import build_slices
from normalize.snapshot import build_snapshot
from scorer.request import Occupancy, Request
from scorer.score import NodeState
from scorer.topology import from_graph
from tests.exporter_view import serving_url
from toposlice.cli import main
from toposlice.discover import discover

REPO = Path(__file__).resolve().parent.parent
NODE = "node-a"  # the fake machines' host names are their machine names


def test_slices_graph_and_scorer_agree_on_node_and_pool() -> None:
    inv = discover("/", fake="dgx-h100")
    assert inv.hostname != NODE
    snap = build_snapshot(inv, NODE)
    assert (snap.graph["node"], snap.graph["dra"]["pool"]) == (NODE, NODE)
    pools = {s["spec"]["pool"]["name"] for s in build_slices(inv, NODE)}
    assert pools == {NODE}
    topo = from_graph(snap.graph)
    assert (topo.name, topo.pool) == (NODE, NODE)
    # A claim's allocation result names the pool the slices publish: the scorer sees it.
    held = topo.gpus[0].dra_device
    occ = Occupancy()
    occ.add_claim(
        {"status": {"allocation": {"devices": {"results": [{"pool": NODE, "device": held}]}}}}
    )
    free = {g.dra_device for g in NodeState(topo, occ, Request(gpus=1)).free_gpus}
    assert held not in free and len(free) == len(topo.gpus) - 1


def test_graph_command_follows_node_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", "--fake", "cpu-2s", "--node-name", NODE, "-o", "json"]) == 0
    graph = json.loads(capsys.readouterr().out)
    assert (graph["node"], graph["dra"]["pool"]) == (NODE, NODE)
    assert main(["slices", "--fake", "cpu-2s", "--node-name", NODE]) == 0
    slices = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {s["spec"]["pool"]["name"] for s in slices} == {NODE}
    # Without --node-name: the host's name, as before.
    assert main(["graph", "--fake", "cpu-2s", "-o", "json"]) == 0
    graph = json.loads(capsys.readouterr().out)
    assert (graph["node"], graph["dra"]["pool"]) == ("cpu-2s", "cpu-2s")


def test_slices_and_graph_take_node_name_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In the plugin's pod (NODE_NAME from the downward API), `slices` prints what `run`
    publishes there, and `graph` names the same node and pool; the flag still wins."""
    monkeypatch.setenv("NODE_NAME", NODE)
    assert main(["slices", "--fake", "cpu-2s"]) == 0
    slices = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {s["spec"]["pool"]["name"] for s in slices} == {NODE}
    assert {s["spec"]["nodeName"] for s in slices} == {NODE}
    assert main(["graph", "--fake", "cpu-2s", "-o", "json"]) == 0
    graph = json.loads(capsys.readouterr().out)
    assert (graph["node"], graph["dra"]["pool"]) == (NODE, NODE)
    assert main(["graph", "--fake", "cpu-2s", "--node-name", "node-b", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["node"] == "node-b"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
        return body


@pytest.mark.parametrize("given", ["flag", "env"])
def test_serve_publishes_node_pool_names_and_health(tmp_path: Path, given: str) -> None:
    """The node name from --node-name, or from $NODE_NAME (as a DaemonSet sets it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    flag = ["--node-name", NODE] if given == "flag" else []
    if given == "env":
        env["NODE_NAME"] = NODE
    proc = subprocess.Popen(
        [sys.executable, "-m", "toposlice", "serve", "--fake", "cpu-2s", *flag,
         "--http-addr", "127.0.0.1:0", "--discover-in-process"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        url = serving_url(proc, deadline)
        while True:
            try:
                doc = json.loads(_get(f"{url}/v1/topology"))
                break
            except urllib.error.HTTPError as exc:  # 503 until the first discovery
                assert exc.code == 503 and time.monotonic() < deadline
                time.sleep(0.1)
        assert (doc["node"], doc["dra"]["pool"]) == (NODE, NODE)
        page = _get(f"{url}/").decode()
        rows = re.findall(r"<tr data-vertex='([^']+)'>(.*?)</tr>", page)
        devices = {
            v["id"]: v["attrs"]["dra_device"]
            for v in doc["vertices"]
            if v["kind"] in ("gpu", "nic", "cpu_group")
        }
        assert rows and {vid for vid, _ in rows} == set(devices)
        for vid, row in rows:
            assert f"toposlice.dev/{NODE}/{devices[vid]}" in row, row
            assert "(not published)" in row and row.endswith("<td>Healthy</td>"), row
    finally:
        proc.terminate()
        proc.wait(30)


def test_doctor_takes_node_name_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["slices", "--fake", "cpu-2s", "--node-name", NODE]) == 0
    own = tmp_path / "own.yaml"
    own.write_text(capsys.readouterr().out)
    doctor = ["doctor", "--fake", "cpu-2s", "--slices", str(own), "-o", "json"]
    assert main(doctor) == 2  # the host's name: another node's slices
    assert "--node-name" in capsys.readouterr().err
    monkeypatch.setenv("NODE_NAME", NODE)
    assert main(doctor) == 0
    assert json.loads(capsys.readouterr().out)["node"] == NODE
    monkeypatch.setenv("NODE_NAME", "Bad_Name")  # the flag wins; the variable is not read
    assert main([*doctor, "--node-name", NODE]) == 0
    assert json.loads(capsys.readouterr().out)["node"] == NODE
    monkeypatch.setenv("NODE_NAME", "")  # empty: unset, as for run
    assert main(doctor) == 2
