"""NodeResourceTopology and NFD NodeFeature objects: valid against the real CRDs' schemas,
zones equal to the inventory, valid label keys and values, and the writer's
0-writes-in-steady-state / 1-write-per-change rules."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

import driver.publisher.topology_objects as topo
from discovery.model import Inventory
from driver.config import add_driver_args, load_config
from driver.plumbing.checks import ConfigError
from driver.publisher.topology_objects import (
    NODE_FEATURE_KIND,
    NRT_KIND,
    ObjectError,
    TopologyObjectWriter,
)
from normalize.node_feature import (
    NODE_NAME_LABEL,
    admits,
    build_node_feature,
    is_label_value,
    label_safe,
    topology_labels,
)
from normalize.nrt import build_nrt, topology_policy
from normalize.options import NormalizeOptions
from normalize.pod_fingerprint import ATTRIBUTE as FINGERPRINT
from normalize.pod_fingerprint import sign
from normalize.validation import is_dns_subdomain
from tests.driver_support import snapshot
from tests.kubelet import wait_for

CRDS = Path(__file__).resolve().parent.parent / "charts" / "toposlice" / "crds-optional"
MACHINES = ["dgx-h100", "gb200-nvl72-tray", "mi300x-8", "cpu-2s"]
NODE = "node-a"


def crd_schema(file: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / file).read_text())
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"{file} has no version {version}")


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would prune (not in the structural schema)."""
    out: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if schema.get("x-kubernetes-preserve-unknown-fields") or path.endswith(".metadata"):
            return out
        for key, value in obj.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            else:
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def check_against(obj: dict[str, Any], schema: dict[str, Any]) -> None:
    jsonschema.validate(obj, schema)
    assert unknown_fields(obj, schema) == []


# -- NodeResourceTopology ---------------------------------------------------------------


@pytest.mark.parametrize("machine", MACHINES)
def test_nrt_validates_and_matches_inventory(machine: str) -> None:
    inv = snapshot(machine).inventory
    fingerprint = sign([("default", "a")])
    obj = build_nrt(inv, NODE, policy="single-numa-node", scope="pod", pods_fingerprint=fingerprint)
    check_against(obj, crd_schema("noderesourcetopologies.yaml", "v1alpha2"))
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert obj["metadata"]["name"] == NODE
    zones = {z["name"]: z for z in obj["zones"]}
    for node in inv.numa_nodes:
        zone = zones.get(f"node-{node.id}")
        if not (node.cpus or node.memory_bytes):
            assert zone is None  # empty placeholder nodes are left out
            continue
        assert zone is not None and zone["type"] == "Node"
        res = {r["name"]: r for r in zone["resources"]}
        # Only what a container requests: GPUs and NICs are DRA devices (slices' numaNode).
        assert set(res) <= {"cpu", "memory"}
        assert res["cpu"]["capacity"] == str(len(node.cpus))
        if node.memory_bytes:
            assert int(res["memory"]["allocatable"]) == node.memory_bytes
        for r in res.values():
            assert r["capacity"] == r["allocatable"] == r["available"]
        costs = {c["name"]: c["value"] for c in zone.get("costs", [])}
        assert costs == {f"node-{k}": v for k, v in node.distances.items() if f"node-{k}" in zones}
    assert sum(int(z["resources"][0]["capacity"]) for z in obj["zones"]) == len(inv.cpus)
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        FINGERPRINT: fingerprint,
    }
    # The deprecated list only when asked for (the plugin logs twice per Filter call on it).
    assert "topologyPolicies" not in obj
    asked = build_nrt(inv, NODE, policy="single-numa-node", scope="pod", topology_policies=True)
    assert asked["topologyPolicies"] == ["SingleNUMANodePodLevel"]
    check_against(asked, crd_schema("noderesourcetopologies.yaml", "v1alpha2"))


