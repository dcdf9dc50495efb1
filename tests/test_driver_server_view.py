"""driver/plumbing/server_view.py: the watch's view of the driver's own objects with its writes'
answers laid over it until the watch shows them, and the bounds of the informer's
jittered delays (driver/plumbing/informer.py) the view and the publisher retry with."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.plumbing.informer import Informer
from driver.plumbing.kube import build_api_client, collection_lister, request_json
from driver.plumbing.server_view import ServerView, rv_int
from tests.kubeapi import KubeAPIServer
from tests.kubelet import wait_for

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def obj(name: str, rv: int, devices: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": str(rv)},
        "spec": {"devices": [{"name": f"d{i}"} for i in range(devices)]},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def view(clock: Clock | None = None) -> tuple[ServerView, list[bool]]:
    """A view not started: its informer's events are applied by hand, in the order a
    watch would deliver them (the race the layer exists for, made deterministic)."""
    woken: list[bool] = []

    def unused(**kwargs: Any) -> Any:
        raise AssertionError("not started")

    v = ServerView("t", unused, on_change=woken.append, ttl_s=60.0, clock=clock or Clock())
    return v, woken


def names(v: ServerView) -> dict[str, int]:
    return {o["metadata"]["name"]: len(o["spec"]["devices"]) for o in v.objects()}


def test_a_write_counts_before_the_watch_shows_it() -> None:
    v, woken = view()
    v.informer._apply("ADDED", "a", obj("a", 5, devices=1))
    v.wrote(obj("a", 7, devices=2))  # our update, answered at rv 7
    assert names(v) == {"a": 2}  # not the stale copy: a reconcile now writes nothing
    v.informer._apply("MODIFIED", "a", obj("a", 6, devices=9))  # an older event, late
    assert names(v) == {"a": 2}
    v.informer._apply("MODIFIED", "a", obj("a", 7, devices=2))  # the watch caught up
    assert v._written == {}
    v.informer._apply("MODIFIED", "a", obj("a", 8, devices=3))  # someone else, after us
    assert names(v) == {"a": 3}
    assert woken == [False] * 4  # every event wakes the writer


def test_a_newer_version_from_elsewhere_wins_over_our_answer() -> None:
    v, _ = view()
    v.wrote(obj("a", 7, devices=2))
    v.informer.store["a"] = obj("a", 9, devices=4)  # the watch already has a newer one
    assert names(v) == {"a": 4}


def test_a_deletion_hides_the_watchs_copy_until_the_watch_says_so() -> None:
    v, _ = view()
    v.informer._apply("ADDED", "a", obj("a", 5))
    v.informer._apply("ADDED", "b", obj("b", 6))
    v.deleted(obj("a", 5))
    assert names(v) == {"b": 1}
    v.informer._apply("DELETED", "a", None)
    assert names(v) == {"b": 1} and v._written == {}


def test_after_a_conflict_only_a_newer_version_or_a_deletion_ends_the_wait() -> None:
    v, _ = view()
    ours = obj("a", 7, devices=2)
    v.wrote(ours)  # the watch has not shown it yet
    assert v.wait_newer(ours, 0.05) is False  # absent from the watch is not deleted
    assert names(v) == {"a": 2}  # and our answer still counts
    v.informer._apply("ADDED", "a", obj("a", 9, devices=5))
    assert v.wait_newer(ours, 0.05) is True and names(v) == {"a": 5}
    v.informer._apply("DELETED", "a", None)
    assert v.wait_newer(obj("a", 9), 0.05) is False  # that deletion came before the wait
    assert names(v) == {}


def test_our_answers_expire() -> None:
    clock = Clock()
    v, _ = view(clock)
    v.informer._apply("ADDED", "a", obj("a", 5, devices=1))
    v.wrote(obj("a", 7, devices=2))
    clock.now += 61  # the watch never showed it (a relist jumped past): the watch counts
    assert names(v) == {"a": 1} and v._written == {}


def test_rv_int() -> None:
    assert rv_int(obj("a", 12)) == 12
    assert rv_int({"metadata": {}}) == -1 and rv_int(None) == -1
    assert rv_int({"metadata": {"resourceVersion": "abc"}}) == -1


def test_backoff_and_rewatch_delay_are_jittered_and_bounded() -> None:
    inf: Informer[Any] = Informer(
        "t", lambda **_: None, lambda o: o, backoff_base=0.5, backoff_max=30.0,
        rewatch_delay_s=1.0, rng=random.Random(7),
    )  # fmt: skip
    for fn, base in ((inf.backoff, 0.5), (inf.rewatch_delay, 1.0)):
        for attempt in range(40):
            ceiling = min(30.0, base * 2**attempt)
            delays = [fn(attempt) for _ in range(50)]
            assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempt, delays[:3])
            assert len({round(d, 9) for d in delays}) > 40  # jitter: no fleet in step
        assert max(fn(100) for _ in range(50)) <= 30.0


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        server.add_node("n1")
        yield server


def test_healthy_follows_the_server(api: KubeAPIServer, tmp_path: Path) -> None:
    """Against the test API server: listed once, healthy; an outage breaks the watch (not
    healthy); once the server is back, healthy again, with no second LIST."""
    client = build_api_client(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    v = ServerView(
        "slices",
        collection_lister(client, SLICES),
        selectors={"field_selector": "spec.nodeName=n1"},
        backoff_base=0.05,
        backoff_max=0.2,
    ).start()
    try:
        assert v.wait_synced(10) and v.healthy
        body = {
            "metadata": {"name": "s1"},
            "spec": {
                "driver": "toposlice.dev",
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }
        stored = request_json(client, "POST", SLICES, body)
        v.wrote(stored)
        assert [o["metadata"]["name"] for o in v.objects()] == ["s1"]
        assert wait_for(lambda: "s1" in v.informer.store)
        api.down(1.0)
        assert wait_for(lambda: not v.healthy, 5)
        assert wait_for(lambda: v.healthy, 10)
        assert v.informer.lists == 1
    finally:
        v.stop()


def test_an_answer_the_watch_has_already_passed_is_not_laid_over_it() -> None:
    """The create's answer reaches the writer after the watch delivered the create and a
    deletion right behind it (a kubelet wipe; a loaded machine): keeping the answer would
    hide the deletion for ttl_s, and the slice would not be published again."""
    v, _ = view()
    v.informer._apply("ADDED", "a", obj("a", 5))
    v.informer.resource_version = "5"
    v.informer._apply("DELETED", "a", None)
    v.informer.resource_version = "6"
    v.wrote(obj("a", 5))
    assert names(v) == {}
    v.wrote(obj("a", 7, devices=2))  # a later write the watch has not shown yet still counts
    assert names(v) == {"a": 2}
