"""An attribute an API limit keeps out of the slice is never left out without a word, and a
value published whole in another form is no warning. ``dgx-h100``'s ``cpu-numa0`` has six
local PCIe roots, 65 characters comma-joined (the string limit is 64): ``slices`` splits them
over ``pcieRoots`` and ``pcieRoots2`` and says nothing. A machine with 26 roots on that node
(``tests.inventories.many_roots_machine``) overflows even ``pcieRoots4``: ``slices`` warns,
and ``doctor`` and the exporter's ``/v1/normalization`` name it. As processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from normalize.attribute_names import PCIE_ROOTS_MORE
from tests.exporter_view import serving_url
from tests.inventories import many_roots_machine

REPO = Path(__file__).resolve().parent.parent
DRANET = REPO / "tests" / "data" / "foreign-slices" / "dranet.yaml"
PARTS = ("pcieRoots", *PCIE_ROOTS_MORE)


@pytest.fixture(scope="module")
def many_roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return many_roots_machine(tmp_path_factory.mktemp("many-roots"))


def toposlice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toposlice", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cpu0(printed: dict[str, Any]) -> dict[str, Any]:
    """cpu-numa0's attributes in what `slices -o json` prints (a v1 List)."""
    devices = [d for s in printed["items"] for d in s["spec"]["devices"]]
    attrs: dict[str, Any] = next(d for d in devices if d["name"] == "cpu-numa0")["attributes"]
    return attrs


def _graph_roots(source: str) -> list[str]:
    graph = json.loads(toposlice("graph", "--fake", source, "-o", "json").stdout)
    (group,) = [v for v in graph["vertices"] if v["id"] == "cpu_group:cpu-numa0"]
    roots: list[str] = group["attrs"]["pcie_roots"]
    return roots


def _parts(attrs: dict[str, Any]) -> list[str]:
    """The pcieRoots… strings a device carries, in order (none missing in between)."""
    present = [k for k in PARTS if k in attrs]
    assert present == list(PARTS[: len(present)]), present
    return [attrs[k]["string"] for k in present]


def test_slices_split_the_roots_over_pcie_roots_2_and_say_nothing() -> None:
    done = toposlice("slices", "--fake", "dgx-h100", "--node-name", "n1", "-o", "json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    roots = _graph_roots("dgx-h100")
    assert len(",".join(roots)) == 65 and len(roots) == 6
    attrs = _cpu0(json.loads(done.stdout))
    # cut at a root boundary, never inside one; every root still on the device
    assert _parts(attrs) == [",".join(roots[:5]), roots[5]]
    assert attrs["pcieRootsTruncated"] == {"bool": True}
    # The list form (DRAListTypeAttributes) carries every root in one attribute.
    listed = toposlice(
        "slices", "--fake", "dgx-h100", "--node-name", "n1", "--numa-list", "-o", "json"
    )
    assert listed.returncode == 0 and listed.stderr == ""
    attrs = _cpu0(json.loads(listed.stdout))
    assert attrs["pcieRoots"] == {"strings": roots}
    assert "pcieRootsTruncated" not in attrs and "pcieRoots2" not in attrs


def test_slices_warn_when_the_roots_overflow_every_part(many_roots: Path) -> None:
    done = toposlice("slices", "--fake", str(many_roots), "--node-name", "n1", "-o", "json")
    assert done.returncode == 0, done.stderr
    roots = _graph_roots(str(many_roots))
    assert len(roots) == 26
    attrs = _cpu0(json.loads(done.stdout))
    parts = _parts(attrs)
    assert len(parts) == 4 and all(len(p) <= 64 for p in parts)
    assert ",".join(parts).split(",") == roots[:20]
    assert attrs["pcieRootsTruncated"] == {"bool": True}
    assert done.stderr.splitlines() == [
        "toposlice: warning: not published in full: cpu-numa0: pcieRoots lists 26 values in "
        "285 characters, more than 4 attributes of 64 characters hold; published the first 20 "
        "in pcieRoots, pcieRoots2, pcieRoots3, pcieRoots4 and pcieRootsTruncated=true"
    ]


def test_doctor_names_the_attribute_and_does_not_fail_on_it(many_roots: Path) -> None:
    machine = str(many_roots)
    done = toposlice("doctor", "--fake", machine, "--slices", str(DRANET), "-o", "json")
    report = json.loads(done.stdout)
    (entry,) = report["not_published"]
    assert entry == {
        "driver": "toposlice.dev",
        "device": "cpu-numa0",
        "attribute": "pcieRoots",
        "reason": "lists 26 values in 285 characters, more than 4 attributes of 64 characters hold",
        "published": "the first 20 in pcieRoots, pcieRoots2, pcieRoots3, pcieRoots4 and "
        "pcieRootsTruncated=true",
    }
    assert report["summary"]["not_published"] == 1
    table = toposlice("doctor", "--fake", machine, "--slices", str(DRANET)).stdout
    assert "NOT PUBLISHED IN FULL" in table and "cpu-numa0: pcieRoots lists 26 values" in table
    # Findings about the other driver decide the exit status, not toposlice's own limits.
    assert done.returncode == (1 if report["findings"] else 0)
    # On the built-in machine nothing is lost: nothing to name.
    quiet = toposlice("doctor", "--fake", "dgx-h100", "--slices", str(DRANET), "-o", "json")
    assert json.loads(quiet.stdout)["not_published"] == []


def test_the_exporter_serves_it_without_observing(many_roots: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "toposlice", "serve", "--fake", str(many_roots),
         "--http-addr", "127.0.0.1:0", "--discover-in-process"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        url = serving_url(proc, deadline)
        while True:
            with urllib.request.urlopen(f"{url}/v1/normalization", timeout=10) as r:
                report = json.load(r)
            if report["node"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [(d["device"], d["attribute"]) for d in report["not_published"]] == [
            ("cpu-numa0", "pcieRoots")
        ]
        assert report["findings"] == [] and report["summary"]["not_published"] == 1
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_documented_selector_finds_a_root_in_any_part() -> None:
    """docs/attributes.md's selector for "a CPU group local to root R" reads every part: on
    dgx-h100 it finds the sixth root of cpu-numa0, the one in pcieRoots2."""
    from scorer.cel import device_env, evaluate

    doc = (REPO / "docs" / "attributes.md").read_text(encoding="utf-8")
    block = doc.split("A claim that looks for a root reads every part", 1)[1]
    expression = " ".join(block.split("expression: >-", 1)[1].split("```", 1)[0].split())
    assert 'contains("pci0000:5b")' in expression
    done = toposlice("slices", "--fake", "dgx-h100", "--node-name", "n1", "-o", "json")
    devices = {d["name"]: d for s in json.loads(done.stdout)["items"] for d in s["spec"]["devices"]}
    found = {n for n, d in devices.items() if evaluate(expression, device_env(d, "toposlice.dev"))}
    assert found == {"cpu-numa0"}
