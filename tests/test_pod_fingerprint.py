"""The NodeResourceTopology's pods fingerprint: the podfingerprint format the scheduler
plugin checks, and the driver's watch of the node's pods that keeps it current."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from driver.publisher.node_pods import NodePods
from normalize.pod_fingerprint import counted, sign


def test_sign_matches_the_reference_implementation() -> None:
    # k8stopologyawareschedwg/podfingerprint testdata/compat-tiny-3pods-1ns: its pods and
    # the signature its Go code computes for them.
    pods = [
        ("production", "jaeger-dpgjk"),
        ("production", "nginx-rt684"),
        ("production", "envoy-g9m22"),
    ]
    assert sign(pods) == "pfp0v001607b76a0e9d3aeb4"
    assert sign(reversed(pods)) == sign(pods)  # a set: the order does not matter
    assert sign(pods[:2]) != sign(pods)
    # Namespace and name are not one string: moving a character between them differs.
    assert sign([("ab", "c")]) != sign([("a", "bc")])
    assert sign([]).startswith("pfp0v001") and len(sign([])) == 8 + 16


#: Enough of an ApiClient for NodePods to build its informer (no request is sent here).
CLIENT: Any = SimpleNamespace(configuration=SimpleNamespace(host="https://127.0.0.1:9"))


def _pod(name: str, phase: str, node: str = "node-a", ns: str = "default") -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "resourceVersion": "1"},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_only_running_pods_of_the_node_count() -> None:
    assert counted(_pod("a", "Running"), "node-a")
    for phase in ("Pending", "Succeeded", "Failed", "Unknown"):
        assert not counted(_pod("a", phase), "node-a")
    assert not counted(_pod("a", "Running", node="node-b"), "node-a")
    assert not counted({"metadata": {}}, "node-a")


def test_node_pods_tells_each_change_of_the_fingerprint_once() -> None:
    """Driven through the real Informer's cache (no server): the first LIST is read by the
    caller, then every event that changes the counted set tells once, and events that
    leave it as it was tell nothing (a steady node sends no NRT write)."""
    told: list[str] = []
    pods = NodePods(CLIENT, "node-a", told.append)
    informer = pods.informer
    assert pods.fingerprint() is None  # not listed yet: no fingerprint to write
    informer._replace({"default/a": _pod("a", "Running"), "default/b": _pod("b", "Pending")}, "5")
    assert pods.fingerprint() == sign([("default", "a")])
    assert told == []  # the first LIST: read by the caller after wait_synced
    informer._apply("MODIFIED", "default/a", _pod("a", "Running") | {"x": 1})
    informer._apply("ADDED", "default/c", _pod("c", "Pending"))
    assert told == []
    informer._apply("MODIFIED", "default/b", _pod("b", "Running"))
    assert told == [sign([("default", "a"), ("default", "b")])]
    informer._apply("DELETED", "default/a", None)
    informer._apply("MODIFIED", "default/b", _pod("b", "Succeeded"))
    assert told[1:] == [sign([("default", "b")]), sign([])]
    assert pods.fingerprint() == sign([])


def test_node_pods_tells_the_first_fingerprint_once_listed() -> None:
    """A LIST that completes after the daemon stopped waiting is still told (the NRT is
    then written with its fingerprint), from the thread start() runs."""
    told: list[str] = []
    done = threading.Event()
    pods = NodePods(CLIENT, "node-a", lambda f: (told.append(f), done.set()))
    pods.informer.start = lambda: pods.informer  # type: ignore[method-assign]
    pods.start()
    try:
        pods.informer._replace({"default/a": _pod("a", "Running")}, "5")
        assert done.wait(5.0)
        assert told == [sign([("default", "a")])]
    finally:
        pods.stop()
