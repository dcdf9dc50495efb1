"""Scorer building blocks against independent figures: the busbw model vs the NCCL/RCCL
numbers in placement-models.md, request validation, the DRA CEL environment and the allocator
rules."""

from __future__ import annotations

import math
from typing import Any

import pytest

from scorer.allocator import AllocationError, Unsatisfiable, allocate
from scorer.bandwidth import busbw_gbps
from scorer.cel import CelError, device_env, evaluate
from scorer.request import occupancy_from_dict, parse_quantity, request_from_dict
from tests.scorer_support import machine

# ---------------------------------------------------------------- bandwidth model


def test_nvswitch_any_subset_runs_at_ncc_l_per_gpu_nvlink4() -> None:
    t = machine("dgx-h100").topo()
    # placement-models §1.1: SM90_NVLINK_BW 20.6 GB/s × 18 links = 370.8 GB/s.
    for k in (2, 5, 8):
        assert math.isclose(busbw_gbps(t, t.gpus[:k]), 18 * 20.6)


def test_nvl72_tray_runs_at_nvlink5() -> None:
    t = machine("gb200-nvl72-tray").topo()
    assert math.isclose(busbw_gbps(t, t.gpus[:2]), 18 * 40.1)


def test_xgmi_mesh_scales_with_links_inside_the_set() -> None:
    t = machine("mi300x-8").topo()
    # §1.4: RCCL 48 GB/s per link; a set of n GPUs uses n-1 links per GPU.
    assert math.isclose(busbw_gbps(t, t.gpus[:2]), 48.0)
    assert math.isclose(busbw_gbps(t, t.gpus[:4]), 3 * 48.0)
    assert math.isclose(busbw_gbps(t, list(t.gpus)), 7 * 48.0)


def test_pcie_paths_pix_node_sys() -> None:
    t = machine("pcie-8gpu").topo()
    g = t.gpus
    # Gen4 x16: NCCL's PCI model 24 GB/s. Same switch: full; across root complexes of one
    # Intel socket: 6/5 P2P overhead; across sockets: Sapphire Rapids SMP model 22 GB/s.
    assert math.isclose(busbw_gbps(t, [g[0], g[1]]), 24.0)
    assert math.isclose(busbw_gbps(t, [g[0], g[2]]), 20.0)
    assert math.isclose(busbw_gbps(t, [g[0], g[4]]), 22.0)
    # A ring over two whole switches leaves each switch uplink one flow per direction.
    assert math.isclose(busbw_gbps(t, [g[0], g[1], g[2], g[3]]), 20.0)
    assert busbw_gbps(t, [g[0]]) == 0.0


# ---------------------------------------------------------------- request files


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"gpus": 2, "nicPerGpu": 1}, "unknown key 'nicPerGpu'"),
        ({"pattern": "tensor-parallel"}, "gpus is required"),
        ({"gpus": "two"}, "gpus must be an integer"),
        ({"gpus": 0}, "between 1 and"),
        ({"gpus": 2, "pattern": "allreduce"}, "pattern 'allreduce'"),
        ({"gpus": 2, "bound": "io"}, "bound 'io'"),
        ({"gpus": 2, "minGpuMemory": "lots"}, "minGpuMemory"),
        ({"gpus": 2, "constraints": {"zone": "a"}}, "constraints: unknown key 'zone'"),
        ([1, 2], "a request is a mapping"),
    ],
)
def test_bad_requests_are_refused_with_the_key_named(doc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        request_from_dict(doc, "req.yaml")


def test_request_defaults_and_quantities() -> None:
    r = request_from_dict({"gpus": 4, "minGpuMemory": "80Gi"})
    assert r.pattern == "data-parallel" and r.bound == "compute"
    assert r.min_gpu_memory == 80 * 2**30
    assert request_from_dict({"gpus": 1}).pattern == "independent"
    assert parse_quantity("40G") == 40 * 10**9


def test_occupancy_from_resource_claims() -> None:
    claims = {
        "kind": "ResourceClaimList",
        "items": [
            {
                "metadata": {"annotations": {"toposlice.dev/bound": "memory"}},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "g",
                                    "driver": "toposlice.dev",
                                    "pool": "n1",
                                    "device": "gpu-0000-18-00-0",
                                }
                            ]
                        }
                    }
                },
            },
            {"metadata": {}, "status": {}},
        ],
    }
    occ = occupancy_from_dict(claims)
    assert occ.used("n1") == {"gpu-0000-18-00-0"}
    assert occ.busy_memory("n1") == {"gpu-0000-18-00-0"}
    with pytest.raises(ValueError, match="allocated"):
        occupancy_from_dict({"allocated": {"n1": "gpu-a"}})