def test_nrt_gpu_memory_zones_on_gb200() -> None:
    inv = snapshot("gb200-nvl72-tray").inventory
    obj = build_nrt(inv, NODE)
    memory_zones = {
        a["value"]: z["name"]
        for z in obj["zones"]
        for a in z.get("attributes", [])
        if a["name"] == "memory-of-gpu"
    }
    assert memory_zones == {g.bus_id: f"node-{g.memory_numa_node}" for g in inv.gpus}
    assert "attributes" not in obj and "topologyPolicies" not in obj


def test_nrt_leaves_devices_to_the_slices_and_follows_cpus() -> None:
    inv = Inventory.from_dict(snapshot("dgx-h100").inventory.to_dict())
    before = build_nrt(inv, NODE)
    inv.gpus = inv.gpus[1:]
    inv.nics = inv.nics[1:]
    assert build_nrt(inv, NODE) == before  # devices are not zone resources
    node = inv.numa_nodes[0]
    node.cpus = node.cpus[1:]
    after = build_nrt(inv, NODE)
    changed = [a["name"] for a, b in zip(before["zones"], after["zones"], strict=True) if a != b]
    assert changed == [f"node-{node.id}"]


def test_nrt_rejects_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy"):
        build_nrt(snapshot("cpu-2s").inventory, NODE, policy="strict")
    assert topology_policy("none", "pod") == "None"
    assert topology_policy("restricted", "container") == "RestrictedContainerLevel"


# -- NodeFeature --------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def label_key_ok(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and not (is_dns_subdomain(prefix) and len(prefix) <= 253):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


@pytest.mark.parametrize("machine", MACHINES)
def test_node_feature_validates_and_labels_are_valid(machine: str) -> None:
    inv = snapshot(machine).inventory
    obj = build_node_feature(inv, NODE, "toposlice")
    check_against(obj, crd_schema("nodefeatures.yaml", "v1alpha1"))
    meta = obj["metadata"]
    assert meta["labels"][NODE_NAME_LABEL] == NODE and meta["namespace"] == "toposlice"
    labels = obj["spec"]["labels"]
    for key, value in {**labels, **meta["labels"]}.items():
        assert label_key_ok(key), key
        assert is_label_value(value), (key, value)
    assert all(k.startswith("toposlice.dev/") for k in labels)
    if not inv.gpus:
        assert labels == {}
        return
    assert labels["toposlice.dev/gpu.count"] == str(len(inv.gpus))
    cliques = {g.fabric.clique for g in inv.gpus if g.fabric is not None}
    if cliques and None not in cliques and len(cliques) == 1:
        assert labels["toposlice.dev/gpu.clique"] == cliques.pop()
        assert labels["toposlice.dev/nvlink-domain"] == labels["toposlice.dev/gpu.clique"]
    else:
        assert "toposlice.dev/gpu.clique" not in labels
        assert labels["toposlice.dev/nvlink-domain"] == NODE


def test_node_feature_topology_facts() -> None:
    dgx = topology_labels(snapshot("dgx-h100").inventory, NODE)
    # Each H100 has a ConnectX-7 behind its own PCIe switch: 8 rails, aligned below the root.
    assert dgx["rail-count"] == "8" and dgx["gpu-nic-alignment"] == "pxb"
    assert dgx["gpus-per-numa"] == "4" and dgx["gpu-numa-nodes"] == "2"
    assert dgx["gpu.model"] == "NVIDIA-H100-80GB-HBM3"
    gb200 = topology_labels(snapshot("gb200-nvl72-tray").inventory, NODE)
    assert gb200["gpu-nic-alignment"] == "sys"  # nvidia-smi topo -m says SYS (real capture)
    cloud = topology_labels(snapshot("cloud-vm-1gpu").inventory, NODE)
    assert cloud["gpu-nic-alignment"] == "none" and cloud["rail-count"] == "0"
    # The node-affinity labels: NVSwitch (all 8), the tray's clique (its 4), none on PCIe
    # cards or on xGMI (which is not NVLink); InfiniBand rails beside Ethernet storage NICs.
    assert dgx["gpus-per-nvlink-domain"] == "8" and gb200["gpus-per-nvlink-domain"] == "4"
    assert dgx["nic.link-layers"] == gb200["nic.link-layers"] == "ethernet_infiniband"
    pcie = topology_labels(snapshot("pcie-8gpu").inventory, NODE)
    mi300x = topology_labels(snapshot("mi300x-8").inventory, NODE)
    assert pcie["gpus-per-nvlink-domain"] == mi300x["gpus-per-nvlink-domain"] == "0"
    assert pcie["nic.link-layers"] == "ethernet" and cloud["nic.link-layers"] == "none"


