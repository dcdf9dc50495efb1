"""The extender over real loopback HTTP: kube-scheduler's ExtenderArgs in, its
ExtenderFilterResult / HostPriorityList out; graphs fetched from a node endpoint with ETag.

The real kube-scheduler sends Go field names (``Pod``, ``Nodes``, ``NodeNames``: the
extender/v1 types have no JSON tags); tests/data/extender/ holds its exact bodies, captured
from v1.36.2. Every verb is tested with both spellings (``SPELLINGS``), and the answers
must use the Go field names the scheduler's own types marshal to.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scorer.extender import Extender, NodeGraphs, make_server, wire_field
from scorer.request import PROFILE_ANNOTATION, Occupancy
from scorer.topology import GraphFetcher, rename_graph
from tests.scorer_support import machine

CAPTURED = Path(__file__).parent / "data" / "extender"
FILTER_RESULT_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def _captured(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CAPTURED / name).read_text())
    return data


def _spelled(args: dict[str, Any], spelling: str) -> dict[str, Any]:
    """``args`` with top-level keys as the real scheduler spells them (Go field names)
    or in the lowercase older docs and hand-written clients use."""
    go = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}
    if spelling == "go":
        return {go.get(k.lower(), k): v for k, v in args.items()}
    return {k.lower(): v for k, v in args.items()}


SPELLINGS = ["go", "lowercase"]


def _node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]},
    }


def _pod(annotation: dict[str, Any] | None, claims: list[dict[str, Any]] | None = None) -> dict:
    meta: dict[str, Any] = {"name": "p", "namespace": "ml"}
    if annotation is not None:
        meta["annotations"] = {PROFILE_ANNOTATION: json.dumps(annotation)}
    return {"metadata": meta, "spec": {"resourceClaims": claims or []}}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Extender]]:
    dgx = rename_graph(machine("dgx-h100").graph, "dgx-1")
    pcie = rename_graph(machine("pcie-8gpu").graph, "pcie-1")
    templates = {
        ("ResourceClaimTemplate", "ml", "tp4"): {
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "g",
                                "exactly": {"deviceClassName": "gpu.toposlice.dev", "count": 4},
                            },
                            {
                                "name": "n",
                                "exactly": {"deviceClassName": "nic.toposlice.dev", "count": 4},
                            },
                        ]
                    }
                }
            }
        }
    }
    occ = Occupancy(allocated={"pcie-1": {"gpu-0000-18-00-0"}})
    ext = Extender(
        NodeGraphs(
            static={
                "dgx-1": dgx,
                "pcie-1": pcie,
                # the node names of the captured bodies
                "node-a": rename_graph(machine("pcie-8gpu").graph, "node-a"),
                "node-b": rename_graph(machine("dgx-h100").graph, "node-b"),
            }
        ),
        reader=lambda kind, ns, name: templates.get((kind, ns, name)),
        occupancy=lambda: occ,
    )
    srv = make_server(ext, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", ext
    srv.shutdown()
    srv.server_close()


def _post(url: str, body: Any) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_filter_keeps_nodes_that_fit_and_explains_the_rest(
    server: tuple[str, Extender], spelling: str
) -> None:
    url, _ = server
    args = {
        "Pod": _pod({"gpus": 8, "nicsPerGpu": 1, "pattern": "tensor-parallel"}),
        "Nodes": {"items": [_node("dgx-1"), _node("pcie-1"), _node("cpu-only")]},
        "NodeNames": None,
    }
    out = _post(url + "/filter", _spelled(args, spelling))
    assert set(out) == FILTER_RESULT_KEYS
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["dgx-1"]
    assert out["NodeNames"] is None
    assert set(out["FailedNodes"]) == {"pcie-1", "cpu-only"}
    assert "no topology graph" in out["FailedNodes"]["cpu-only"]
    assert out["Error"] == ""


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_filter_by_name_and_label_constraint(server: tuple[str, Extender], spelling: str) -> None:
    url, _ = server
    args = {
        "Pod": _pod({"gpus": 1, "constraints": {"nodeLabels": {"tenant": "a"}}}),
        "Nodes": None,
        "NodeNames": ["dgx-1", "pcie-1"],
    }
    out = _post(url + "/filter", _spelled(args, spelling))
    # nodenames carry no labels: every node fails the compliance filter.
    assert out["NodeNames"] == [] and out["Nodes"] is None
    assert "constraints" in out["FailedNodes"]["dgx-1"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_prioritize_ranks_nvswitch_above_pcie_for_tensor_parallel(
    server: tuple[str, Extender], spelling: str
) -> None:
    url, _ = server
    args = {
        "Pod": _pod({"gpus": 2, "pattern": "tensor-parallel", "bound": "communication"}),
        "Nodes": {"items": [_node("pcie-1"), _node("dgx-1")]},
    }
    out = _post(url + "/prioritize", _spelled(args, spelling))
    assert all(set(h) == {"Host", "Score"} for h in out)
    scores = {h["Host"]: h["Score"] for h in out}
    assert set(scores) == {"pcie-1", "dgx-1"}
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["dgx-1"] > scores["pcie-1"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_real_scheduler_bodies(server: tuple[str, Extender], spelling: str) -> None:
    """The bodies kube-scheduler v1.36.2 sent (tests/data/extender/): node-a is a PCIe
    machine, node-b an NVSwitch one; the pod asks 2 tensor-parallel GPUs."""
    url, _ = server
    filter_nodes = _captured("filter-nodes.json")
    assert set(filter_nodes) == {"Pod", "Nodes", "NodeNames"}  # what the scheduler sends
    out = _post(url + "/filter", _spelled(filter_nodes, spelling))
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["node-a", "node-b"]
    assert out["FailedNodes"] == {} and out["Error"] == ""
    # The Nodes handed back are the scheduler's own objects, unchanged.
    assert out["Nodes"]["items"] == filter_nodes["Nodes"]["items"]

    by_name = _post(url + "/filter", _spelled(_captured("filter-nodenames.json"), spelling))
    assert by_name["NodeNames"] == ["node-a", "node-b"] and by_name["Nodes"] is None

    ranked = _post(url + "/prioritize", _spelled(_captured("prioritize-nodes.json"), spelling))
    scores = {h["Host"]: h["Score"] for h in ranked}
    assert scores["node-b"] > scores["node-a"]


def test_exact_keys_win_over_other_casings() -> None:
    """Go's decoder prefers the exact field name; the extender reads keys the same way."""
    assert wire_field({"pod": 1, "Pod": 2}, "Pod") == 2
    assert wire_field({"POD": 3}, "Pod") == 3
    assert wire_field({"nodes": None}, "NodeNames") is None


