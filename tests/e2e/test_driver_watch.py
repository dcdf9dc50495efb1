"""The driver learns what the API server holds of its slices from a watch, on the real
control plane: in steady state it sends no request at all (resyncs compare locally), a
slice deleted behind its back comes back from the watch event, and after an API-server
restart it resumes its watch with no LIST (a streaming list after the 410) and no write;
with WatchList off on the server, by LIST + WATCH.

Counted twice: by the driver itself (``toposlice_api_requests_total``, every request it
sends, refused ones included) and by kube-apiserver (``apiserver_request_total``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from driver.plumbing.informer import Informer
from driver.plumbing.kube import collection_lister, server_url
from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import (
    NodeDriver,
    install,
    published_slices,
    remove_node_and_slices,
    uninstall,
)

pytestmark = pytest.mark.e2e

NODE = "e2e-watch-dgx"
WRITES = ("create", "update", "patch", "delete")


@pytest.fixture(scope="module")
def driver(cluster: Cluster) -> Iterator[NodeDriver]:
    objs = install(cluster)
    cluster.add_node(NODE)
    d = NodeDriver(cluster, NODE, "dgx-h100")
    try:
        d.start().wait_started()
        yield d
    finally:
        d.cleanup()
        remove_node_and_slices(cluster, NODE)
        uninstall(cluster, objs)


def sent(d: NodeDriver) -> dict[tuple[str, str], float]:
    """(verb, resource) -> requests the driver has sent (its /metrics)."""
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(d.metrics()):
        for s in fam.samples:
            if s.name == "toposlice_api_requests_total":
                out[(s.labels["verb"], s.labels["resource"])] = s.value
    return out


def served(cluster: Cluster, resource: str) -> dict[str, float]:
    """kube-apiserver's count of requests on ``resource`` by verb, from all clients."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(cluster.kubectl("get", "--raw", "/metrics")):
        if fam.name == "apiserver_request":
            for s in fam.samples:
                if s.name.endswith("_total") and s.labels.get("resource") == resource:
                    out[s.labels["verb"]] = out.get(s.labels["verb"], 0.0) + s.value
    return out


def delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def test_steady_state_sends_nothing_and_a_deleted_slice_comes_back(
    cluster: Cluster, driver: NodeDriver
) -> None:
    start = sent(driver)
    # What a start costs: the Node once, the pool's slices listed once, then watched.
    assert start[("get", "nodes")] == 1
    assert start[("list", "resourceslices")] == 1
    assert start[("watch", "resourceslices")] >= 1
    time.sleep(1.0)
    before, server_before = sent(driver), served(cluster, "resourceslices")
    time.sleep(4.0)  # four resyncs (--resync-interval 1)
    assert delta(sent(driver), before) == {}
    server = served(cluster, "resourceslices")
    assert server.get("LIST", 0) == server_before.get("LIST", 0)
    assert all(server.get(v.upper(), 0) == server_before.get(v.upper(), 0) for v in WRITES)

    (victim,) = published_slices(cluster, NODE)
    cluster.kubectl("delete", "resourceslice", victim["metadata"]["name"])
    back = poll(lambda: published_slices(cluster, NODE), 10, 0.1, "the pool republished")
    assert back[0]["metadata"]["name"] != victim["metadata"]["name"]
    # The watch told it: one create (owned by the Node, read again in case it was
    # re-created), and still no LIST.
    assert delta(sent(driver), before) == {("create", "resourceslices"): 1, ("get", "nodes"): 1}


def _advance_etcd(cluster: Cluster) -> None:
    """A write the drivers' watches do not see (a ConfigMap): etcd's revision moves past
    the version each watch holds, so the restarted server's watch cache, which starts at
    etcd's current revision, answers their WATCH 410 and the state must come back."""
    cluster.kubectl("-n", "default", "create", "configmap", f"e2e-watch-{time.time_ns()}")