def _required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


def test_admits_is_the_node_affinity_rule() -> None:
    gt3 = {"key": "k", "operator": "Gt", "values": ["3"]}
    absent = {"key": "k", "operator": "DoesNotExist"}
    ib = {"key": "l", "operator": "In", "values": ["infiniband", "ethernet_infiniband"]}
    assert admits(None, {}) and admits({}, {"k": "1"})
    assert admits(_required([gt3]), {"k": "8"}) and not admits(_required([gt3]), {"k": "3"})
    assert not admits(_required([gt3]), {}) and not admits(_required([gt3]), {"k": "x"})
    # terms are ORed, expressions of a term ANDed
    assert admits(_required([gt3], [absent]), {}) and not admits(
        _required([gt3], [absent]), {"k": "0"}
    )
    assert admits(_required([gt3, ib]), {"k": "8", "l": "ethernet_infiniband"})
    assert not admits(_required([gt3, ib]), {"k": "8", "l": "ethernet"})
    lt = {"key": "k", "operator": "Lt", "values": ["2"]}
    assert admits(_required([lt]), {"k": "1"}) and not admits(_required([lt]), {"k": "2"})
    assert admits(_required([{"key": "k", "operator": "Exists"}]), {"k": ""})
    assert admits(_required([{"key": "k", "operator": "NotIn", "values": ["a"]}]), {})
    with pytest.raises(ValueError):
        admits(_required([{"key": "k", "operator": "Near"}]), {"k": "1"})
    fields = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    with pytest.raises(ValueError):
        admits(fields, {})


def test_node_feature_refuses_long_node_name() -> None:
    with pytest.raises(ValueError, match="63"):
        build_node_feature(snapshot("cpu-2s").inventory, "n" * 64, "toposlice")


@given(st.text(max_size=200))
def test_label_safe_always_valid(text: str) -> None:
    value = label_safe(text)
    assert is_label_value(value)


def test_label_safe_keeps_distinct_long_values_distinct() -> None:
    a, b = "x" * 80 + "a", "x" * 80 + "b"
    assert label_safe(a) != label_safe(b) and len(label_safe(a)) <= 63


# -- the writer ---------------------------------------------------------------------------


def _api_error(status: int, message: str = "") -> ApiException:
    exc = ApiException(status=status, reason=message or str(status))
    exc.body = json.dumps({"kind": "Status", "message": message})
    return exc


