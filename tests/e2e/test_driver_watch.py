"""The driver learns what the API server holds of its slices from a watch, on the real
control plane: in steady state it sends no request at all (resyncs compare locally), a
slice deleted behind its back comes back from the watch event, and after an API-server
restart it resumes its watch with at most one LIST, no write.

Counted twice: by the driver itself (``toposlice_api_requests_total``, every request it
sends, refused ones included) and by kube-apiserver (``apiserver_request_total``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

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


def test_api_server_restart_resumes_the_watch(cluster: Cluster, driver: NodeDriver) -> None:
    pool = published_slices(cluster, NODE)
    before = sent(driver)
    cluster.restart_apiserver()
    poll(lambda: driver.http("/readyz")[0] == 200, 30, 0.2, "ready again")
    time.sleep(2.0)  # resyncs after the restart
    changed = delta(sent(driver), before)
    # At most one LIST (a 410 when the new server's watch cache starts past the driver's
    # resourceVersion), the watch reopened, nothing written, the Node not read again.
    assert changed.get(("list", "resourceslices"), 0) <= 1, changed
    assert changed.get(("watch", "resourceslices"), 0) >= 1, changed
    assert not [k for k in changed if k[0] in WRITES or k[1] != "resourceslices"], changed
    assert published_slices(cluster, NODE) == pool
    # The new server has served this driver's slices no write either.
    server = served(cluster, "resourceslices")
    assert all(server.get(v.upper(), 0) == 0 for v in WRITES), server
