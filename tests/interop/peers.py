"""The real neighbours of ``../shared/peers`` (README there), run beside ``toposlice run`` on
a real kubelet + containerd node with NRI, all reading one fake machine.

Nothing here re-implements a peer: the kit's own scripts start and stop them
(``node-up-nri.sh``, ``dracpu-up.sh``...), with the fake tree toposlice writes
(``toposlice machines tree``) as their ``/sys``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.e2e.cluster import SHARED, Cluster, _cache_root, free_ports, poll
from tests.node.node import NodeCluster

PEERS_DIR = SHARED / "peers"
PEER_TARBALLS = (
    "peers-linux-amd64.tar.xz",
    "peers-dranet-linux-amd64.tar.xz",
    "peers-nvidia-linux-amd64.tar.xz",
)
DRIVER = "toposlice.dev"
NS = "default"
PAUSE = "registry.k8s.io/pause:3.10.2"

#: name -> value, printed in the terminal summary (tests/interop/conftest.py).
FIGURES: dict[str, Any] = {}


def find_peers(cache: Path | None = None) -> Path | None:
    """The unpacked kit (``<cache>/peers``, beside ``assets/`` and ``node/``, where its
    scripts look for kubectl and node-up.sh), unpacking it once; None without the main
    tarball."""
    cache = cache or _cache_root()
    done = cache / "peers" / "bin" / "dracpu"
    if done.is_file():
        return cache / "peers"
    main = PEERS_DIR / PEER_TARBALLS[0]
    if not main.is_file():
        return None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".peers-", dir=cache))
    try:
        for name in PEER_TARBALLS:  # the later ones unpack over the first's folder
            if (PEERS_DIR / name).is_file():
                subprocess.run(["tar", "-xJf", str(PEERS_DIR / name), "-C", str(tmp)], check=True)
        with contextlib.suppress(OSError):  # another process renamed first: keep theirs
            os.rename(tmp / "peers", cache / "peers")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cache / "peers" if done.is_file() else None


def kit_or_skip() -> Path:
    """The unpacked kit, or skip the test saying what is missing (the tiers' ``kit``
    fixture)."""
    import pytest

    found = find_peers()
    if found is None:
        pytest.skip("the peers kit is missing: ../shared/peers/peers-linux-amd64.tar.xz")
    return found


def report_figures(terminalreporter: Any, title: str, figures: dict[str, Any]) -> None:
    """A tier's figures, one line each, at the end of the run."""
    if figures:
        terminalreporter.section(title)
        for key, value in figures.items():
            terminalreporter.write_line(f"{key}: {value}")


