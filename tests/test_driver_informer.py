"""driver/plumbing/informer.py against the test API server: after ``410 Gone`` the state comes
back by a streaming list (one WATCH with ``sendInitialEvents``) where the server has them,
by LIST + WATCH where it refuses or ignores them; after the server went away the retry
waits for the port to open, and a moment more (the window in which a just-started
kube-apiserver answers 403). The same paths on the real API server:
tests/e2e/test_driver_watch.py and tests/e2e/test_scorer_informers.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.plumbing.informer import Informer, accepts_connections, timed_out
from driver.plumbing.kube import build_api_client, collection_lister, request_json
from tests.kubeapi import KubeAPIServer
from tests.kubelet import wait_for

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def slice_body(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": "toposlice.dev",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


class Harness:
    """An informer over the slices of a test API server, every call it makes recorded,
    and a hook run once right after its first LIST answered (to change the server's
    state behind the watch that follows)."""

    def __init__(self, api: KubeAPIServer, tmp_path: Path) -> None:
        self.api = api
        self.client = build_api_client(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        self.calls: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.after_first_list: Callable[[], None] | None = None
        self._lister = collection_lister(self.client, SLICES)
        self.inf: Informer[Any] | None = None

    def list_fn(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        resp = self._lister(**kwargs)
        if not kwargs.get("watch") and self.after_first_list is not None:
            hook, self.after_first_list = self.after_first_list, None
            hook()
        return resp

    def create(self, name: str) -> None:
        request_json(self.client, "POST", SLICES, slice_body(name))

    def delete(self, name: str) -> None:
        request_json(self.client, "DELETE", f"{SLICES}/{name}")

    def start(self, **kwargs: Any) -> Informer[Any]:
        args: dict[str, Any] = {"backoff_base": 0.05, "backoff_max": 0.5, **kwargs}
        self.inf = Informer(
            "slices",
            self.list_fn,
            lambda o: o,
            on_event=lambda typ, key, old, new: self.events.append((typ, key)),
            **args,
        ).start()
        return self.inf

    def streaming_calls(self) -> int:
        return sum(1 for c in self.calls if c.get("send_initial_events"))

    def lists(self) -> int:
        return sum(1 for c in self.calls if not c.get("watch"))


@pytest.fixture
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with KubeAPIServer(stream_lists=getattr(request, "param", False)) as api:
        h = Harness(api, tmp_path)
        h.create("s1")
        try:
            yield h
        finally:
            if h.inf is not None:
                h.inf.stop()


def expire_after_the_list(h: Harness, *more_faults: int) -> None:
    """The first WATCH after the LIST is answered 410 (a restarted server whose watch
    cache starts past the LIST's version), then each of ``more_faults``; meanwhile s1 was
    deleted and s2 created: only a fresh state can show either."""

    def behind_the_watch() -> None:
        h.delete("s1")
        h.create("s2")

    h.after_first_list = behind_the_watch
    for status in (410, *more_faults):
        h.api.faults.add(status, verb="watch", resource="resourceslices")


@pytest.mark.parametrize("harness", [True], indirect=True)
def test_after_a_410_a_streaming_list_replaces_the_state_in_one_request(
    harness: Harness,
) -> None:
    h = harness
    expire_after_the_list(h)
    inf = h.start(watch_timeout_s=30)
    assert wait_for(lambda: inf.streamed == 1, 10)
    assert set(inf.store) == {"s2"}
    assert ("DELETED", "s1") in h.events and ("ADDED", "s2") in h.events
    # One LIST (the first sync), the WATCH answered 410, the streaming list: no relist.
    assert (inf.lists, inf.watches, h.lists(), h.streaming_calls()) == (1, 2, 1, 1)
    stream = h.calls[-1]
    assert stream["resource_version_match"] == "NotOlderThan"
    assert stream["resource_version"] == inf._list_from  # the version the 410 refused
    assert inf.resource_version is not None
    # The same stream goes on as the watch.
    h.create("s3")
    assert wait_for(lambda: "s3" in inf.store, 10)
    assert inf.watches == 2 and h.api.count("watch", "resourceslices") == 2


@pytest.mark.parametrize(
    ("faults", "why"),
    [
        ((410,), "410"),  # a server that ignores the parameters: the old version again
        ((422,), "refused"),  # one that refuses them (WatchList off)
        ((), "bookmark"),  # one that ignores them and still has the version: no end mark
    ],
)
def test_a_server_without_streaming_lists_gets_list_and_watch(
    harness: Harness, faults: tuple[int, ...], why: str
) -> None:
    h = harness
    expire_after_the_list(h, *faults)
    inf = h.start(watch_timeout_s=30, initial_events_timeout_s=0.5)
    assert wait_for(lambda: inf.lists == 2, 10), (inf.lists, inf._no_streaming, h.calls)
    assert why in inf._no_streaming
    assert set(inf.store) == {"s2"} and inf.streamed == 0
    assert ("DELETED", "s1") in h.events
    h.create("s3")
    assert wait_for(lambda: "s3" in inf.store, 10)
    # Learnt once: the next 410 lists at once, with no streaming attempt first.
    h.api.faults.add(410, verb="watch", resource="resourceslices")
    assert inf._watch is not None
    inf._watch.stop()  # end the open stream: the next WATCH meets the 410
    assert wait_for(lambda: inf.lists == 3, 10)
    assert h.streaming_calls() == 1


def test_the_first_sync_is_a_list(harness: Harness) -> None:
    inf = harness.start(watch_timeout_s=30)
    assert wait_for(lambda: "s1" in inf.store, 10)
    assert inf.lists == 1 and harness.streaming_calls() == 0


def test_after_a_refused_connection_the_retry_waits_for_the_port_and_settles(
    harness: Harness,
) -> None:
    """The server stops listening; the informer sends nothing while it is down (its TCP
    checks are not requests), and its first request after the port opens again comes
    ``settle_s`` (0.75-1.25x) later, not at once: a just-started kube-apiserver answers
    403 until its authorizer has synced."""
    h = harness
    settle = 0.6
    inf = h.start(
        server=h.api.url, watch_timeout_s=30, backoff_max=5.0, probe_s=0.1, settle_s=settle
    )
    assert wait_for(lambda: inf.watches == 1 and inf._watch is not None, 10)
    h.api.down(60)
    assert wait_for(lambda: inf.failures >= 1, 10)
    time.sleep(1.0)
    assert not accepts_connections(h.api.url)
    back = time.monotonic()
    h.api.up()
    assert wait_for(lambda: [t for t, _, _ in list(h.api.log) if t >= back], 10)
    first = min(t for t, _, _ in list(h.api.log) if t >= back)
    assert 0.75 * settle - 0.05 <= first - back <= 0.1 + 1.25 * settle + 1.0, first - back
    assert inf.failures == 1  # the one refused WATCH; none after


def test_only_a_timeout_skips_the_settle() -> None:
    """A refused connection or a cut stream means the server went away (it may be
    restarting: wait for it, then settle); a timeout means it is there and slow."""
    import urllib3
    from urllib3.exceptions import ProtocolError, ReadTimeoutError

    pool = urllib3.PoolManager(retries=False)
    with KubeAPIServer() as api:
        url = api.url
    with pytest.raises(Exception) as closed:
        pool.request("GET", url + "/version", timeout=1.0)
    assert not timed_out(closed.value) and not accepts_connections(url)
    cut = ProtocolError("Response ended prematurely")
    cut.__context__ = ValueError("invalid literal for int() with base 16: b''")
    assert not timed_out(cut)
    assert timed_out(ReadTimeoutError(pool, url, "Read timed out."))
    assert timed_out(TimeoutError("timed out"))
    wrapped = RuntimeError("x")
    wrapped.__cause__ = ReadTimeoutError(pool, url, "Read timed out.")
    assert timed_out(wrapped)
