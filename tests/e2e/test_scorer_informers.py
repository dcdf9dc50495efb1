"""The extender's caches on the real API server: its informers fill from one LIST and
follow changes by WATCH, resume after an API-server restart from their resourceVersion
(no new LIST), and a node whose exporter hangs does not slow a call.

Two nodes with this driver's slices as ``toposlice slices`` prints them, each with an
InternalIP on the loopback network: the DGX's is served by a real exporter
(driver/exporter/http_server.py) at 127.0.0.1:P, the other's address 127.0.0.2:P accepts
connections and never answers (the fault a real exporter cannot be made to show).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from driver.exporter.http_server import HttpServer
from scorer.cluster_cache import ClusterCache
from scorer.extender import Extender
from scorer.extender_server import ExtenderServer
from scorer.graph_source import GraphSource
from scorer.request import PROFILE_ANNOTATION
from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import DRIVER, cli_slices, remove_node_and_slices
from tests.exporter_view import View, snapshot_of

pytestmark = pytest.mark.e2e

GOOD, HUNG = "e2e-inf-dgx", "e2e-inf-hung"
NS = "e2e-informers"
LABEL = "e2e.toposlice.dev/tenant"


@dataclass
class Setup:
    cache: ClusterCache
    ext: Extender
    server: ExtenderServer
    exporter: HttpServer


def _set_address(cluster: Cluster, node: str, ip: str) -> None:
    core, _ = cluster._core()
    core.patch_node_status(node, {"status": {"addresses": [{"type": "InternalIP", "address": ip}]}})


def _named(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CLI's slices (``generateName``) with the names the publisher would pick."""
    for s in slices:
        meta = s["metadata"]
        meta["name"] = meta.pop("generateName") + "e2eaa"
    return slices


def _hung_listener(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.2", port))
    s.listen(64)
    return s


@pytest.fixture(scope="module")
def setup(cluster: Cluster) -> Iterator[Setup]:
    exporter = HttpServer("127.0.0.1:0", View(snapshot_of("dgx-h100", GOOD))).start()
    port = exporter.address[1]
    try:
        hung = _hung_listener(port)
    except OSError:
        exporter.stop()
        pytest.skip("127.0.0.2 is not usable on this machine's loopback")
    cluster.add_node(GOOD, {LABEL: "a"})
    cluster.add_node(HUNG, {LABEL: "a"})
    _set_address(cluster, GOOD, "127.0.0.1")
    _set_address(cluster, HUNG, "127.0.0.2")
    cluster.kubectl("create", "namespace", NS)
    cluster.apply(_named(cli_slices("dgx-h100", GOOD)) + _named(cli_slices("pcie-8gpu", HUNG)))
    graphs = GraphSource(
        url_template=f"http://{{address}}:{port}/v1/topology", read_timeout_s=60.0
    ).start()
    cache = ClusterCache(DRIVER, graphs)
    cache.start_informers(cluster.api_client(), watch_timeout_s=60.0)
    ext = Extender(cache)
    server = ExtenderServer("127.0.0.1:0", ext, ready=cache.synced).start()
    try:
        yield Setup(cache, ext, server, exporter)
    finally:
        server.stop()
        cache.stop()
        exporter.stop()
        hung.close()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", "--ignore-not-found")
        for node in (GOOD, HUNG):
            remove_node_and_slices(cluster, node)


def _post(url: str, body: Any) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _args(gpus: int, **constraints: Any) -> dict[str, Any]:
    workload: dict[str, Any] = {"gpus": gpus}
    if constraints:
        workload["constraints"] = {"nodeLabels": constraints}
    pod = {
        "metadata": {
            "name": "p",
            "namespace": NS,
            "annotations": {PROFILE_ANNOTATION: json.dumps(workload)},
        }
    }
    return {"Pod": pod, "Nodes": None, "NodeNames": [GOOD, HUNG]}


def _claim(cluster: Cluster, name: str, device: str | None) -> None:
    """A claim for one GPU; with ``device``, allocated to it on GOOD (status written as
    the scheduler writes it)."""
    from kubernetes.client import ResourceV1Api

    api = ResourceV1Api(cluster.api_client())
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [{"name": "g", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}]
            }
        },
    }
    created = api.create_namespaced_resource_claim(NS, body, _preload_content=False)
    obj = json.loads(created.data)
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "g", "driver": DRIVER, "pool": GOOD, "device": device}]
            }
        }
    }
    api.replace_namespaced_resource_claim_status(name, NS, obj, _preload_content=False)


def test_informer_caches_fill_and_follow_changes(cluster: Cluster, setup: Setup) -> None:
    cache = setup.cache
    poll(lambda: cache.synced()[0], 60, 0.1, "informers synced")
    assert cache.node(GOOD) is not None and cache.node(GOOD).address == "127.0.0.1"  # type: ignore[union-attr]
    topo = poll(lambda: cache.graphs.topology(GOOD), 30, 0.1, "the DGX's graph")
    assert topo.pool == GOOD and len(topo.gpus) == 8
    # Names only on the wire: labels from the Node informer.
    out = _post(setup.server.url + "/filter", _args(8, **{LABEL: "a"}))
    assert out["NodeNames"] == [GOOD]
    cluster.kubectl("label", "node", GOOD, f"{LABEL}=b", "--overwrite")
    poll(lambda: cache.node(GOOD).labels.get(LABEL) == "b", 30, 0.05, "label change")  # type: ignore[union-attr]
    out = _post(setup.server.url + "/filter", _args(8, **{LABEL: "a"}))
    assert out["NodeNames"] == [] and "labels" in out["FailedNodes"][GOOD]
    # An allocation on the node takes its GPU out of every later answer.
    gpu = topo.gpus[0].dra_device
    _claim(cluster, "one-gpu", gpu)
    poll(lambda: gpu in cache.pool_use(GOOD).used, 30, 0.05, "the claim's allocation")
    out = _post(setup.server.url + "/filter", _args(8))
    assert out["NodeNames"] == [] and "no 8-GPU placement" in out["FailedNodes"][GOOD]
    cluster.kubectl("-n", NS, "delete", "resourceclaim", "one-gpu")
    poll(lambda: not cache.pool_use(GOOD).used, 30, 0.05, "the claim's release")
    assert _post(setup.server.url + "/filter", _args(8))["NodeNames"] == [GOOD]
    assert [i.lists for i in cache.informers] == [1, 1, 1, 1]
    # One fetch of the graph in all of this (none per call).
    assert (
        cache.graphs.stats.fetched == 1
        and setup.exporter.stats.requests[("/v1/topology", 200)] == 1
    )