class FakeApi:
    """Objects by path; counts requests; optional CRD absence and one-shot conflicts."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.crd_installed = True
        self.conflicts = 0
        self.rv = 0
        self.node_uid = "uid-1"

    def writes(self) -> int:
        """Writes the server carried out (failed attempts are not counted)."""
        return self.rv

    def request(
        self, _client: Any, method: str, path: str, body: Any = None, query: Any = None
    ) -> Any:
        self.requests.append((method, path))
        if not self.crd_installed:
            raise _api_error(404, "the server could not find the requested resource")
        if method == "GET":
            if path not in self.objects:
                raise _api_error(404, "not found")
            return copy.deepcopy(self.objects[path])
        if method == "POST":
            full = f"{path}/{body['metadata']['name']}"
            if full in self.objects:
                raise _api_error(409, "already exists")
            return self._store(full, body)
        if method == "PUT":
            if self.conflicts:
                self.conflicts -= 1
                raise _api_error(409, "the object has been modified")
            if (
                body["metadata"].get("resourceVersion")
                != self.objects[path]["metadata"]["resourceVersion"]
            ):
                raise _api_error(409, "stale resourceVersion")
            return self._store(path, body)
        raise AssertionError(method)

    def _store(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("uid", f"obj-{self.rv}")
        self.objects[path] = obj
        return copy.deepcopy(obj)

    def get_node(self, _client: Any, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": self.node_uid}}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(topo, "request_json", fake.request)
    monkeypatch.setattr(topo, "get_node", fake.get_node)
    return fake


def _writer(kind: Any) -> TopologyObjectWriter:
    return TopologyObjectWriter(object(), kind, NODE, backoff_base=0.01, backoff_max=0.05)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [NRT_KIND, NODE_FEATURE_KIND])
def test_writer_zero_writes_in_steady_state_one_per_change(api: FakeApi, kind: Any) -> None:
    inv = Inventory.from_dict(snapshot("dgx-h100").inventory.to_dict())

    pods: list[tuple[str, str]] = []

    def desired() -> dict[str, Any]:
        if kind is NRT_KIND:
            return build_nrt(inv, NODE, pods_fingerprint=sign(pods))
        return build_node_feature(inv, NODE, "toposlice")

    w = _writer(kind)
    w.set_desired(desired())
    assert w.reconcile() == 1 and api.writes() == 1
    (path,) = api.objects
    owner = api.objects[path]["metadata"]["ownerReferences"]
    assert owner == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1", "controller": True}
    ]
    for _ in range(5):
        assert w.reconcile() == 0
    assert api.writes() == 1
    # A restarted driver (new writer, same hardware) writes nothing either.
    w2 = _writer(kind)
    w2.set_desired(desired())
    assert w2.reconcile() == 0 and api.writes() == 1
    # A GPU lost (NodeFeature) or a pod started (the NRT's fingerprint): exactly one write.
    inv.gpus = inv.gpus[1:]
    pods.append(("default", "started"))
    assert w.set_desired(desired()) is True
    assert w.reconcile() == 1 and api.writes() == 2
    assert w.reconcile() == 0 and api.writes() == 2
    assert w.writes == {"create": 1, "update": 1}


def test_writer_restores_edited_and_deleted_object(api: FakeApi) -> None:
    w = _writer(NRT_KIND)
    w.set_desired(build_nrt(snapshot("cpu-2s").inventory, NODE))
    w.reconcile()
    (path,) = api.objects
    api.objects[path]["zones"] = []
    api.objects[path]["metadata"]["labels"]["team"] = "x"
    assert w.reconcile() == 1
    assert api.objects[path]["zones"] and api.objects[path]["metadata"]["labels"]["team"] == "x"
    del api.objects[path]
    assert w.reconcile() == 1 and path in api.objects


def test_writer_never_overwrites_a_foreign_object(api: FakeApi) -> None:
    obj = build_nrt(snapshot("cpu-2s").inventory, NODE)
    foreign = copy.deepcopy(obj)
    foreign["metadata"] = {"name": NODE, "resourceVersion": "7", "labels": {}}
    api.objects[f"{NRT_KIND.collection(None)}/{NODE}"] = foreign
    w = _writer(NRT_KIND)
    w.set_desired(obj)
    with pytest.raises(ObjectError, match="not labelled"):
        w.reconcile()
    assert api.writes() == 0


def test_writer_conflict_rereads_and_missing_crd_says_so(api: FakeApi) -> None:
    w = _writer(NRT_KIND)
    inv = Inventory.from_dict(snapshot("dgx-h100").inventory.to_dict())
    w.set_desired(build_nrt(inv, NODE))
    w.reconcile()
    w.set_desired(build_nrt(inv, NODE, pods_fingerprint=sign([("default", "p")])))
    api.conflicts = 1
    assert w.reconcile() == 1
    assert [m for m, _ in api.requests].count("PUT") == 2
    api.crd_installed = False
    w.set_desired(build_nrt(snapshot("cpu-2s").inventory, NODE))
    with pytest.raises(ObjectError, match="CRD installed"):
        w.reconcile()


def test_writer_loop_waits_out_failures(api: FakeApi) -> None:
    api.crd_installed = False
    w = _writer(NODE_FEATURE_KIND)
    w.set_desired(build_node_feature(snapshot("cpu-2s").inventory, NODE, "ns"))
    w.start()
    try:
        assert not w.wait_synced(0.3) and "CRD installed" in w.last_error
        api.crd_installed = True
        assert w.wait_synced(5.0)
        assert api.writes() == 1 and w.last_error == ""
    finally:
        w.stop()


# -- flags --------------------------------------------------------------------------------


def _config(argv: list[str], tmp_path: Path) -> Any:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nclusters: []\ncontexts: []\nusers: []\n")
    p = argparse.ArgumentParser()
    add_driver_args(p)
    args = p.parse_args(["--node-name", NODE, "--kubeconfig", str(kubeconfig), *argv])
    return load_config(args, "/", False, NormalizeOptions())


def test_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.delenv("NODE_FEATURE_NAMESPACE", raising=False)
    cfg = _config([], tmp_path)
    assert not cfg.nrt and not cfg.node_feature
    cfg = _config(
        [
            "--nrt",
            "--topology-manager-policy",
            "restricted",
            "--node-feature",
            "--node-feature-namespace",
            "toposlice",
        ],
        tmp_path,
    )
    assert cfg.nrt and cfg.topology_manager_policy == "restricted"
    assert cfg.node_feature and cfg.node_feature_namespace == "toposlice"
    with pytest.raises(ConfigError, match="need --nrt"):
        _config(["--topology-manager-scope", "pod"], tmp_path)
    with pytest.raises(ConfigError, match="namespace"):
        _config(["--node-feature"], tmp_path)
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert _config(["--node-feature"], tmp_path).node_feature_namespace == "from-env"


# -- RBAC: the chart grants exactly what the writer does ----------------------------------

_VERB = {"POST": "create", "PUT": "update", "GET": "get"}


@pytest.mark.parametrize("kind", [NRT_KIND, NODE_FEATURE_KIND])
def test_chart_grants_exactly_the_writers_calls(api: FakeApi, kind: Any) -> None:
    chart = pytest.importorskip("tests.test_chart")
    inv = Inventory.from_dict(snapshot("dgx-h100").inventory.to_dict())
    w = _writer(kind)
    for i in range(2):  # create, steady state, a change (update), a deletion (create)
        fingerprint = sign([("default", f"pod-{n}") for n in range(i)])
        obj = (
            build_nrt(inv, NODE, pods_fingerprint=fingerprint)
            if kind is NRT_KIND
            else build_node_feature(inv, NODE, "ns")
        )
        w.set_desired(obj)
        w.reconcile()
        w.reconcile()
        inv.gpus = inv.gpus[1:]
    api.objects.clear()
    w.reconcile()
    calls = set()
    for method, path in api.requests:
        m = re.fullmatch(r"/apis/([a-z0-9.-]+)/v1\w*(?:/namespaces/[^/]+)?/([a-z]+)(/.+)?", path)
        assert m is not None, path
        assert (m[3] is not None) == (method != "POST")  # reads and updates name the object
        calls.add((m[1], m[2], _VERB[method]))
    objs = chart.render(chart.ALL_OPTIONS)
    if kind is NRT_KIND:
        rules = chart.one(objs, "ClusterRole", "toposlice-node-plugin")["rules"]
    else:
        rules = chart.one(objs, "Role", "toposlice-node-feature")["rules"]
        binding = chart.one(objs, "RoleBinding", "toposlice-node-feature")
        assert binding["metadata"]["namespace"] == chart.NAMESPACE
    group = kind.group_version.split("/")[0]
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
        if g == group
    }
    assert calls == granted
    # Off by default: nothing granted on these resources.
    default = chart.render(None)
    default_rules = chart.one(default, "ClusterRole", "toposlice-node-plugin")["rules"]
    assert all(group not in r["apiGroups"] for r in default_rules)
    assert not [o for o in default if o["kind"] in ("Role", "CustomResourceDefinition")]


def test_chart_installs_the_copied_crds_when_asked() -> None:
    chart = pytest.importorskip("tests.test_chart")
    crds = {
        o["metadata"]["name"]: o
        for o in chart.render(chart.ALL_OPTIONS)
        if o["kind"] == "CustomResourceDefinition"
    }
    assert crds == {
        "noderesourcetopologies.topology.node.k8s.io": yaml.safe_load(
            (CRDS / "noderesourcetopologies.yaml").read_text()
        ),
        "nodefeatures.nfd.k8s-sigs.io": yaml.safe_load((CRDS / "nodefeatures.yaml").read_text()),
    }
    args = chart.node_plugin(chart.render(chart.ALL_OPTIONS))["containers"][0]["args"]
    assert "--nrt" in args and "--node-feature" in args
    assert f"--node-feature-namespace={chart.NAMESPACE}" in args


# -- docs/integrations.md and examples/integrations ----------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "integrations.md"
INTEGRATIONS = Path(__file__).resolve().parent.parent / "examples" / "integrations"


def _doc_rows() -> dict[str, list[str]]:
    """``toposlice.dev/<key>`` -> the cells of its row in the label table."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        m = re.match(r"^\| `toposlice\.dev/([a-z.-]+)` \|", line)
        if m:
            rows[m[1]] = [c.strip() for c in line.strip("|").split("|")]
    return rows


