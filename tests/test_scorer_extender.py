"""The extender over real loopback HTTP: kube-scheduler's ExtenderArgs in, its
ExtenderFilterResult / HostPriorityList out; graphs fetched from a node endpoint with ETag."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from scorer.extender import Extender, NodeGraphs, make_server
from scorer.request import PROFILE_ANNOTATION, Occupancy
from scorer.topology import GraphFetcher, rename_graph
from tests.scorer_support import machine


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
        NodeGraphs(static={"dgx-1": dgx, "pcie-1": pcie}),
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


def test_filter_keeps_nodes_that_fit_and_explains_the_rest(server: tuple[str, Extender]) -> None:
    url, _ = server
    args = {
        "pod": _pod({"gpus": 8, "nicsPerGpu": 1, "pattern": "tensor-parallel"}),
        "nodes": {"items": [_node("dgx-1"), _node("pcie-1"), _node("cpu-only")]},
    }
    out = _post(url + "/filter", args)
    assert [n["metadata"]["name"] for n in out["nodes"]["items"]] == ["dgx-1"]
    assert set(out["failedNodes"]) == {"pcie-1", "cpu-only"}
    assert "no topology graph" in out["failedNodes"]["cpu-only"]
    assert out["error"] == ""


def test_filter_by_name_and_label_constraint(server: tuple[str, Extender]) -> None:
    url, _ = server
    args = {
        "pod": _pod({"gpus": 1, "constraints": {"nodeLabels": {"tenant": "a"}}}),
        "nodenames": ["dgx-1", "pcie-1"],
    }
    out = _post(url + "/filter", args)
    # nodenames carry no labels: every node fails the compliance filter.
    assert out["nodenames"] == []
    assert "constraints" in out["failedNodes"]["dgx-1"]


def test_prioritize_ranks_nvswitch_above_pcie_for_tensor_parallel(
    server: tuple[str, Extender],
) -> None:
    url, _ = server
    args = {
        "pod": _pod({"gpus": 2, "pattern": "tensor-parallel", "bound": "communication"}),
        "nodes": {"items": [_node("pcie-1"), _node("dgx-1")]},
    }
    out = _post(url + "/prioritize", args)
    scores = {h["host"]: h["score"] for h in out}
    assert set(scores) == {"pcie-1", "dgx-1"}
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["dgx-1"] > scores["pcie-1"]


def test_workload_counts_come_from_the_claim_template(server: tuple[str, Extender]) -> None:
    _, ext = server
    pod = _pod({"pattern": "data-parallel"}, [{"name": "gpus", "resourceClaimTemplateName": "tp4"}])
    req = ext.workload(pod)
    assert req is not None and req.gpus == 4 and req.nics_per_gpu == 1
    assert ext.workload(_pod(None)) is None


def test_bad_annotation_is_an_error_not_a_crash(server: tuple[str, Extender]) -> None:
    url, _ = server
    args = {"pod": _pod({"gpus": 2, "pattern": "zigzag"}), "nodenames": ["dgx-1"]}
    out = _post(url + "/filter", args)
    assert "pattern" in out["error"]
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