def test_a_watch_that_ends_resumes_from_its_resource_version(cluster: Cluster) -> None:
    """The server ends each stream after timeoutSeconds (1 s here): the informer watches
    again from the last version it saw, and never lists again."""
    from kubernetes.client import CoreV1Api

    from driver.plumbing.informer import Informer
    from scorer.cluster_cache import node_info

    inf = Informer("Node", CoreV1Api(cluster.api_client()).list_node, node_info, watch_timeout_s=1)
    inf.start()
    try:
        poll(lambda: inf.watches >= 4, 30, 0.1, "four watch streams")
        cluster.kubectl("label", "node", GOOD, f"{LABEL}-resumed=yes", "--overwrite")
        poll(
            lambda: (inf.get(GOOD) or node_info({})).labels.get(f"{LABEL}-resumed"),
            30,
            0.05,
            "a change",
        )
        assert inf.lists == 1 and inf.failures == 0
    finally:
        inf.stop()
        cluster.kubectl("label", "node", GOOD, f"{LABEL}-resumed-")


def test_watches_follow_changes_after_an_api_server_restart(cluster: Cluster, setup: Setup) -> None:
    cache = setup.cache
    poll(lambda: cache.synced()[0], 60, 0.1, "informers synced")
    before = {i.name: (i.lists, i.watches, i.streamed) for i in cache.informers}
    cluster.restart_apiserver()
    cluster.kubectl("label", "node", GOOD, f"{LABEL}=c", "--overwrite")
    poll(lambda: cache.node(GOOD).labels.get(LABEL) == "c", 60, 0.1, "a change after the restart")  # type: ignore[union-attr]
    _claim(cluster, "after-restart", cache.graphs.topology(GOOD).gpus[1].dra_device)  # type: ignore[union-attr]
    poll(lambda: cache.pool_use(GOOD).used, 60, 0.1, "an allocation after the restart")
    # Each informer waits for the port and settles 2.25-3.75 s (jittered) before it
    # retries: one that saw no change yet may still be waiting.
    poll(
        lambda: all(i.watches > before[i.name][1] and i.synced.is_set() for i in cache.informers),
        30,
        0.1,
        "every informer watching again",
    )
    after = {i.name: (i.lists, i.watches, i.streamed) for i in cache.informers}
    for name, (lists, watches, streamed) in after.items():
        # The new server's watch cache starts at etcd's current revision: the old version
        # is gone (410), so each informer gets the state again by one streaming list (a
        # WATCH with sendInitialEvents, served from the watch cache), not a LIST.
        assert lists == before[name][0], f"{name}: {lists - before[name][0]} LISTs"
        assert streamed - before[name][2] <= 1, f"{name}: {streamed - before[name][2]}"
        assert watches > before[name][1], f"{name} did not watch again"
    cluster.kubectl("-n", NS, "delete", "resourceclaim", "after-restart")


def test_a_hung_node_endpoint_does_not_slow_a_call(setup: Setup) -> None:
    cache = setup.cache
    poll(lambda: cache.graphs.topology(GOOD), 30, 0.1, "the DGX's graph")
    assert cache.graphs.topology(HUNG) is None  # its fetch is still waiting for an answer
    times, outs = _filter_calls(setup, 5)
    for out in outs:
        assert out["NodeNames"] == [GOOD]
        assert out["FailedNodes"][HUNG].startswith("no topology graph for this node yet")
    # The fetch may hang for 60 s; a call waits for none of it.
    assert max(times) < 2.0, times


def _filter_calls(setup: Setup, n: int) -> tuple[list[float], list[dict[str, Any]]]:
    """``n`` filter calls for a 2-GPU pod: each one's seconds, and its answer."""
    times, outs = [], []
    for _ in range(n):
        t0 = time.monotonic()
        outs.append(_post(setup.server.url + "/filter", _args(2)))
        times.append(time.monotonic() - t0)
    return times, outs


def test_a_graph_refetch_that_hangs_keeps_the_last_graph_and_does_not_slow_a_call(
    cluster: Cluster, setup: Setup
) -> None:
    """The DGX's InternalIP moves to the address that never answers: the Node informer's
    change asks for its graph again, that fetch hangs, and calls go on at once with the
    graph fetched before."""
    cache = setup.cache
    poll(lambda: cache.graphs.topology(GOOD), 30, 0.1, "the DGX's graph")
    requests, fetched = cache.graphs.stats.requests, cache.graphs.stats.fetched
    _set_address(cluster, GOOD, "127.0.0.2")
    try:
        poll(lambda: cache.graphs.stats.requests > requests, 30, 0.05, "the refetch")
        times, outs = _filter_calls(setup, 5)
        assert all(out["NodeNames"] == [GOOD] for out in outs), outs
        assert cache.graphs.stats.fetched == fetched  # still hanging: the old graph serves
        assert max(times) < 2.0, times
    finally:
        _set_address(cluster, GOOD, "127.0.0.1")