def test_docs_list_exactly_the_labels_with_their_values() -> None:
    from discovery.fake import list_machines

    emitted = set()
    for machine in list_machines():
        emitted |= set(topology_labels(snapshot(machine).inventory, NODE))
    rows = _doc_rows()
    assert set(rows) == emitted
    for column, machine in ((2, "dgx-h100"), (3, "gb200-nvl72-tray")):
        labels = topology_labels(snapshot(machine).inventory, NODE)
        for key, cells in rows.items():
            shown = cells[column].strip("`")
            if shown == "–":
                assert key not in labels, (machine, key)
            elif "…" not in shown and "<" not in shown:
                assert labels[key] == shown, (machine, key)
            elif shown == "<node>":
                assert labels[key] == NODE


def _yaml_docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((INTEGRATIONS / name).read_text()) if d]


def _known_label(key: str) -> bool:
    return key == "kubernetes.io/hostname" or (
        key.startswith("toposlice.dev/") and key.removeprefix("toposlice.dev/") in _doc_rows()
    )


KUEUE_NODE_LABEL = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


def test_scheduler_examples_use_the_labels_nvlink_domain_then_node() -> None:
    want = ["toposlice.dev/nvlink-domain", "kubernetes.io/hostname"]
    topology, flavor = _yaml_docs("kueue-topology.yaml")
    assert topology["kind"] == "Topology" and flavor["kind"] == "ResourceFlavor"
    levels = [lv["nodeLabel"] for lv in topology["spec"]["levels"]]
    assert levels == want and all(KUEUE_NODE_LABEL.match(lv) for lv in levels)
    assert flavor["spec"]["topologyName"] == topology["metadata"]["name"]
    vendors = {topology_labels(snapshot(m).inventory, NODE).get("gpu.vendor") for m in MACHINES}
    for key, value in flavor["spec"]["nodeLabels"].items():
        assert _known_label(key) and value in vendors
    (kai,) = _yaml_docs("kai-topology.yaml")
    assert kai["apiVersion"] == "kai.scheduler/v1alpha1"
    assert [lv["nodeLabel"] for lv in kai["spec"]["levels"]] == want
    (cm,) = _yaml_docs("volcano-hypernode-discovery.yaml")
    conf = yaml.safe_load(cm["data"]["volcano-controller.conf"])
    (source,) = conf["networkTopologyDiscovery"]
    assert source["source"] == "label" and source["enabled"] is True
    types = source["config"]["networkTopologyTypes"]
    assert all(len(name) <= 20 for name in types)
    assert [[lv["nodeLabel"] for lv in levels] for levels in types.values()] == [want]


