"""The extender over real loopback HTTP: kube-scheduler's ExtenderArgs in, its
ExtenderFilterResult / HostPriorityList out; its cluster cache fed as the informers feed
it (tests/e2e/test_scorer_informers.py runs the informers on the real API server); graphs
fetched in the background from a real exporter, with ETag and keep-alive.

The real kube-scheduler sends Go field names (``Pod``, ``Nodes``, ``NodeNames``: the
extender/v1 types have no JSON tags); tests/data/extender/ holds its exact bodies, captured
from v1.36.2. Every verb is tested with both spellings (``SPELLINGS``), and the answers
must use the Go field names the scheduler's own types marshal to.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.exporter.http_server import HttpServer
from scorer.cluster_cache import ClusterCache, claim_counts
from scorer.extender import Extender, wire_field
from scorer.extender_server import ExtenderServer
from scorer.graph_source import GraphSource
from scorer.request import PROFILE_ANNOTATION
from scorer.topology import GraphFetcher, rename_graph
from tests.exporter_view import View, snapshot_of
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


TP4_TEMPLATE = {
    "metadata": {"namespace": "ml", "name": "tp4"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "g", "exactly": {"deviceClassName": "gpu.toposlice.dev", "count": 4}},
                    {"name": "n", "exactly": {"deviceClassName": "nic.toposlice.dev", "count": 4}},
                ]
            }
        }
    },
}


def _allocated(name: str, pool: str, devices: list[str]) -> dict[str, Any]:
    """A ResourceClaim as the API server holds it once allocated."""
    results = [
        {"request": "g", "driver": "toposlice.dev", "pool": pool, "device": d} for d in devices
    ]
    return {
        "metadata": {"namespace": "ml", "name": name, "resourceVersion": "1"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _cache() -> ClusterCache:
    cache = ClusterCache(
        "toposlice.dev",
        GraphSource(
            static={
                "dgx-1": rename_graph(machine("dgx-h100").graph, "dgx-1"),
                "pcie-1": rename_graph(machine("pcie-8gpu").graph, "pcie-1"),
                # the node names of the captured bodies
                "node-a": rename_graph(machine("pcie-8gpu").graph, "node-a"),
                "node-b": rename_graph(machine("dgx-h100").graph, "node-b"),
            }
        ),
    )
    cache.apply("ResourceClaimTemplate", "ADDED", TP4_TEMPLATE)
    cache.apply("ResourceClaim", "ADDED", _allocated("taken", "pcie-1", ["gpu-0000-18-00-0"]))
    cache.apply("Node", "ADDED", {"metadata": {"name": "dgx-1", "labels": {"tenant": "a"}}})
    cache.apply("Node", "ADDED", {"metadata": {"name": "pcie-1", "labels": {"tenant": "b"}}})
    return cache


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Extender]]:
    ext = Extender(_cache())
    with ExtenderServer("127.0.0.1:0", ext) as srv:
        yield srv.url, ext


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
    # Names only (nodeCacheCapable): the labels come from the Node informer's cache.
    assert out["NodeNames"] == ["dgx-1"] and out["Nodes"] is None
    assert "constraints" in out["FailedNodes"]["pcie-1"]


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


def test_placements_are_cached_until_the_node_occupancy_changes() -> None:
    cache = _cache()
    ext = Extender(cache)
    args = {"Pod": _pod({"gpus": 8}), "NodeNames": ["dgx-1", "node-b", "pcie-1"]}
    first = ext.filter(args)
    assert first["NodeNames"] == ["dgx-1", "node-b"]  # pcie-1 has one GPU taken
    searches = ext.searches
    assert searches <= 2  # dgx-1 and node-b are the same hardware, equally empty
    assert ext.filter(args) == first and ext.searches == searches  # served from the cache
    # A claim allocated on dgx-1 invalidates dgx-1 only.
    cache.apply("ResourceClaim", "ADDED", _allocated("c1", "dgx-1", ["gpu-0000-1b-00-0"]))
    second = ext.filter(args)
    assert second["NodeNames"] == ["node-b"]
    assert "no 8-GPU placement" in second["FailedNodes"]["dgx-1"]
    assert ext.searches == searches + 1
    cache.apply("ResourceClaim", "DELETED", _allocated("c1", "dgx-1", ["gpu-0000-1b-00-0"]))
    assert ext.filter(args)["NodeNames"] == ["dgx-1", "node-b"]
    # Released again: the same occupancy as before, found in the shared results.
    assert ext.searches == searches + 1


def test_graphs_fetched_in_the_background_with_etag_and_keep_alive() -> None:
    view = View(snapshot_of("pcie-8gpu", "gpu-node"))
    with HttpServer("127.0.0.1:0", view) as exporter:
        graphs = GraphSource(url_template=exporter.url + "/v1/topology", workers=1).start()
        try:
            graphs.want("gpu-node", "127.0.0.1")
            first = _wait(lambda: graphs.topology("gpu-node"))
            graphs.want("gpu-node", "127.0.0.1")  # its slices changed: revalidate
            _wait(lambda: graphs.stats.requests == 2 and graphs.idle())
            assert graphs.stats.fetched == 1 and graphs.stats.not_modified == 1
            assert graphs.topology("gpu-node") is first  # 304: the same view, not rebuilt
            assert exporter.stats.requests[("/v1/topology", 304)] == 1
            assert exporter.stats.connections == 1  # one kept-alive connection
        finally:
            graphs.stop()


def test_a_hung_node_endpoint_does_not_slow_a_call() -> None:
    """One node's exporter accepts connections and never answers: the call is answered
    from what is cached at once, that node filtered out with the reason."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    port = hung.getsockname()[1]
    graphs = GraphSource(
        static={"dgx-1": rename_graph(machine("dgx-h100").graph, "dgx-1")},
        url_template=f"http://127.0.0.1:{port}/{{node}}/v1/topology",
        read_timeout_s=30.0,
    ).start()
    try:
        cache = ClusterCache("toposlice.dev", graphs)
        graphs.want("hung-1", None)
        _wait(lambda: not graphs.idle() and graphs.stats.requests == 1)  # the fetch hangs
        with ExtenderServer("127.0.0.1:0", Extender(cache)) as srv:
            t0 = time.monotonic()
            out = _post(
                srv.url + "/filter", {"Pod": _pod({"gpus": 2}), "NodeNames": ["dgx-1", "hung-1"]}
            )
            elapsed = time.monotonic() - t0
        assert out["NodeNames"] == ["dgx-1"]
        assert out["FailedNodes"]["hung-1"] == "no topology graph for this node yet (fetching)"
        assert elapsed < 5.0  # far below the 30 s the fetch may hang
    finally:
        graphs.stop()
        hung.close()


