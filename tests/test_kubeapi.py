"""The test API server speaks the REST API the real ``kubernetes`` client expects."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch

from tests.kubeapi import KubeAPIServer

DRIVER = "toposlice.dev"


def slice_body(node: str, driver: str = DRIVER, devices: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"00000-{driver}-{node}-"},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": f"dev-{i}"} for i in range(devices)],
        },
    }


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        yield server


@pytest.fixture
def kclient(api: KubeAPIServer, tmp_path: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(
        config_file=str(api.write_kubeconfig(tmp_path / "kubeconfig")), client_configuration=cfg
    )
    cfg.retries = 0
    return client.ApiClient(cfg)


def test_node_get_and_404(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    created = api.add_node("n1")
    node = client.CoreV1Api(kclient).read_node("n1")
    assert node.metadata.uid == created["metadata"]["uid"]
    assert node.metadata.creation_timestamp is not None
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(kclient).read_node("absent")
    assert err.value.status == 404


def test_slice_create_list_update_delete(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    rapi = client.ResourceV1Api(kclient)
    a = rapi.create_resource_slice(slice_body("n1"))
    rapi.create_resource_slice(slice_body("n2"))
    rapi.create_resource_slice(slice_body("n1", driver="other.example.com"))
    assert a.metadata.name.startswith("00000-toposlice.dev-n1-")
    assert len(a.metadata.name) == len("00000-toposlice.dev-n1-") + 5

    mine = rapi.list_resource_slice(field_selector=f"spec.driver={DRIVER},spec.nodeName=n1")
    assert [s.metadata.name for s in mine.items] == [a.metadata.name]
    assert len(rapi.list_resource_slice(field_selector="spec.nodeName=n1").items) == 2
    assert len(rapi.list_resource_slice(field_selector=f"spec.driver!={DRIVER}").items) == 1

    stale = a.to_dict()
    body = a.to_dict()
    body["spec"]["devices"].append({"name": "dev-9"})
    updated = rapi.replace_resource_slice(a.metadata.name, body)
    assert int(updated.metadata.resource_version) > int(a.metadata.resource_version)
    assert updated.metadata.generation == 2
    assert updated.metadata.uid == a.metadata.uid

    with pytest.raises(client.ApiException) as err:
        rapi.replace_resource_slice(a.metadata.name, stale)
    assert err.value.status == 409

    immutable = updated.to_dict()
    immutable["spec"]["node_name"] = "n2"
    with pytest.raises(client.ApiException) as err:
        rapi.replace_resource_slice(a.metadata.name, immutable)
    assert err.value.status == 422

    wrong_uid = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="nope"))
    with pytest.raises(client.ApiException) as err:
        rapi.delete_resource_slice(a.metadata.name, body=wrong_uid)
    assert err.value.status == 409
    rapi.delete_resource_slice(
        a.metadata.name,
        body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=a.metadata.uid)),
    )
    assert api.slices(DRIVER, "n1") == []
    assert api.count("create", "resourceslices") == 3
    assert api.writes("resourceslices") == 3 + 3 + 2  # creates, updates, deletes


def test_invalid_slice_is_refused(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    body = slice_body("n1")
    body["spec"]["devices"] = [{"name": "Not_A_Label"}]
    with pytest.raises(client.ApiException) as err:
        client.ResourceV1Api(kclient).create_resource_slice(body)
    assert err.value.status == 422
    assert api.slices() == []


def test_claims_are_namespaced(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    claim = {
        "metadata": {"name": "c1", "namespace": "ns1"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": []}}},
    }
    created = api.add_claim(claim)
    rapi = client.ResourceV1Api(kclient)
    raw = rapi.read_namespaced_resource_claim("c1", "ns1", _preload_content=False)
    import json

    got = json.loads(raw.data)
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    assert got["status"] == claim["status"]
    with pytest.raises(client.ApiException) as err:
        rapi.read_namespaced_resource_claim("c1", "other")
    assert err.value.status == 404
    rapi.create_namespaced_resource_claim(
        "ns2", {"metadata": {"name": "c2"}, "spec": {"devices": {"requests": []}}}
    )
    assert len(rapi.list_namespaced_resource_claim("ns2").items) == 1
    assert len(rapi.list_resource_claim_for_all_namespaces().items) == 2


def test_scripted_faults(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    rapi = client.ResourceV1Api(kclient)
    api.faults.add(429, verb="create", retry_after=2)
    api.faults.add(500, verb="write", times=1)
    with pytest.raises(client.ApiException) as err:
        rapi.create_resource_slice(slice_body("n1"))
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "2"
    with pytest.raises(client.ApiException) as err:
        rapi.create_resource_slice(slice_body("n1"))
    assert err.value.status == 500
    rapi.create_resource_slice(slice_body("n1"))
    assert len(api.slices()) == 1
    assert api.count("create") == 3
    assert api.succeeded[("create", "resourceslices")] == 1


def test_outage_refuses_then_recovers(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    rapi = client.ResourceV1Api(kclient)
    rapi.list_resource_slice()  # an open keep-alive connection exists
    api.down(2.0)
    with pytest.raises(Exception) as err:
        rapi.list_resource_slice()
    assert not isinstance(err.value, client.ApiException)  # a connection error, no answer
    time.sleep(2.3)
    assert rapi.list_resource_slice().items == []

    api.down(30, mode="503")
    with pytest.raises(client.ApiException) as err2:
        rapi.list_resource_slice()
    assert err2.value.status == 503
    api.up()
    assert rapi.list_resource_slice().items == []


def test_watch_streams_events(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    rapi = client.ResourceV1Api(kclient)
    first = rapi.create_resource_slice(slice_body("n1"))
    seen: list[tuple[str, str]] = []

    def consume() -> None:
        w = watch.Watch()
        for ev in w.stream(
            rapi.list_resource_slice, field_selector="spec.nodeName=n1", timeout_seconds=5
        ):
            seen.append((ev["type"], ev["object"].metadata.name))
            if ev["type"] == "DELETED":
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.3)
    rapi.create_resource_slice(slice_body("n2"))  # other node: filtered out
    rapi.delete_resource_slice(first.metadata.name)
    t.join(10)
    assert seen == [("ADDED", first.metadata.name), ("DELETED", first.metadata.name)]


def test_patch_merge(api: KubeAPIServer, kclient: client.ApiClient) -> None:
    api.add_node("n1")
    core = client.CoreV1Api(kclient)
    core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    assert core.read_node("n1").metadata.labels == {"a": "b"}
    assert len(core.list_node(label_selector="a in (b,c)").items) == 1
    assert core.list_node(label_selector="a!=b").items == []