def test_gpu_clique_rule_reads_the_node_feature_attributes() -> None:
    (rule,) = _yaml_docs("nfd-gpu-clique-rule.yaml")
    (r,) = rule["spec"]["rules"]
    (term,) = r["matchFeatures"]
    from normalize.node_feature import FEATURE_SET

    assert term["feature"] == FEATURE_SET
    assert set(term["matchExpressions"]) == {"gpu.clique"}
    assert (
        f".{FEATURE_SET} " in r["labelsTemplate"]
        and "nvidia.com/gpu.clique=" in r["labelsTemplate"]
    )
    # The attribute it reads is there, with nvidia.com/gpu.clique's value, only on a clique.
    gb200 = build_node_feature(snapshot("gb200-nvl72-tray").inventory, NODE, "ns")
    elements = gb200["spec"]["features"]["attributes"][FEATURE_SET]["elements"]
    assert elements["gpu.clique"] == gb200["spec"]["labels"]["toposlice.dev/gpu.clique"]
    dgx = build_node_feature(snapshot("dgx-h100").inventory, NODE, "ns")
    assert "gpu.clique" not in dgx["spec"]["features"]["attributes"][FEATURE_SET]["elements"]


# -- admission: only the node's own objects ----------------------------------------------


def test_admission_policy_keeps_each_node_to_its_own_objects() -> None:
    chart = pytest.importorskip("tests.test_chart")
    policy = chart.one(
        chart.render(chart.ALL_OPTIONS), "ValidatingAdmissionPolicy", "toposlice-topology-objects"
    )
    inv = snapshot("dgx-h100").inventory
    on_a = {chart.NODE_CLAIM: ["node-a"]}
    for build in (
        lambda node: build_nrt(inv, node),
        lambda node: build_node_feature(inv, node, chart.NAMESPACE),
    ):
        mine, theirs = build("node-a"), build("node-b")
        assert chart.admit(policy, "CREATE", mine, None, chart.SA_USER, on_a) == (True, "")
        assert chart.admit(policy, "UPDATE", mine, mine, chart.SA_USER, on_a) == (True, "")
        for op, obj, old in (
            ("CREATE", theirs, None),
            ("UPDATE", theirs, theirs),
            ("UPDATE", mine, theirs),
        ):
            ok, msg = chart.admit(policy, op, obj, old, chart.SA_USER, on_a)
            assert not ok and "node-a" in msg and "node-b" in msg, (op, msg)
        ok, msg = chart.admit(policy, "CREATE", mine, None, chart.SA_USER, {})
        assert not ok and "no node name" in msg
        other = "system:serviceaccount:kube-system:nfd-worker"
        assert chart.admit(policy, "CREATE", theirs, None, other, on_a) == (True, "not matched")
    assert not [
        o for o in chart.render(None) if o["metadata"]["name"] == "toposlice-topology-objects"
    ]


