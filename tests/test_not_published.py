"""An attribute an API limit keeps out of the slice is never left out without a word:
``dgx-h100``'s ``cpu-numa0`` has six local PCIe roots, 65 characters comma-joined (the
string limit is 64). As processes: ``slices`` publishes the roots that fit, flagged, and
warns; ``doctor`` and the exporter's ``/v1/normalization`` name it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.exporter_view import serving_url

REPO = Path(__file__).resolve().parent.parent
DRANET = REPO / "tests" / "data" / "foreign-slices" / "dranet.yaml"


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


def test_slices_publish_the_roots_that_fit_flag_the_cut_and_warn() -> None:
    done = toposlice("slices", "--fake", "dgx-h100", "--node-name", "n1", "-o", "json")
    assert done.returncode == 0, done.stderr
    graph = json.loads(toposlice("graph", "--fake", "dgx-h100", "-o", "json").stdout)
    (group,) = [v for v in graph["vertices"] if v["id"] == "cpu_group:cpu-numa0"]
    roots = ",".join(group["attrs"]["pcie_roots"])
    assert len(roots) == 65 and roots.count(",") == 5
    attrs = _cpu0(json.loads(done.stdout))
    assert attrs["pcieRoots"] == {"string": roots.rsplit(",", 1)[0]}, "cut at a root boundary"
    assert attrs["pcieRootsTruncated"] == {"bool": True}
    assert done.stderr.splitlines() == [
        "toposlice: warning: not published in full: cpu-numa0: pcieRoots lists 6 values in 65 "
        "characters, over the 64-character limit; published the first 5 and "
        "pcieRootsTruncated=true"
    ]
    # The list form (DRAListTypeAttributes) carries every root, and no warning.
    listed = toposlice(
        "slices", "--fake", "dgx-h100", "--node-name", "n1", "--numa-list", "-o", "json"
    )
    assert listed.returncode == 0 and listed.stderr == ""
    attrs = _cpu0(json.loads(listed.stdout))
    assert attrs["pcieRoots"] == {"strings": roots.split(",")}
    assert "pcieRootsTruncated" not in attrs
    # A machine whose values all fit says nothing.
    quiet = toposlice("slices", "--fake", "mi300x-8", "--node-name", "n1", "-o", "json")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_doctor_names_the_attribute_and_does_not_fail_on_it() -> None:
    done = toposlice("doctor", "--fake", "dgx-h100", "--slices", str(DRANET), "-o", "json")
    report = json.loads(done.stdout)
    (entry,) = report["not_published"]
    assert entry == {
        "driver": "toposlice.dev",
        "device": "cpu-numa0",
        "attribute": "pcieRoots",
        "reason": "lists 6 values in 65 characters, over the 64-character limit",
        "published": "the first 5 and pcieRootsTruncated=true",
    }
    assert report["summary"]["not_published"] == 1
    table = toposlice("doctor", "--fake", "dgx-h100", "--slices", str(DRANET)).stdout
    assert "NOT PUBLISHED IN FULL" in table and "cpu-numa0: pcieRoots lists 6 values" in table
    # Findings about the other driver decide the exit status, not toposlice's own limits.
    assert done.returncode == (1 if report["findings"] else 0)


def test_the_exporter_serves_it_without_observing() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "toposlice", "serve", "--fake", "dgx-h100",
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