def test_api_server_restart_resumes_the_watch(cluster: Cluster, driver: NodeDriver) -> None:
    pool = published_slices(cluster, NODE)
    before = sent(driver)
    _advance_etcd(cluster)
    cluster.restart_apiserver()
    poll(lambda: driver.http("/readyz")[0] == 200, 30, 0.2, "ready again")
    time.sleep(2.0)  # resyncs after the restart
    changed = delta(sent(driver), before)
    # The WATCH from the old version answered 410, then a streaming list (a WATCH with
    # sendInitialEvents) in place of LIST + WATCH: no LIST. Its retry after the refused
    # connections waited for the port and a moment more, so no 403 from a server whose
    # authorizer had not synced: two requests, within the target of three. Nothing
    # written, the Node not read again.
    assert changed.get(("list", "resourceslices"), 0) == 0, changed
    assert 1 <= changed.get(("watch", "resourceslices"), 0) <= 3, changed
    assert sum(v for k, v in changed.items() if k[1] == "resourceslices") <= 3, changed
    assert not [k for k in changed if k[0] in WRITES or k[1] != "resourceslices"], changed
    assert published_slices(cluster, NODE) == pool
    # The new server has served this driver's slices no write either.
    server = served(cluster, "resourceslices")
    assert all(server.get(v.upper(), 0) == 0 for v in WRITES), server


def _slice_informer(cluster: Cluster) -> Informer[Any]:
    """The informer the driver's publisher runs, in this process (its counters to read),
    over the slices of this module's node, with the admin's credentials."""
    client = cluster.api_client()
    return Informer(
        "resourceslices",
        collection_lister(client, "/apis/resource.k8s.io/v1/resourceslices"),
        lambda obj: obj,
        selectors={"field_selector": f"spec.nodeName={NODE}"},
        backoff_base=0.5,
        initial_events_timeout_s=10.0,
        server=server_url(client),
    ).start()


def test_after_a_restart_the_state_comes_back_by_a_streaming_list(
    cluster: Cluster, driver: NodeDriver
) -> None:
    """v1.36.2 streams lists (WatchList, on by default): after the restart's 410 the
    informer gets the state in the same WATCH that then follows changes, with no LIST."""
    inf = _slice_informer(cluster)
    try:
        assert inf.wait_synced(30) and inf.lists == 1
        names = set(inf.store)
        assert names == {s["metadata"]["name"] for s in published_slices(cluster, NODE)}
        watches = inf.watches
        _advance_etcd(cluster)
        cluster.restart_apiserver()
        poll(lambda: inf.streamed == 1, 60, 0.1, "a streaming list after the restart")
        assert inf.lists == 1 and not inf._no_streaming and set(inf.store) == names
        # The WATCH from the old version (410) and the streaming list: two requests.
        assert inf.watches - watches == 2, (inf.watches, watches, inf.last_error)
        # The streaming list's stream is the watch: a deleted slice shows in it.
        (victim,) = published_slices(cluster, NODE)
        cluster.kubectl("delete", "resourceslice", victim["metadata"]["name"])
        poll(lambda: victim["metadata"]["name"] not in inf.store, 30, 0.1, "the deletion")
        assert inf.lists == 1 and inf.watches - watches == 2
    finally:
        inf.stop()
    poll(lambda: published_slices(cluster, NODE), 30, 0.1, "the pool republished")


def test_a_server_without_streaming_lists_gets_list_and_watch(
    cluster: Cluster, driver: NodeDriver
) -> None:
    """The same restart into a server with WatchList off: it refuses sendInitialEvents,
    and the informer lists, then watches, from then on without trying again."""
    inf = _slice_informer(cluster)
    try:
        assert inf.wait_synced(30) and inf.lists == 1
        _advance_etcd(cluster)
        cluster.restart_apiserver(["--feature-gates=WatchList=false"])
        poll(lambda: inf.lists == 2, 60, 0.1, "a LIST after the refused streaming list")
        assert inf.streamed == 0 and "refused a streaming list" in inf._no_streaming
        assert set(inf.store) == {s["metadata"]["name"] for s in published_slices(cluster, NODE)}
        # It still follows changes: the driver's pool re-created after a deletion.
        (victim,) = published_slices(cluster, NODE)
        cluster.kubectl("delete", "resourceslice", victim["metadata"]["name"])
        poll(lambda: victim["metadata"]["name"] not in inf.store, 30, 0.1, "the deletion")
        poll(lambda: len(inf.store) == 1, 30, 0.1, "the republished slice")
    finally:
        inf.stop()
        cluster.restart_apiserver(())
