"""``toposlice scorer serve``'s start against an API server that does not answer: from its
very first answer the extender says it is not ready, and a filter call is an Error, never
a pass of every node.

Why: the server used to listen before the informers existed, and a cache with no informers
read as synced. The real kube-scheduler's first call then found no claim for the pod, took
it for a pod that asks for no GPUs and passed every node (a tensor-parallel pod landed on
PCIe: tests/e2e/test_extender_wait.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.e2e.cluster import free_ports

REPO = Path(__file__).resolve().parents[1]

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: dead
  cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: c
  context: {cluster: dead, user: u}
current-context: c
"""


def _first_answer(url: str, deadline: float) -> tuple[int, bytes]:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.005)
    raise AssertionError(f"{url}: no answer")


def test_not_ready_from_the_first_answer_until_the_informers_list(tmp_path: Path) -> None:
    dead, port = free_ports(2)
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(KUBECONFIG % dead)
    argv = [sys.executable, "-m", "toposlice", "scorer", "serve", "--fake", "dgx-h100:n1"]
    argv += ["--http-addr", f"127.0.0.1:{port}"]
    env = {"KUBECONFIG": str(cfg), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        status, body = _first_answer(f"http://127.0.0.1:{port}/readyz", time.monotonic() + 60)
        assert status == 503, body
        assert b"informers not synced" in body and b"ResourceClaim" in body, body
        pod = {
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"resourceClaims": [{"name": "c", "resourceClaimTemplateName": "t"}]},
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/filter",
            data=json.dumps({"Pod": pod, "NodeNames": ["n1"]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.loads(resp.read())
        assert out["NodeNames"] == [] and "not ready" in out["Error"], out
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