def test_workload_counts_come_from_the_claim_template(server: tuple[str, Extender]) -> None:
    _, ext = server
    pod = _pod({"pattern": "data-parallel"}, [{"name": "gpus", "resourceClaimTemplateName": "tp4"}])
    req = ext.workload(pod)
    assert req is not None and req.gpus == 4 and req.nics_per_gpu == 1
    assert ext.workload(_pod(None)) is None


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_bad_annotation_is_an_error_not_a_crash(
    server: tuple[str, Extender], spelling: str
) -> None:
    url, _ = server
    args = {"Pod": _pod({"gpus": 2, "pattern": "zigzag"}), "NodeNames": ["dgx-1"]}
    out = _post(url + "/filter", _spelled(args, spelling))
    assert set(out) == FILTER_RESULT_KEYS
    assert "pattern" in out["Error"]
    bad = urllib.request.Request(url + "/filter", data=b"[1,2", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(bad, timeout=10)
    assert err.value.code == 400
    with urllib.request.urlopen(url + "/healthz", timeout=10) as resp:
        assert resp.status == 200


def test_graph_fetcher_revalidates_by_etag() -> None:
    graph = rename_graph(machine("pcie-8gpu").graph, "n1")
    body = json.dumps(graph).encode()
    seen: list[str | None] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("If-None-Match"))
            if self.headers.get("If-None-Match") == '"v1"':
                self.send_response(304)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("ETag", '"v1"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        f = GraphFetcher()
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1/topology"
        first = f.get(url)
        second = f.get(url)
        assert first is second and first["node"] == "n1"
        assert seen == [None, '"v1"']
    finally:
        srv.shutdown()
        srv.server_close()
    # The endpoint is gone: the last good graph is still served.
    assert f.get(url)["node"] == "n1"
    with pytest.raises(ValueError):
        GraphFetcher(timeout_s=0.5).get(url)