# -- the daemon's wiring --------------------------------------------------------------------


def test_daemon_keeps_both_objects_and_rewrites_them_once_per_change(
    api: FakeApi, tmp_path: Path
) -> None:
    """``toposlice run --nrt --node-feature`` without the kubelet side: the daemon's writers
    create both objects from the first discovery, rediscoveries of the same hardware write
    nothing, and a rediscovery that lost a GPU writes each object once."""
    from driver.daemon import Daemon

    cfg = _config(
        ["--nrt", "--no-nrt-pods-fingerprint", "--node-feature", "--node-feature-namespace", "ns"],
        tmp_path,
    )
    cfg = dataclasses.replace(cfg, resync_interval=0.05)
    inv = Inventory.from_dict(snapshot("dgx-h100").inventory.to_dict())
    current = [inv]
    daemon = Daemon(cfg, lambda: current[0], api_client=object())  # type: ignore[arg-type]
    daemon._snap = daemon._discover_snapshot()
    daemon._start_topology_objects()
    try:
        assert [w.kind for w in daemon.topology_writers] == [NRT_KIND, NODE_FEATURE_KIND]
        assert all(w.wait_synced(5.0) for w in daemon.topology_writers)
        assert api.writes() == 2
        for _ in range(3):
            daemon.rediscover()
        time.sleep(0.3)  # several resyncs
        assert api.writes() == 2
        lost = Inventory.from_dict(inv.to_dict())
        lost.gpus = lost.gpus[1:]
        lost.numa_nodes[0].cpus = lost.numa_nodes[0].cpus[1:]  # and a CPU (the NRT's zones)
        current[0] = lost
        daemon.rediscover()
        assert wait_for(lambda: api.writes() == 4, 5.0)
        time.sleep(0.3)
        assert api.writes() == 4
        nf = next(o for p, o in api.objects.items() if "nodefeatures" in p)
        assert nf["spec"]["labels"]["toposlice.dev/gpu.count"] == "7"
        assert daemon.status().details["noderesourcetopologies_writes"] == {
            "create": 1,
            "update": 1,
        }
    finally:
        for w in daemon.topology_writers:
            w.stop()


