"""The README's first command (``discover``, ``slices``, ``graph`` on a built-in fake machine)
prints no warning on any built-in machine (issue #34: ``dgx-h100``'s ``cpu-numa0`` warned that
its ``pcieRoots`` were cut to five of six, ``gb200-nvl72-tray``'s GPUs that ``580.105.08`` is
no semantic version) -- and not by hiding a loss: the slices still say every PCIe root of each
CPU group and every GPU's driver version, and stay valid for the API server."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from discovery.fake import list_machines
from normalize.attributes import to_semver
from normalize.limits import MAX_STRING
from normalize.validation import validate_pool
from tests.test_not_published import toposlice

WARNING = re.compile(r"warn", re.IGNORECASE)


_toposlice = toposlice


def test_every_built_in_machine_is_listed() -> None:
    listed = _toposlice("machines", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == list_machines()
    assert {"dgx-h100", "gb200-nvl72-tray"} <= set(list_machines())


@pytest.mark.parametrize("machine", list_machines())
def test_readme_commands_print_no_warning(machine: str) -> None:
    runs = {
        "discover": _toposlice("discover", "--fake", machine),
        "slices": _toposlice("slices", "--fake", machine, "--node-name", "node-a", "-o", "json"),
        "graph": _toposlice("graph", "--fake", machine, "-o", "json"),
    }
    for command, done in runs.items():
        assert done.returncode == 0, (command, done.stderr)
        warned = [line for line in done.stderr.splitlines() if WARNING.search(line)]
        assert warned == [], (command, warned)

    # Nothing lost: every CPU group's roots, every driver version, in a valid pool.
    from normalize.attribute_names import PCIE_ROOTS, PCIE_ROOTS_MORE

    slices: list[dict[str, Any]] = json.loads(runs["slices"].stdout)["items"]
    assert validate_pool(slices) == []
    devices = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    graph = json.loads(runs["graph"].stdout)
    inventory = json.loads(_toposlice("discover", "--fake", machine, "-o", "json").stdout)
    for vertex in graph["vertices"]:
        if vertex["kind"] != "cpu_group" or not vertex["attrs"].get("pcie_roots"):
            continue
        attrs = devices[vertex["attrs"]["dra_device"]]["attributes"]
        parts = [attrs[k]["string"] for k in (PCIE_ROOTS, *PCIE_ROOTS_MORE) if k in attrs]
        assert all(len(p) <= MAX_STRING for p in parts)
        assert ",".join(parts).split(",") == vertex["attrs"]["pcie_roots"], vertex["id"]
        assert ("pcieRootsTruncated" in attrs) is (len(parts) > 1)
    for gpu in inventory["gpus"]:
        if not gpu.get("driver_version"):
            continue
        (dev,) = [
            d
            for d in devices.values()
            if d["attributes"].get("resource.kubernetes.io/pciBusID", {}).get("string")
            == gpu["bus_id"]
        ]
        want = to_semver(gpu["driver_version"])
        assert dev["attributes"]["driverVersion"] == {"version": want}, gpu["bus_id"]
