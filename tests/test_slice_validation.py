"""validate_slice / validate_pool reject each upstream rule violation (one test per rule)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from normalize.validation import validate_pool, validate_slice

Slice = dict[str, Any]


def good() -> Slice:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "00000-toposlice.dev-node-a-"},
        "spec": {
            "driver": "toposlice.dev",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [
                {
                    "name": "gpu-0000-1b-00-0",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
                        "nvlinkVersion": {"version": "4.0.0"},
                        "index": {"int": 0},
                        "migMode": {"bool": False},
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                }
            ],
        },
    }


def _dev(s: Slice) -> dict[str, Any]:
    d: dict[str, Any] = s["spec"]["devices"][0]
    return d


def errors_after(mutate: Callable[[Slice], None]) -> list[str]:
    s = good()
    mutate(s)
    return validate_slice(s)


def test_good_slice_is_valid() -> None:
    assert validate_slice(good()) == []
    assert validate_pool([good()]) == []


def test_driver_required() -> None:
    assert errors_after(lambda s: s["spec"].pop("driver"))


@pytest.mark.parametrize("driver", ["-bad.dev", "a" * 64, "under_score.dev", "x..y"])
def test_driver_name_rules(driver: str) -> None:
    assert errors_after(lambda s: s["spec"].__setitem__("driver", driver))


def test_driver_uppercase_allowed_after_lowercasing() -> None:
    assert not errors_after(lambda s: s["spec"].__setitem__("driver", "Toposlice.Dev"))


@pytest.mark.parametrize("pool", ["", "Node_A", "a/", "x" * 254, "a//b"])
def test_pool_name_rules(pool: str) -> None:
    assert errors_after(lambda s: s["spec"]["pool"].__setitem__("name", pool))


def test_pool_name_with_segments_ok() -> None:
    assert not errors_after(lambda s: s["spec"]["pool"].__setitem__("name", "a.b/c-d"))


def test_pool_generation_non_negative() -> None:
    assert errors_after(lambda s: s["spec"]["pool"].__setitem__("generation", -1))


def test_pool_slice_count_positive() -> None:
    assert errors_after(lambda s: s["spec"]["pool"].__setitem__("resourceSliceCount", 0))


def test_no_node_selection() -> None:
    assert errors_after(lambda s: s["spec"].pop("nodeName"))


def test_two_node_selections() -> None:
    assert errors_after(lambda s: s["spec"].__setitem__("allNodes", True))


def test_empty_node_name() -> None:
    assert errors_after(lambda s: s["spec"].__setitem__("nodeName", ""))


def test_all_nodes_must_be_true() -> None:
    def m(s: Slice) -> None:
        s["spec"].pop("nodeName")
        s["spec"]["allNodes"] = False

    assert errors_after(m)


def test_node_selector_one_term() -> None:
    def m(s: Slice) -> None:
        s["spec"].pop("nodeName")
        s["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{}, {}]}

    assert errors_after(m)


def test_per_device_node_selection_requires_device_choice() -> None:
    def m(s: Slice) -> None:
        s["spec"].pop("nodeName")
        s["spec"]["perDeviceNodeSelection"] = True

    assert errors_after(m)


def test_device_node_name_without_per_device() -> None:
    assert errors_after(lambda s: _dev(s).__setitem__("nodeName", "x"))


def _devices(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": f"d{i}", **copy.deepcopy(extra)} for i in range(n)]


def test_device_count_limit_128() -> None:
    assert not errors_after(lambda s: s["spec"].__setitem__("devices", _devices(128)))
    assert errors_after(lambda s: s["spec"].__setitem__("devices", _devices(129)))


def test_device_count_limit_64_with_taints() -> None:
    devs = _devices(65)
    devs[3]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert errors_after(lambda s: s["spec"].__setitem__("devices", devs))


def test_device_count_limit_64_with_list_attributes() -> None:
    devs = _devices(65)
    devs[0]["attributes"] = {"n": {"ints": [1]}}
    assert errors_after(lambda s: s["spec"].__setitem__("devices", devs))
    assert not errors_after(lambda s: s["spec"].__setitem__("devices", devs[:64]))


def test_device_count_limit_64_with_counters() -> None:
    devs = _devices(65)
    devs[0]["consumesCounters"] = [{"counterSet": "cs", "counters": {"mem": {"value": "1"}}}]
    assert errors_after(lambda s: s["spec"].__setitem__("devices", devs))


@pytest.mark.parametrize("name", ["GPU0", "gpu_0", "-a", "a" * 64, "a.b", ""])
def test_device_name_dns_label(name: str) -> None:
    assert errors_after(lambda s: _dev(s).__setitem__("name", name))


def test_device_names_unique() -> None:
    assert errors_after(lambda s: s["spec"]["devices"].append(copy.deepcopy(_dev(s))))


@pytest.mark.parametrize(
    "key",
    [
        "a" * 33,
        "1abc",
        "has-dash",
        "bad_domain!/x",
        "-x.dev/name",
        ("d" * 64) + "/x",
        "x.dev/" + "a" * 33,
        "x.dev/",
        "/x",
    ],
)
def test_attribute_key_qualified_name(key: str) -> None:
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__(key, {"int": 1}))


def test_attribute_key_ok_forms() -> None:
    def m(s: Slice) -> None:
        _dev(s)["attributes"]["A_" + "b" * 30] = {"int": 1}
        _dev(s)["attributes"]["dra.net/numaNode"] = {"int": 1}

    assert not errors_after(m)


def test_capacity_key_qualified_name() -> None:
    assert errors_after(lambda s: _dev(s)["capacity"].__setitem__("bad-key", {"value": "1"}))


@pytest.mark.parametrize("value", [{}, {"int": 1, "string": "x"}, {"float": 1.5}, "x"])
def test_attribute_exactly_one_value(value: Any) -> None:
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", value))


def test_attribute_value_types() -> None:
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"int": True}))
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"int": 2**63}))
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"bool": 1}))


def test_string_max_64() -> None:
    assert not errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"string": "a" * 64}))
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"string": "a" * 65}))


@pytest.mark.parametrize("version", ["4.0", "v1.2.3", "01.2.3", "1.2.03", "1.2.3-", "1.2.3+"])
def test_version_semver(version: str) -> None:
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"version": version}))


def test_version_semver_ok() -> None:
    for v in ("1.2.3", "1.2.3-rc.1+build.5", "0.0.0"):
        assert not errors_after(
            lambda s, v=v: _dev(s)["attributes"].__setitem__("x", {"version": v})
        )


def test_version_max_64() -> None:
    v = "1.2.3-" + "a" * 60
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"version": v}))


def test_list_non_empty() -> None:
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"ints": []}))


def test_list_elements_checked() -> None:
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"strings": ["a" * 65]}))
    assert errors_after(lambda s: _dev(s)["attributes"].__setitem__("x", {"versions": ["1.0"]}))


def test_attributes_plus_capacity_max_32() -> None:
    def m(s: Slice) -> None:
        _dev(s)["attributes"] = {f"a{i}": {"int": i} for i in range(31)}

    assert not errors_after(m)

    def m2(s: Slice) -> None:
        _dev(s)["attributes"] = {f"a{i}": {"int": i} for i in range(32)}

    assert errors_after(m2)


def test_attribute_values_max_48() -> None:
    def m(s: Slice) -> None:
        _dev(s)["attributes"] = {"a": {"ints": list(range(40))}, "b": {"ints": list(range(9))}}

    assert errors_after(m)


@pytest.mark.parametrize("value", ["80GiB", "abc", "", "1.5.5", None])
def test_capacity_quantity(value: Any) -> None:
    assert errors_after(lambda s: _dev(s)["capacity"].__setitem__("memory", {"value": value}))


def test_capacity_quantity_ok() -> None:
    for q in ("1", "80Gi", "1.5", "500m", "1e3", "2E", "+3k"):
        assert not errors_after(lambda s, q=q: _dev(s)["capacity"].__setitem__("c", {"value": q}))


def test_taints_limit_and_effect() -> None:
    taints = [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]
    assert errors_after(lambda s: _dev(s).__setitem__("taints", taints))
    bad = [{"key": "k", "effect": "Sometimes"}]
    assert errors_after(lambda s: _dev(s).__setitem__("taints", bad))


def test_consumes_counters_rules() -> None:
    three = [{"counterSet": f"c{i}", "counters": {"x": {"value": "1"}}} for i in range(3)]
    assert errors_after(lambda s: _dev(s).__setitem__("consumesCounters", three))
    dup = [{"counterSet": "c", "counters": {"x": {"value": "1"}}}] * 2
    assert errors_after(lambda s: _dev(s).__setitem__("consumesCounters", dup))
    empty = [{"counterSet": "c", "counters": {}}]
    assert errors_after(lambda s: _dev(s).__setitem__("consumesCounters", empty))


def test_devices_and_shared_counters_exclusive() -> None:
    sc = [{"name": "cs", "counters": {"mem": {"value": "1Gi"}}}]
    assert errors_after(lambda s: s["spec"].__setitem__("sharedCounters", sc))


def test_shared_counters_max_8() -> None:
    def m(s: Slice) -> None:
        s["spec"]["devices"] = []
        s["spec"]["sharedCounters"] = [
            {"name": f"cs{i}", "counters": {"m": {"value": "1"}}} for i in range(9)
        ]

    assert errors_after(m)


def test_binding_conditions_max_4() -> None:
    assert errors_after(lambda s: _dev(s).__setitem__("bindingConditions", list("abcde")))


def test_metadata_name_required() -> None:
    assert errors_after(lambda s: s.__setitem__("metadata", {}))


# --- pool level -------------------------------------------------------------------------------


def _pool(n: int) -> list[Slice]:
    out = []
    for i in range(n):
        s = good()
        s["spec"]["pool"]["resourceSliceCount"] = n
        _dev(s)["name"] = f"dev-{i}"
        out.append(s)
    return out


def test_pool_ok() -> None:
    assert validate_pool(_pool(3)) == []


def test_pool_duplicate_device_names() -> None:
    p = _pool(2)
    _dev(p[1])["name"] = "dev-0"
    assert validate_pool(p)


def test_pool_count_mismatch() -> None:
    assert validate_pool(_pool(3)[:2])


def test_pool_generation_mismatch() -> None:
    p = _pool(2)
    p[1]["spec"]["pool"]["generation"] = 2
    assert validate_pool(p)


def test_pool_unknown_counter_set() -> None:
    p = _pool(1)
    _dev(p[0])["consumesCounters"] = [{"counterSet": "nope", "counters": {"x": {"value": "1"}}}]
    assert any("unknown" in e for e in validate_pool(p))


def test_pool_empty() -> None:
    assert validate_pool([])
