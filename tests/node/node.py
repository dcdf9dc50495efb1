"""A real node for the ``node`` tier: containerd (CDI on) + kubelet + kube-proxy from
``../shared/kube`` (``node/``), joined to a :class:`tests.e2e.cluster.Cluster`.

The processes are started by the tarball's own ``node-up.sh`` (its containerd and
kubelet configuration is what this VM needs: cgroup v1, no CAP_SYS_RESOURCE, no
registry; README there) and ``kube-proxy`` in nftables mode beside them, so that pods
reach the API server at its in-cluster address (10.0.0.1:443), unmodified. Everything is
stopped and the host paths kubelet and containerd hard-code are removed by
``node-down.sh --purge`` in :meth:`Node.stop`, which every path out of the fixture runs.

The control plane differs from the e2e tier's in two flags only (:class:`NodeCluster`):
the API server listens on every address and advertises the node's IP (the in-cluster
Service needs an endpoint the pods can reach), and the node-monitor grace period is the
default 40 s, since a real kubelet renews its Lease every 10 s.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.e2e.cluster import Cluster, poll

#: kube-proxy's flags: nftables mode (Debian's nft), the CNI bridge's pod range.
POD_CIDR = "10.88.0.0/16"
NODE_UP_TIMEOUT_S = 180


def node_ip() -> str | None:
    """The first global IPv4 address (kubelet refuses a loopback node IP)."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    return None


def _existing(path: str) -> str | None:
    return path if Path(path).exists() else None


def missing_prerequisites() -> str | None:
    """One line naming what this host lacks for a real node, or None."""
    if os.geteuid() != 0:
        return "the node tier needs root (kubelet, containerd, mounts)"
    needs = {
        "runc": shutil.which("runc") or _existing("/usr/sbin/runc"),
        "CNI plugins (/usr/lib/cni/bridge)": _existing("/usr/lib/cni/bridge"),
        "nft": shutil.which("nft"),
        "openssl": shutil.which("openssl"),
        "apt-get and dpkg (image build)": shutil.which("apt-get") and shutil.which("dpkg"),
    }
    lacking = [name for name, found in needs.items() if not found]
    if lacking:
        return (
            f"the node tier needs {', '.join(lacking)}: "
            "apt-get install -y runc containernetworking-plugins nftables"
        )
    if node_ip() is None:
        return "the node tier needs a global IPv4 address (kubelet refuses loopback)"
    for path in ("/var/lib/kubelet", "/run/containerd"):
        if Path(path).exists() and any(Path(path).iterdir()):
            return f"{path} is in use: another kubelet/containerd runs on this host"
    return None


class NodeCluster(Cluster):
    """The e2e control plane with the two flags a real node needs (module docstring)."""

    node_address = ""

    def _launch(self, name: str) -> None:
        argv = self._argv[name]
        if name == "kube-apiserver":
            swap = {
                "--bind-address=127.0.0.1": "--bind-address=0.0.0.0",
                "--advertise-address=127.0.0.1": f"--advertise-address={self.node_address}",
                "--endpoint-reconciler-type=none": "--endpoint-reconciler-type=lease",
            }
            self._argv[name] = [swap.get(a, a) for a in argv]
        elif name == "kube-controller-manager":
            self._argv[name] = [
                "--node-monitor-grace-period=40s" if a.startswith("--node-monitor-grace") else a
                for a in argv
            ]
        super()._launch(name)