# ---------------------------------------------------------------- DRA CEL environment


def _dev() -> dict[str, Any]:
    return device_env(
        {
            "name": "gpu-a",
            "attributes": {
                "type": {"string": "gpu"},
                "resource.kubernetes.io/numaNode": {"int": 1},
                "computeCapability": {"version": "9.0.0"},
            },
            "capacity": {"memory": {"value": "81559Mi"}},
        },
        "toposlice.dev",
    )


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (
            'device.driver == "toposlice.dev" && device.attributes["toposlice.dev"].type == "gpu"',
            True,
        ),
        ('device.attributes["resource.kubernetes.io"].numaNode in [0, 2]', False),
        ('device.capacity["toposlice.dev"].memory.compareTo(quantity("80Gi")) >= 0', False),
        ('device.capacity["toposlice.dev"].memory.isGreaterThan(quantity("79Gi"))', True),
        ('device.attributes["toposlice.dev"].computeCapability.isLessThan(semver("10.0.0"))', True),
        ('!has(device.attributes["toposlice.dev"].uuid) || false', True),
        ('"x" in device.attributes["example.com"]', False),
        ("1 + 2 * 3 == 7 ? true : false", True),
    ],
)
def test_cel_device_environment(expr: str, want: bool) -> None:
    assert evaluate(expr, _dev()) is want


@pytest.mark.parametrize(
    "expr",
    ['device.attributes["toposlice.dev"].uuid == "x"', "device.driver", "device.nope(1)"],
)
def test_cel_errors(expr: str) -> None:
    with pytest.raises(CelError):
        evaluate(expr, _dev())


# ---------------------------------------------------------------- allocator rules

CLASSES = [
    {
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": 'device.attributes["d"].type == "gpu"'}}]},
    },
    {
        "metadata": {"name": "nic"},
        "spec": {"selectors": [{"cel": {"expression": 'device.attributes["d"].type == "nic"'}}]},
    },
]


def _slice(devs: list[tuple[str, str, str]], gen: int = 1, count: int = 1) -> dict[str, Any]:
    return {
        "spec": {
            "driver": "d",
            "nodeName": "n",
            "pool": {"name": "n", "generation": gen, "resourceSliceCount": count},
            "devices": [
                {
                    "name": name,
                    "attributes": {
                        "type": {"string": kind},
                        "resource.kubernetes.io/pcieRoot": {"string": root},
                    },
                }
                for name, kind, root in devs
            ],
        }
    }


DEVICES = [
    ("g0", "gpu", "r0"),
    ("g1", "gpu", "r1"),
    ("n1", "nic", "r1"),
    ("n2", "nic", "r2"),
]


def test_first_fit_backtracks_to_satisfy_match_attribute() -> None:
    spec = {
        "devices": {
            "requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu", "count": 1}},
                {"name": "n", "exactly": {"deviceClassName": "nic", "count": 1}},
            ],
            "constraints": [
                {"requests": ["g", "n"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
            ],
        }
    }
    got = allocate(spec, [_slice(DEVICES)], CLASSES)
    # g0 is first but no NIC shares its root: backtrack to g1 + n1.
    assert [(r.request, r.device) for r in got] == [("g", "g1"), ("n", "n1")]
    with pytest.raises(AllocationError):
        allocate(spec, [_slice(DEVICES)], CLASSES, allocated=[("d", "n", "n1")])