def run_kit_script(
    kit: Path, name: str, args: list[str], env: dict[str, str], timeout: float = 240
) -> float:
    """Run the kit's ``scripts/NAME`` with ``args`` and ``env`` over this process's; the
    seconds it took. A failure raises with the end of its output."""
    t0 = time.monotonic()
    res = subprocess.run(
        ["bash", str(kit / "scripts" / name), *args],
        env={**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if res.returncode != 0:
        raise RuntimeError(f"{name} failed: {(res.stderr or res.stdout).strip()[-2000:]}")
    return time.monotonic() - t0


class StockCluster(NodeCluster):
    """The node tier's control plane with the list-attribute gate off, as v1.36 clusters
    run it: claims must align across drivers without ``DRAListTypeAttributes``."""

    def _launch(self, name: str) -> None:
        self._argv[name] = [
            a.replace("DRAListTypeAttributes=true", "DRAListTypeAttributes=false")
            for a in self._argv[name]
        ]
        super()._launch(name)


class Peer:
    """One peer started by the kit's ``<name>-up.sh`` and stopped by ``<name>-down.sh``."""

    def __init__(self, kit: Path, cluster: Cluster, node_dir: Path, run_dir: Path) -> None:
        self.kit = kit
        self.cluster = cluster
        self.node_dir = node_dir
        self.run_dir = run_dir

    def env(self, node_name: str, fake_sys: Path | None) -> dict[str, str]:
        env = dict(
            os.environ,
            NODE_NAME=node_name,
            KUBECTL=str(self.cluster.bin / "kubectl"),
            PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin",
        )
        if fake_sys is not None:
            env["FAKE_SYS"] = str(fake_sys)
        return env

    def up(
        self,
        name: str,
        node_name: str,
        fake_sys: Path | None,
        *flags: str,
        env: dict[str, str] | None = None,
    ) -> float:
        """Start ``name`` (its script waits for its slices); seconds it took. ``env``: more
        of the script's settings (``MOCK_NVML_CONFIG``)."""
        args = [str(self.cluster.dir), str(self.node_dir), str(self.run_dir), *flags]
        return run_kit_script(
            self.kit,
            f"{name}-up.sh",
            args,
            {**self.env(node_name, fake_sys), **(env or {})},
            timeout=180,
        )

    def down(self, name: str) -> None:
        subprocess.run(
            ["bash", str(self.kit / "scripts" / f"{name}-down.sh"), str(self.run_dir)],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def log(self, name: str) -> str:
        path = self.run_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class ToposliceRun:
    """``toposlice run`` as a process of this host, registered with the node's kubelet
    (its registration, plugin and CDI directories), reading fake machine ``machine``."""

    def __init__(self, cluster: Cluster, node_dir: Path, node_name: str, machine: str) -> None:
        self.cluster = cluster
        self.node_dir = node_dir
        self.node_name = node_name
        self.machine = machine
        self.proc: subprocess.Popen[bytes] | None = None
        (self.port,) = free_ports(1)
        self.log_path = node_dir / "logs" / "toposlice-run.log"

    @property
    def plugins_dir(self) -> Path:
        return self.node_dir / "kubelet" / "plugins" / DRIVER

    def start(self, *extra: str) -> ToposliceRun:
        argv = [
            sys.executable,
            "-m",
            "toposlice",
            "run",
            "--fake",
            self.machine,
            "--node-name",
            self.node_name,
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--kubelet-registrar-directory-path",
            str(self.node_dir / "kubelet" / "plugins_registry"),
            "--kubelet-plugins-directory-path",
            str(self.plugins_dir),
            "--cdi-root",
            str(self.node_dir / "cdi"),
            "--http-addr",
            f"127.0.0.1:{self.port}",
            "--resync-interval",
            "1",
            *extra,
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        poll(lambda: self.http("/readyz").startswith("ok"), timeout=60, what="toposlice ready")
        return self

    def topology_file(self, claim_uid: str) -> Path:
        """The NCCL topology file ``run`` wrote at prepare for a claim (state dir: the
        plugins directory)."""
        return self.plugins_dir / "nccl" / f"{claim_uid}.xml"

    def http(self, path: str) -> str:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"toposlice run exited: {self.log_tail()}") from None
            return ""

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None


def slices_of(cluster: Cluster, node: str, driver: str | None = None) -> list[dict[str, Any]]:
    selector = f"spec.nodeName={node}" + (f",spec.driver={driver}" if driver else "")
    out = cluster.kubectl("get", "resourceslices", "--field-selector", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def toposlice(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toposlice", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
    )


class Scenario:
    """One fake machine on the node: its tree, the peers on it, ``toposlice run``, and the
    claims (each with a pod: the scheduler allocates claims for pods) made meanwhile."""

    def __init__(self, node: Any, kit: Path, machine: str, base: Path) -> None:
        self.node = node
        self.cluster: Cluster = node.cluster
        self.machine = machine
        self.tree = base / "tree"
        self.peer = Peer(kit, node.cluster, node.dir, base / "run")
        self.run = ToposliceRun(node.cluster, node.dir, node.name, machine)
        self.claims: list[str] = []

    def scheduler_attempts(self) -> tuple[float, int]:
        """kube-scheduler's (seconds, attempts) of scheduling so far (its /metrics)."""
        import ssl
        import urllib.request

        from bench.claim_worst_case_real import attempt_totals

        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed
        pki = self.cluster.pki
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        url = f"https://127.0.0.1:{self.cluster.sched_port}/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
            return attempt_totals(resp.read().decode())

    def devices(self, driver: str) -> dict[str, dict[str, Any]]:
        """Name -> device of ``driver``'s slices of this node, as the API server has them."""
        return devices_of(slices_of(self.cluster, self.node.name, driver))

    def doctor(self, *args: str) -> tuple[int, dict[str, Any]]:
        """``toposlice doctor -o json`` on this machine and node: (exit status, report)."""
        res = toposlice(
            "doctor", "--fake", self.machine, "--node-name", self.node.name, "-o", "json",
            "--plugins-registry", str(self.node.dir / "kubelet" / "plugins_registry"), *args,
            check=False,
        )  # fmt: skip
        assert res.returncode in (0, 1), res.stderr
        report: dict[str, Any] = json.loads(res.stdout)
        return res.returncode, report

    def write_tree(self) -> None:
        toposlice("machines", "tree", self.machine, "--to", str(self.tree))

    def device_classes(self) -> None:
        """toposlice's DeviceClasses (the chart installs them)."""
        text = toposlice("claim", "--gpus", "1", "--nics-per-gpu", "1", "--cpu-groups", "1")
        self.cluster.kubectl("apply", "-f", "-", input=text.stdout)

    def release_all(self) -> None:
        for name in self.claims:
            self.cluster.kubectl(
                "delete",
                "pod,resourceclaim",
                name,
                "-n",
                NS,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=60s",
                check=False,
            )
        self.claims.clear()

    def drop_slices(self, *drivers: str) -> None:
        for driver in drivers:
            self.cluster.kubectl(
                "delete",
                "resourceslices",
                "--field-selector",
                f"spec.nodeName={self.node.name},spec.driver={driver}",
                check=False,
            )

    def claim(self, name: str, spec: dict[str, Any]) -> None:
        """A ResourceClaim and a pod using it (the scheduler allocates claims for pods)."""
        self.claims.append(name)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "c", "resourceClaimName": name}],
                "containers": [
                    {"name": "c", "image": PAUSE, "resources": {"claims": [{"name": "c"}]}}
                ],
            },
        }
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }
        self.cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim, pod]}),
        )

    def allocation(self, name: str) -> dict[str, Any] | None:
        out = self.cluster.kubectl(
            "get", "resourceclaim", name, "-n", NS, "-o", "json", "--ignore-not-found"
        )
        return json.loads(out).get("status", {}).get("allocation") if out.strip() else None

    def delete(self, name: str) -> None:
        """Delete the pod and claim, then wait for the kubelet's unprepare (seen as
        toposlice's devices no longer prepared): until then the kubelet refuses a new claim
        given the same devices ("overlapping device assignment")."""
        alloc = self.allocation(name) or {}
        mine = [
            r["device"]
            for r in (alloc.get("devices") or {}).get("results") or []
            if r["driver"] == "toposlice.dev"
        ]
        self.cluster.kubectl("delete", "pod,resourceclaim", name, "-n", NS, "--wait=true")
        self.claims.remove(name)

        def released() -> bool:
            text = self.run.http("/metrics")
            return all(f'toposlice_device_allocated{{device="{d}"}} 0.0' in text for d in mine)

        poll(released, timeout=60, what=f"claim {name} unprepared")
        # The scheduler learns of the deletion from its own watch: give it a moment, or the
        # next claim may still find these devices taken and get others (an example's
        # expected devices are those of an empty node).
        time.sleep(1.0)

    def wait_allocated(self, name: str) -> list[dict[str, Any]]:
        alloc = poll(lambda: self.allocation(name), timeout=60, what=f"claim {name} allocated")
        results: list[dict[str, Any]] = alloc["devices"]["results"]
        return results

    def unschedulable(self, name: str) -> str:
        out = self.cluster.kubectl("get", "pod", name, "-n", NS, "-o", "json")
        for cond in json.loads(out).get("status", {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message", ""))
        return ""


def expected_lines(path: Path) -> dict[str, dict[str, list[str]]]:
    """An example's ``#   machine: request = device device; request = device`` comment lines:
    machine -> request (without its rung) -> devices."""
    import re

    out: dict[str, dict[str, list[str]]] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^#\s{2,}([a-z0-9-]+): ([a-z0-9-]+ = .+)$", line)
        if m:
            parts = dict(p.split(" = ") for p in m.group(2).split("; "))
            out[m.group(1)] = {k: v.split() for k, v in parts.items()}
    return out


def by_request(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Allocation results as request (without its rung) -> sorted devices."""
    out: dict[str, list[str]] = {}
    for r in results:
        out.setdefault(r["request"].split("/")[0], []).append(r["device"])
    return {k: sorted(v) for k, v in out.items()}