class Node:
    """One kubelet + containerd node named ``name``; state in ``dir`` (see module doc)."""

    def __init__(self, cluster: Cluster, dir: Path, name: str) -> None:
        self.cluster = cluster
        self.dir = dir.resolve()
        self.name = name
        self.bin = (cluster.assets / "node").resolve()
        self.images = self.dir / "images"
        self.images.mkdir(parents=True, exist_ok=True)
        self.kubelet_dir = self.dir / "kubelet"
        self.cdi_dir = self.dir / "cdi"
        self.socket = self.dir / "run" / "containerd.sock"
        self.logs = self.dir / "logs"
        self.timings: dict[str, float] = {}
        self.started = False

    # ---- start / stop

    def start(self) -> None:
        """Import ``images/*.tar`` (the pause image is copied there), start containerd and
        kubelet, wait for Ready; then kube-proxy."""
        shutil.copy(self.bin / "images" / "pause.tar", self.images / "pause.tar")
        (self.cluster.dir / "ports.env").write_text(f"APISERVER_PORT={self.cluster.api_port}\n")
        env = dict(
            os.environ,
            NODE_NAME=self.name,
            KUBECTL=str(self.cluster.bin / "kubectl"),
            PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin",
        )
        self.started = True
        atexit.register(self.stop)  # before the cluster's own (atexit runs newest first)
        t0 = time.monotonic()
        res = subprocess.run(
            ["bash", str(self.bin / "node-up.sh"), str(self.cluster.dir), str(self.dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=NODE_UP_TIMEOUT_S,
        )
        if res.returncode != 0:
            raise RuntimeError(f"node-up.sh failed: {res.stderr.strip()[-2000:]}")
        self.timings["node_up_s"] = time.monotonic() - t0
        self._start_kube_proxy()

    def _start_kube_proxy(self) -> None:
        log = open(self.logs / "kube-proxy.log", "ab")
        proc = subprocess.Popen(
            [
                str(self.bin / "kube-proxy"),
                f"--kubeconfig={self.cluster.kubeconfig}",
                "--proxy-mode=nftables",
                f"--hostname-override={self.name}",
                f"--cluster-cidr={POD_CIDR}",
                "--conntrack-max-per-core=0",
                "--healthz-bind-address=127.0.0.1:10256",
                "--metrics-bind-address=127.0.0.1:10249",
                "--v=2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        (self.dir / "pids" / "kube-proxy.pid").write_text(f"{proc.pid}\n")

        def synced() -> bool:
            return "SyncProxyRules complete" in self.log_tail("kube-proxy", 200)

        poll(synced, timeout=60, what="kube-proxy's first sync")

    def stop(self) -> None:
        """Delete every pod (so containers stop cleanly), then node-down.sh --purge: stops
        kube-proxy, kubelet and containerd by PID, kills leftover containers, unmounts,
        removes /run/containerd, /var/lib/cni, /var/lib/kubelet, /var/log/pods,
        /var/log/containers and cni0."""
        if not self.started:
            return
        self.started = False
        with contextlib.suppress(Exception):
            self.cluster.kubectl(
                "delete", "pods", "--all", "-A", "--grace-period=5", "--timeout=40s", check=False
            )
        subprocess.run(
            ["bash", str(self.bin / "node-down.sh"), str(self.dir), "--purge"],
            capture_output=True,
            timeout=180,
            check=False,
        )
        for pid in self.leftover_shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def leftover_shims(self) -> list[int]:
        """PIDs of containerd shims of this node still running (a shim can outlive
        containerd when its task was being started as the node went down)."""
        mark = f"-address\0{self.socket}\0".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if mark in (proc / "cmdline").read_bytes() + b"\0":
                    found.append(int(proc.name))
        return found

    # ---- helpers

    def log_tail(self, name: str, lines: int = 50) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def ctr(self, *args: str, timeout: float = 60) -> str:
        res = subprocess.run(
            [str(self.bin / "ctr"), "--address", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args[:3])}: {res.stderr.strip()[-500:]}")
        return res.stdout

    def exec(self, container_id: str, *argv: str) -> str:
        """Run ``argv`` in a running container through containerd (the API server's path
        to the kubelet is not needed)."""
        return self.ctr(
            "tasks", "exec", "--exec-id", f"t{secrets.token_hex(4)}", container_id, *argv
        )

    def kill_container(self, container_id: str) -> None:
        self.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """File name -> spec of every CDI spec in the node's spec directory."""
        out: dict[str, dict[str, Any]] = {}
        for path in sorted(self.cdi_dir.glob("*.json")):
            out[path.name] = json.loads(path.read_text())
        return out