def test_all_mode_first_available_and_incomplete_pools() -> None:
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "g",
                    "firstAvailable": [
                        {"name": "three", "deviceClassName": "gpu", "count": 3},
                        {"name": "all", "deviceClassName": "gpu", "allocationMode": "All"},
                    ],
                }
            ]
        }
    }
    got = allocate(spec, [_slice(DEVICES)], CLASSES)
    assert [(r.request, r.device) for r in got] == [("g/all", "g0"), ("g/all", "g1")]
    # Generation 2 says two slices, only one is there: the pool is not usable.
    stale = [_slice(DEVICES, gen=1), _slice(DEVICES[:1], gen=2, count=2)]
    with pytest.raises(AllocationError):
        allocate(spec, stale, CLASSES)
    with pytest.raises(AllocationError, match="device class"):
        allocate(
            {"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "tpu"}}]}},
            [_slice(DEVICES)],
            CLASSES,
        )


def _req(name: str, cls: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "count": count, **extra}}


def test_tainted_devices_need_a_toleration() -> None:
    sl = _slice(DEVICES)
    sl["spec"]["devices"][0]["taints"] = [{"key": "broken", "effect": "NoSchedule"}]
    sl["spec"]["devices"][1]["taints"] = [{"key": "note", "effect": "None"}]
    spec = {"devices": {"requests": [_req("g", "gpu")]}}
    # g0 is kept away; an effect of None does not keep g1 away.
    assert [r.device for r in allocate(spec, [sl], CLASSES)] == ["g1"]
    two = {"devices": {"requests": [_req("g", "gpu", 2)]}}
    with pytest.raises(Unsatisfiable):
        allocate(two, [sl], CLASSES)
    tolerant = _req("g", "gpu", 2, tolerations=[{"key": "broken", "operator": "Exists"}])
    got = allocate({"devices": {"requests": [tolerant]}}, [sl], CLASSES)
    assert [r.device for r in got] == ["g0", "g1"]


def test_distinct_and_list_valued_match_attribute() -> None:
    sl = _slice([("g0", "gpu", "r0"), ("g1", "gpu", "r0"), ("g2", "gpu", "r1")])
    distinct = {
        "devices": {
            "requests": [_req("g", "gpu", 2)],
            "constraints": [{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}],
        }
    }
    assert [r.device for r in allocate(distinct, [sl], CLASSES)] == ["g0", "g2"]
    # List attributes match when all lists share a value: {a,b} {b,c} {a,c} pairwise
    # overlap but have nothing in common, so the third device must be skipped.
    for dev, vals in zip(sl["spec"]["devices"], (["a", "b"], ["b", "c"], ["a", "c"]), strict=True):
        dev["attributes"]["links"] = {"strings": vals}
    sl["spec"]["devices"].append(
        {"name": "g3", "attributes": {"type": {"string": "gpu"}, "links": {"strings": ["b"]}}}
    )
    match = {
        "devices": {
            "requests": [_req("g", "gpu", 3)],
            "constraints": [{"matchAttribute": "d/links"}],
        }
    }
    assert [r.device for r in allocate(match, [sl], CLASSES)] == ["g0", "g1", "g3"]


def test_all_mode_refuses_while_a_pool_is_updating_and_cel_errors_abort() -> None:
    other = _slice([("x0", "gpu", "r9")], gen=2, count=2)
    other["spec"]["pool"]["name"] = "other"
    spec = {"devices": {"requests": [_req("g", "gpu", allocationMode="All")]}}
    del spec["devices"]["requests"][0]["exactly"]["count"]
    assert len(allocate(spec, [_slice(DEVICES)], CLASSES)) == 2
    with pytest.raises(AllocationError, match="being updated"):
        allocate(spec, [_slice(DEVICES), other], CLASSES)
    # compareTo is for quantities and versions; on strings upstream has no overload.
    bad = _req("g", "gpu", selectors=[{"cel": {"expression": 'device.driver.compareTo("d") == 0'}}])
    with pytest.raises(AllocationError, match="compareTo"):
        allocate({"devices": {"requests": [bad]}}, [_slice(DEVICES)], CLASSES)