def test_verbs_answer_405_to_get_and_probes_follow_the_informers() -> None:
    waiting = {"ok": False}
    ext = Extender(ClusterCache())
    ready = lambda: (True, "ok") if waiting["ok"] else (False, "informers not synced: Node")  # noqa: E731
    with ExtenderServer("127.0.0.1:0", ext, ready=ready) as srv:
        for verb in ("filter", "prioritize"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{srv.url}/{verb}", timeout=10)
            assert err.value.code == 405 and err.value.headers["Allow"] == "POST"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{srv.url}/nothing", timeout=10)
        assert err.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{srv.url}/readyz", timeout=10)
        assert err.value.code == 503 and b"Node" in err.value.read()
        waiting["ok"] = True
        with urllib.request.urlopen(f"{srv.url}/readyz", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{srv.url}/metrics", timeout=10) as resp:
            assert b"toposlice_extender_call_seconds" in resp.read()


def _wait(fn: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not reached")


class _Unsynced:
    """An informer still in its first LIST (the scorer just started)."""

    name = "ResourceClaim"

    def __init__(self) -> None:
        self.synced = threading.Event()


def _tp4_pod(claim: str | None = None) -> dict[str, Any]:
    pod = _pod({"pattern": "tensor-parallel"}, [{"name": "c", "resourceClaimTemplateName": "tp4"}])
    if claim:
        pod["status"] = {"resourceClaimStatuses": [{"name": "c", "resourceClaimName": claim}]}
    return pod


def test_filter_before_the_informers_listed_is_an_error_not_a_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the first LIST the cache knows no claim: passing every node as if the pod
    asked for nothing is what let a tensor-parallel pod land on PCIe right after a start."""
    import scorer.extender as extender

    monkeypatch.setattr(extender, "SYNC_WAIT_S", 0.05)
    cache = _cache()
    informer = _Unsynced()
    cache.informers.append(informer)  # type: ignore[arg-type]
    ext = Extender(cache)
    out = ext.filter({"Pod": _tp4_pod(), "NodeNames": ["dgx-1", "pcie-1"]})
    assert out["NodeNames"] == [] and "not ready" in out["Error"], out
    assert "ResourceClaim" in out["Error"]
    assert all(p["Score"] == 0 for p in ext.prioritize({"Pod": _tp4_pod(), "NodeNames": ["dgx-1"]}))
    # Listed while a call waits: that call answers from the cache.
    monkeypatch.setattr(extender, "SYNC_WAIT_S", 5.0)
    threading.Timer(0.1, informer.synced.set).start()
    out = ext.filter({"Pod": _tp4_pod(), "NodeNames": ["dgx-1", "pcie-1"]})
    assert out["Error"] == "" and out["NodeNames"] == ["dgx-1", "pcie-1"], out


def test_a_claim_the_cache_has_not_seen_yet_is_waited_for_then_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import scorer.extender as extender

    cache = _cache()
    ext = Extender(cache)
    pod = _pod({"pattern": "tensor-parallel"}, [{"name": "c", "resourceClaimName": "late"}])
    body = _allocated("late", "elsewhere", [])
    body["spec"] = TP4_TEMPLATE["spec"]["spec"]
    threading.Timer(0.1, cache.apply, ("ResourceClaim", "ADDED", body)).start()
    out = ext.filter({"Pod": pod, "NodeNames": ["dgx-1", "pcie-1"]})
    assert out["Error"] == "" and out["NodeNames"], out  # 4 GPUs + 4 NICs, as the claim says
    assert ext.workload(pod) is not None and ext.workload(pod).gpus == 4  # type: ignore[union-attr]
    monkeypatch.setattr(extender, "CLAIM_LAG_S", 0.05)
    pod = _pod({"pattern": "tensor-parallel"}, [{"name": "c", "resourceClaimName": "never"}])
    out = ext.filter({"Pod": pod, "NodeNames": ["dgx-1"]})
    assert out["NodeNames"] == [] and "ResourceClaim ml/never" in out["Error"], out


def test_a_call_past_its_search_budget_answers_from_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no search time left a node with too few free GPUs fails (as its search would)
    and any other passes unranked; nothing of that is cached, so the next call with time
    left searches those nodes and answers as an unhurried extender would."""
    import scorer.extender as extender

    cache = _cache()
    dgx = cache.graphs.topology("dgx-1")
    assert dgx is not None
    taken = [g.dra_device for g in dgx.gpus][:7]
    cache.apply("ResourceClaim", "ADDED", _allocated("most", "dgx-1", taken))
    args = {"Pod": _pod({"gpus": 2}), "NodeNames": ["dgx-1", "node-b", "pcie-1"]}
    monkeypatch.setattr(extender, "SEARCH_BUDGET_S", 0.0)
    monkeypatch.setattr(extender, "MIN_SEARCHES", 0)
    ext = Extender(cache)
    hurried = ext.filter(args)
    assert ext.searches == 0 and ext.bounded == 3
    assert hurried["NodeNames"] == ["node-b", "pcie-1"]
    assert "no 2-GPU placement" in hurried["FailedNodes"]["dgx-1"]
    assert [p["Score"] for p in ext.prioritize(args)] == [0, 0, 0]
    assert ext.searches == 0 and ext.bounded == 6
    monkeypatch.setattr(extender, "SEARCH_BUDGET_S", 10.0)
    full = ext.filter(args)
    assert ext.searches == 3 and ext.bounded == 6  # three occupancies, each searched once
    unhurried = Extender(cache)
    assert full == unhurried.filter(args)
    assert ext.prioritize(args) == unhurried.prioritize(args)
    assert max(p["Score"] for p in ext.prioritize(args)) > 0


def test_answers_are_the_wire_format_of_go_s_types() -> None:
    """The bodies joined from encoded pieces are exactly what the dict form encodes to:
    every ExtenderFilterResult field, names in the order sent, reasons escaped."""
    from scorer.extender import _filter_result

    ext = Extender(_cache())
    names = ["pcie-1", "dgx-1", "no-graph", "node-b"]
    args = {"Pod": _pod({"gpus": 8}), "NodeNames": names}
    raw = ext.filter_json(args)
    out = json.loads(raw)
    assert list(out) == ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]
    assert out["NodeNames"] == ["dgx-1", "node-b"]
    assert set(out["FailedNodes"]) == {"pcie-1", "no-graph"}
    expected = _filter_result(["dgx-1", "node-b"], out["FailedNodes"], True)
    assert raw == json.dumps(expected, separators=(",", ":")).encode()
    prio = json.loads(ext.prioritize_json(args))
    assert [p["Host"] for p in prio] == names
    assert all(set(p) == {"Host", "Score"} and 0 <= p["Score"] <= 10 for p in prio)


def test_a_quick_call_answers_only_from_warm_tables() -> None:
    """The server first tries a call on its event loop (``quick``): that gives up, rather
    than search or wait, until the shape's table holds every candidate, and then answers
    exactly what the worker would have."""
    from scorer.extender import WouldWait

    ext = Extender(_cache())
    args = {"Pod": _pod({"gpus": 2}), "NodeNames": ["dgx-1", "node-b", "pcie-1"]}
    with pytest.raises(WouldWait):
        ext.filter_json(args, quick=True)
    with pytest.raises(WouldWait):
        ext.prioritize_json(args, quick=True)
    assert ext.searches == 0
    slow = ext.filter_json(args), ext.prioritize_json(args)
    assert (ext.filter_json(args, quick=True), ext.prioritize_json(args, quick=True)) == slow
    # A claim the informers have not seen yet: the quick call does not poll for it.
    missing = _pod(None, [{"name": "c", "resourceClaimName": "not-yet"}])
    with pytest.raises(WouldWait):
        ext.filter_json({"Pod": missing, "NodeNames": ["dgx-1"]}, quick=True)


def test_prioritize_checks_label_constraints_on_the_node_objects_sent() -> None:
    """With whole Node objects on the wire (no Node informer, e.g. ``--no-kube``) the
    labels checked are the ones sent, for prioritize as for filter."""
    ext = Extender(_cache())  # the informers never saw node-b
    pod = _pod({"gpus": 2, "constraints": {"nodeLabels": {"tenant": "z"}}})
    args = {"Pod": pod, "Nodes": {"items": [_node("node-b", {"tenant": "z"}), _node("node-a")]}}
    assert ext.filter(args)["Nodes"]["items"][0]["metadata"]["name"] == "node-b"
    scores = {p["Host"]: p["Score"] for p in ext.prioritize(args)}
    assert scores["node-b"] > 0 and scores["node-a"] == 0


def test_claim_counts_of_the_examples() -> None:
    """What the extender reads off a claim: GPUs and NICs of this driver's classes, an
    ``All`` request at least one; the whole-node example's one request over every device
    counts as the per-kind ``All`` requests it replaced did."""
    repo = Path(__file__).resolve().parent.parent
    want = {
        "whole-node": (1, 1),
        "gpus-2-nics-ladder": (2, 2),
        "gpus-cpu-same-numa": (2, 0),
        "gpus-8-else-4": (8, 0),
    }
    for name, counts in want.items():
        docs = yaml.safe_load_all((repo / "examples" / f"{name}.yaml").read_text())
        (t,) = [d for d in docs if d and d["kind"] == "ResourceClaimTemplate"]
        assert claim_counts(t["spec"]["spec"], "toposlice.dev") == counts, name
