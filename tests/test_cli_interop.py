"""What toposlice prints, read by the tools people pipe it to: the real kubectl (from
``../shared/kube``, unpacked as the e2e tier does) and the real Graphviz ``dot``; and
what those tools write, read back by toposlice (every form kubectl reads or writes).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_cli_errors import cli_env, toposlice

TOPOSLICE = (sys.executable, "-m", "toposlice")
SCORE = ("score", "--request", "req.yaml", "--fake", "dgx-h100", "-o", "json")


@pytest.fixture(scope="module")
def kubectl() -> str:
    from tests.e2e.cluster import find_assets

    assets = find_assets()
    if assets is None:
        pytest.skip("no Kubernetes binaries (../shared/kube)")
    return str(assets / "assets" / "kubectl")


def kubectl_local(kubectl: str, tmp: Path, text: str) -> subprocess.CompletedProcess[str]:
    """kubectl decoding ``text`` as it decodes ``-f`` input, offline (``--local``: no API
    server to ask), and writing the objects back as JSON."""
    env = cli_env(tmp)
    env["KUBECONFIG"] = str(tmp / "no-kubeconfig")
    return subprocess.run(
        [kubectl, "label", "--local", "-f", "-", "-o", "json", "checked=yes"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp,
    )


def objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = doc["items"] if doc.get("kind") == "List" else [doc]
    return items


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_kubectl_reads_slices(fmt: str, kubectl: str, tmp_path: Path) -> None:
    """``slices -o json`` is a v1 List (was a bare array: "cannot unmarshal array into Go
    value of type unstructured.detector"); ``-o yaml`` a document stream."""
    r = toposlice(["slices", "--fake", "dgx-h100", "--node-name", "node-a", "-o", fmt], tmp_path)
    assert r.returncode == 0, r.stderr
    ours = list(yaml.safe_load_all(r.stdout))
    if fmt == "json":
        assert len(ours) == 1 and ours[0]["kind"] == "List" and ours[0]["apiVersion"] == "v1"
        ours = ours[0]["items"]
    read = kubectl_local(kubectl, tmp_path, r.stdout)
    assert read.returncode == 0, read.stderr
    back = objects(json.loads(read.stdout))
    assert [o["kind"] for o in back] == ["ResourceSlice"] * len(ours)
    assert [o["spec"] for o in back] == [o["spec"] for o in ours]


def _forms(slices: list[dict[str, Any]]) -> dict[str, str]:
    """The same slices in every form kubectl reads or writes."""
    return {
        "list-json": json.dumps({"apiVersion": "v1", "kind": "List", "items": slices}),
        "array-json": json.dumps(slices),
        "stream-yaml": yaml.safe_dump_all(slices),
        "list-yaml": yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": slices}),
    }


def test_doctor_reads_every_form(kubectl: str, tmp_path: Path) -> None:
    """``doctor --slices`` takes an object, a List (toposlice's and kubectl's own), a YAML
    stream and an array; all give the same report."""
    r = toposlice(["slices", "--fake", "cpu-2s", "--node-name", "cpu-2s", "-o", "json"], tmp_path)
    assert r.returncode == 0, r.stderr
    slices = json.loads(r.stdout)["items"]
    forms = _forms(slices)
    forms["toposlice-json"] = r.stdout
    forms["kubectl-json"] = kubectl_local(kubectl, tmp_path, r.stdout).stdout
    if len(slices) == 1:
        forms["object-json"] = json.dumps(slices[0])
    reports = {}
    for name, text in forms.items():
        (tmp_path / f"{name}.txt").write_text(text)
        d = toposlice(
            ["doctor", "--fake", "cpu-2s", "--slices", f"{name}.txt", "-o", "json"], tmp_path
        )
        assert d.returncode in (0, 1) and "error" not in d.stderr, (name, d.stderr)
        report = json.loads(d.stdout)
        assert report["summary"]["devices"] == sum(len(s["spec"]["devices"]) for s in slices)
        reports[name] = report
    assert all(r == reports["toposlice-json"] for r in reports.values())


def svg_texts(dot_source: str) -> list[str]:
    """The text elements of the SVG the real ``dot`` draws."""
    dot = shutil.which("dot")
    if dot is None:
        pytest.skip("Graphviz is not installed")
    svg = subprocess.run(
        [dot, "-Tsvg"], input=dot_source, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    root = ET.fromstring(svg)
    return [el.text or "" for el in root.iter("{http://www.w3.org/2000/svg}text")]


def check_two_line_labels(texts: list[str]) -> None:
    assert not [t for t in texts if "\\n" in t], "a label drawn with a literal \\n"
    # GPU0's label is two lines: its name and its model (was one, "GPU0\nNVIDIA H100 ...").
    assert "GPU0" in texts and "NVIDIA H100 80GB HBM3" in texts, texts[:20]


def test_graph_dot_draws_two_line_labels(tmp_path: Path) -> None:
    r = toposlice(["graph", "--fake", "dgx-h100", "-o", "dot"], tmp_path)
    assert r.returncode == 0, r.stderr
    check_two_line_labels(svg_texts(r.stdout))


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[str]:
    """``toposlice serve --fake dgx-h100`` on a free port: its base URL, once ready."""
    proc = subprocess.Popen(
        [*TOPOSLICE, "serve", "--fake", "dgx-h100", "--http-addr", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
        cwd=tmp_path,
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            m = re.search(r"serving on (http://\S+)", line)
            if m:
                url = m.group(1).rstrip("/")
                break
        assert url, "serve did not say where it serves"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_exporter_dot_draws_two_line_labels(serve: str) -> None:
    with urllib.request.urlopen(f"{serve}/v1/topology?format=dot", timeout=30) as resp:
        check_two_line_labels(svg_texts(resp.read().decode()))


def test_score_occupancy_reads_every_form(tmp_path: Path) -> None:
    """``score --occupancy`` takes ResourceClaims as one object, a List, a JSON array and
    a YAML stream; each leaves out the devices the claims hold."""

    def claim(name: str, device: str) -> dict[str, Any]:
        result = {"request": "gpu", "driver": "toposlice.dev", "pool": "dgx-h100"}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "status": {"allocation": {"devices": {"results": [{**result, "device": device}]}}},
        }

    held = ["gpu-0000-1b-00-0", "gpu-0000-43-00-0"]
    claims = [claim(f"c{i}", d) for i, d in enumerate(held)]
    forms = _forms(claims)
    forms["object-yaml"] = yaml.safe_dump(claims[0])
    (tmp_path / "req.yaml").write_text("gpus: 2\n")
    answers = {}
    for name, text in forms.items():
        (tmp_path / f"{name}.txt").write_text(text)
        r = toposlice(
            [*SCORE, "--occupancy", f"{name}.txt", "--top", "20"],
            tmp_path,
        )
        assert r.returncode == 0, (name, r.stderr)
        used = {d for p in json.loads(r.stdout)["placements"] for d in p["devices"]}
        assert not used & set(held[:1] if name == "object-yaml" else held), name
        answers[name] = r.stdout
    assert len({answers[n] for n in answers if n != "object-yaml"}) == 1