# -- NFD: the older strict schema, deny mode's rule -----------------------------------------


@pytest.mark.parametrize("machine", MACHINES)
def test_node_feature_suits_the_strict_schema_too(machine: str) -> None:
    """NFD <= v0.12 (and the fork some distributions ship) require all three feature kinds;
    an object without flags/instances is refused there with HTTP 422."""
    features = build_node_feature(snapshot(machine).inventory, NODE, "ns")["spec"]["features"]
    assert set(features) == {"attributes", "flags", "instances"}
    assert features["flags"] == {} and features["instances"] == {}


def test_chart_ships_the_deny_mode_rule_as_built() -> None:
    chart = pytest.importorskip("tests.test_chart")
    from normalize.node_feature import build_node_feature_rule

    rule = chart.one(chart.render(chart.ALL_OPTIONS), "NodeFeatureRule")
    assert rule == build_node_feature_rule()
    # Its template names every label the NodeFeature carries, prefixed (the deny mode's
    # labels are the default mode's).
    (r,) = rule["spec"]["rules"]
    assert r["labelsTemplate"].startswith("{{ range .toposlice.topology }}toposlice.dev/")
    assert not [o for o in chart.render(None) if o["kind"] == "NodeFeatureRule"]
    only_nrt = {"integrations": {"nodeFeature": {"enabled": False, "rule": True}}}
    assert not [o for o in chart.render(only_nrt) if o["kind"] == "NodeFeatureRule"]


def test_chart_grants_the_pods_watch_exactly_with_the_fingerprint() -> None:
    chart = pytest.importorskip("tests.test_chart")
    root = Path(__file__).resolve().parent.parent
    calls = chart.api_calls(iter([root / "driver" / "publisher" / "node_pods.py"]))
    assert calls == {("", "pods", "list"), ("", "pods", "watch")}

    def pods_granted(values: dict[str, Any] | None) -> set[tuple[str, str, str]]:
        return {c for c in chart.granted(chart.render(values)) if c[1] == "pods"}

    assert pods_granted(chart.ALL_OPTIONS) == calls
    assert pods_granted(None) == set()
    off = copy.deepcopy(chart.ALL_OPTIONS)
    off["integrations"]["nrt"]["podsFingerprint"] = False
    assert pods_granted(off) == set()
    args = chart.node_plugin(chart.render(off))["containers"][0]["args"]
    assert "--no-nrt-pods-fingerprint" in args
    args = chart.node_plugin(chart.render(chart.ALL_OPTIONS))["containers"][0]["args"]
    assert "--no-nrt-pods-fingerprint" not in args and "--nrt-topology-policies" in args


def test_daemon_warns_when_the_nrt_has_no_policy(
    api: FakeApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The NodeResourceTopology plugin refuses a node whose object has no policy ("invalid
    node topology data", measured in tests/consumers): say so at start, once."""
    from driver.daemon import Daemon

    for extra, warned in (([], True), (["--topology-manager-policy", "restricted"], False)):
        caplog.clear()
        cfg = _config(["--nrt", "--no-nrt-pods-fingerprint", *extra], tmp_path)
        daemon = Daemon(cfg, lambda: snapshot("cpu-2s").inventory, api_client=object())  # type: ignore[arg-type]
        with caplog.at_level(logging.WARNING, logger="toposlice.daemon"):
            daemon._start_topology_objects()
        for w in daemon.topology_writers:
            w.stop()
        said = [r for r in caplog.records if "--topology-manager-policy" in r.getMessage()]
        assert len(said) == (1 if warned else 0)
