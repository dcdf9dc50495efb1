"""toposlice installed on the e2e control plane as a user installs it.

:func:`chart_objects` renders ``charts/toposlice`` with ``values-fake.yaml`` through Helm's
Go SDK (as tests/test_chart.py does); :func:`install` applies everything but the
DaemonSet. :class:`NodeDriver` is what the DaemonSet's pod would run on one node:
``toposlice run --fake MACHINE --node-name NODE`` as a process, authenticated as the chart's
ServiceAccount with a token bound to a Pod on that node (so the chart's RBAC and
ValidatingAdmissionPolicy are the ones that apply), registered by the Python kubelet
client (tests/kubelet.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from normalize.deviceclasses import device_classes
from tests.e2e.cluster import FEATURE_GATES, Cluster, free_ports, poll
from tests.kubelet import Registered, register_retrying, run_argv

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "toposlice"
RELEASE = NAMESPACE = "toposlice"
SERVICE_ACCOUNT = "toposlice"
DRIVER = "toposlice.dev"


def chart_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart rendered with ``values`` (default: values-fake.yaml) by Helm's Go SDK."""
    import helm_python as helm

    if values is None:
        values = yaml.safe_load((CHART / "values-fake.yaml").read_text())
    out = helm.Chart.load(str(CHART)).render(
        values, name=RELEASE, namespace=NAMESPACE, is_install=True
    )
    objs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if not path.endswith(".txt"):
            objs.extend(d for d in yaml.safe_load_all(text) if d)
    return objs


#: Kinds the chart renders that are cluster scoped (the rest get the release namespace).
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "DeviceClass",
    "NodeFeatureRule",
}


def cluster_scoped(obj: dict[str, Any]) -> bool:
    return obj["kind"] in CLUSTER_SCOPED or obj["kind"].startswith("ValidatingAdmissionPolicy")


def in_release_namespace(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``objs`` with the release namespace set on each namespaced one (Helm does that at
    install; a rendered chart leaves it out)."""
    for o in objs:
        if not cluster_scoped(o):
            o["metadata"].setdefault("namespace", NAMESPACE)
    return objs


def _namespace_phase(cluster: Cluster, name: str) -> str | None:
    out = cluster.kubectl("get", "namespace", name, "-o", "json", "--ignore-not-found")
    return str(json.loads(out)["status"]["phase"]) if out.strip() else None


def install(cluster: Cluster) -> list[dict[str, Any]]:
    """Create the release namespace and apply the chart but its DaemonSet; the objects.
    A release namespace still terminating (an earlier module's uninstall) is waited for."""
    poll(
        lambda: _namespace_phase(cluster, NAMESPACE) != "Terminating",
        120,
        0.25,
        f"namespace {NAMESPACE} deleted",
    )
    objs = in_release_namespace([o for o in chart_objects() if o["kind"] != "DaemonSet"])
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    cluster.apply(objs)
    return objs


def uninstall(cluster: Cluster, objs: list[dict[str, Any]]) -> None:
    """Delete what :func:`install` applied and the release namespace, and wait for it to
    go: the identity pods (no kubelet will ever confirm their end) are force-deleted."""
    cluster.kubectl("-n", NAMESPACE, "delete", "pod", "--all", "--force", "--grace-period=0")
    for o in objs:
        if cluster_scoped(o):
            cluster.kubectl("delete", o["kind"], o["metadata"]["name"], "--ignore-not-found")
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s")


def published_slices(cluster: Cluster, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    """The ResourceSlices of ``driver`` on ``node``, as the API server holds them."""
    out = cluster.kubectl(
        "get",
        "resourceslices",
        f"--field-selector=spec.nodeName={node},spec.driver={driver}",
        "-o",
        "json",
    )
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


def remove_node_and_slices(cluster: Cluster, node: str) -> None:
    """Delete every driver's ResourceSlices on ``node``, then the Node (a test's cleanup)."""
    cluster.kubectl(
        "delete",
        "resourceslices",
        f"--field-selector=spec.nodeName={node}",
        "--ignore-not-found",
    )
    cluster.remove_node(node)


def _cli_slices_json(machine: str, node: str, *extra: str) -> str:
    argv = [sys.executable, "-m", "toposlice", "-q", "slices", "--fake", machine]
    proc = subprocess.run(
        [*argv, "--node-name", node, "-o", "json", *extra],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return proc.stdout


def cli_slices(machine: str, node: str, *extra: str) -> list[dict[str, Any]]:
    """What ``toposlice slices --fake MACHINE --node-name NODE`` prints."""
    data: list[dict[str, Any]] = json.loads(_cli_slices_json(machine, node, *extra))["items"]
    return data  # a v1 List


def publish_cli_slices(cluster: Cluster, node: str, machine: str) -> None:
    """The admin publishes what ``toposlice slices --fake MACHINE --node-name NODE -o json``
    prints (a v1 List) with kubectl as it is, for tests where no kubelet runs."""
    out = _cli_slices_json(machine, node)
    slices = json.loads(out)["items"]
    cluster.kubectl("create", "-f", "-", input=out)
    poll(lambda: len(published_slices(cluster, node)) == len(slices), 30, 0.2, "slices")


def missing_device_classes(cluster: Cluster, driver: str = DRIVER) -> list[dict[str, Any]]:
    """The driver's DeviceClasses the cluster lacks: the ones a test creates and deletes."""
    existing = json.loads(cluster.kubectl("get", "deviceclasses", "-o", "json"))["items"]
    have = {c["metadata"]["name"] for c in existing}
    return [c for c in device_classes(driver) if c["metadata"]["name"] not in have]


def create_namespace(cluster: Cluster, ns: str) -> None:
    """Create NS and wait for its default ServiceAccount: pods are refused until the
    controller-manager made it."""
    cluster.kubectl("create", "namespace", ns)
    poll(lambda: cluster.kubectl("-n", ns, "get", "sa", "default", "-o", "name"), 30, 0.2)


def tear_down(
    cluster: Cluster, ns: str, nodes: tuple[str, ...], classes: list[dict[str, Any]]
) -> None:
    """Undo a test that made NS, published slices on NODES by hand and created CLASSES
    (from :func:`missing_device_classes`)."""
    cluster.kubectl("-n", ns, "delete", "pod", "--all", "--force", "--grace-period=0")
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    for node in nodes:
        cluster.kubectl("delete", "resourceslices", f"--field-selector=spec.nodeName={node}")
        cluster.remove_node(node)
    for c in classes:
        cluster.kubectl("delete", "deviceclass", c["metadata"]["name"], "--ignore-not-found")


def serve_scorer(cluster: Cluster, name: str, extra: list[str], driver: str = DRIVER) -> int:
    """Spawn ``toposlice scorer serve`` (reading claims as admin) as process NAME with
    EXTRA arguments; returns its port once /readyz answers (its informers have listed: a call
    before that is answered with an Error, which the scheduler goes on without)."""
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "toposlice", "scorer", "serve", "--http-addr"]
    argv += [f"127.0.0.1:{port}", "--driver", driver, *extra]
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    cluster.spawn(name, argv, env=env)
    poll(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200,
        30,
        0.1,
        "scorer /readyz (informers listed)",
    )
    return port


def spawn_extender_scheduler(
    cluster: Cluster,
    name: str,
    port: int,
    where: Path,
    scheduler_name: str | None = None,
    flags: tuple[str, ...] = (),
) -> None:
    """A second kube-scheduler, process NAME, with the profile of
    examples/scheduler/kube-scheduler-config.yaml, its extender at the scorer on PORT (and
    its schedulerName set to SCHEDULER_NAME when given); config written under WHERE."""
    config = yaml.safe_load((REPO / "examples/scheduler/kube-scheduler-config.yaml").read_text())
    if scheduler_name is not None:
        config["profiles"][0]["schedulerName"] = scheduler_name
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
    config["clientConnection"] = {"kubeconfig": str(cluster.dir / "scheduler.kubeconfig")}
    cfg = where / "kube-scheduler-config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    gates = ",".join(f"{g}=true" for g in FEATURE_GATES)
    cluster.spawn(
        name,
        [
            str(cluster.bin / "kube-scheduler"),
            f"--config={cfg}",
            "--secure-port=0",
            f"--feature-gates={gates}",
            *flags,
        ],
    )


def claim_of(cluster: Cluster, ns: str, pod: str) -> dict[str, Any] | None:
    obj = json.loads(cluster.kubectl("-n", ns, "get", "pod", pod, "-o", "json"))
    statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim: dict[str, Any] = json.loads(
        cluster.kubectl(
            "-n", ns, "get", "resourceclaim", statuses[0]["resourceClaimName"], "-o", "json"
        )
    )
    return claim


def pod_outcome(cluster: Cluster, ns: str, pod: str) -> tuple[str, dict[str, Any] | None] | None:
    """("allocated", claim) once the pod is bound with its claim allocated,
    ("unschedulable", claim) once the scheduler said so; None while undecided."""
    obj = json.loads(cluster.kubectl("-n", ns, "get", "pod", pod, "-o", "json"))
    claim = claim_of(cluster, ns, pod)
    if claim is not None and (claim.get("status") or {}).get("allocation"):
        return ("allocated", claim) if obj["spec"].get("nodeName") else None
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return "unschedulable", claim
    return None


def claim_pod(
    name: str, node: str, requests: list[dict[str, Any]], namespace: str
) -> list[dict[str, Any]]:
    """A ResourceClaimTemplate with these requests and a Pod using it, pinned to ``node``
    by nodeSelector (the scheduler still allocates)."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "c", "resourceClaimTemplateName": name}],
            "containers": [
                {"name": "c", "image": "pause", "resources": {"claims": [{"name": "c"}]}}
            ],
        },
    }
    return [template, pod]


class NodeDriver:
    """``toposlice run --fake MACHINE --node-name NODE`` as the chart's ServiceAccount."""

    def __init__(
        self,
        cluster: Cluster,
        node: str,
        machine: str,
        *extra: str,
        resync_s: float = 1.0,
        root: Path | None = None,
    ) -> None:
        """``root``: read this filesystem tree (``--root``, a live host as far as the
        driver knows: link states polled from its sysfs) instead of ``--fake MACHINE``."""
        self.cluster = cluster
        self.node = node
        self.machine = machine
        self.root = root
        self.extra = extra
        self.resync_s = resync_s
        # Unix socket paths must stay short (108 bytes): a folder of its own under $TMPDIR.
        self.base = Path(tempfile.mkdtemp(prefix=f"ts-{node[-12:]}-"))
        self.fake_tmp = self.base / "fake"
        self.fake_tmp.mkdir()
        (self.port,) = free_ports(1)
        self.kubeconfig = cluster.token_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, node)
        self.proc: subprocess.Popen[bytes] | None = None
        self.registered: Registered | None = None

    @property
    def name(self) -> str:
        return f"toposlice-run-{self.node}"

    @property
    def cdi(self) -> Path:
        return self.base / "cdi"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def endpoint(self) -> str:
        assert self.registered is not None
        return str(self.registered.info.endpoint)

    def argv(self) -> list[str]:
        argv = run_argv(
            self.base,
            self.kubeconfig,
            self.node,
            "--http-addr",
            f"127.0.0.1:{self.port}",
            "--resync-interval",
            str(self.resync_s),
            "--startup-timeout",
            "30",
            "--log-level",
            "info",
            *self.extra,
            machine=self.machine,
            cdi_root=self.cdi,
        )
        if self.root is not None:
            at = argv.index("--fake")
            argv[at : at + 2] = ["--root", str(self.root)]
        return argv

    def start(self) -> NodeDriver:
        env = dict(os.environ, TOPOSLICE_FAKE_TMPDIR=str(self.fake_tmp))
        self.proc = self.cluster.spawn(self.name, self.argv(), env=env)
        return self

    def wait_started(self, timeout: float = 60.0) -> NodeDriver:
        """Register as the kubelet does, then wait for /readyz (registered + published)."""
        reg_socket = self.base / "reg" / f"{DRIVER}-reg.sock"
        poll(lambda: reg_socket.exists() or self._dead(), timeout, 0.05, f"{reg_socket}")
        self._dead()
        self.registered = register_retrying(reg_socket, within=timeout)
        poll(lambda: self.http("/readyz")[0] == 200 or self._dead(), timeout, 0.05, "readyz")
        self._dead()
        return self

    def _dead(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited {self.proc.returncode}:\n{self.cluster.log_tail(self.name)}"
            )
        return False

    def http(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def metrics(self) -> str:
        return self.http("/metrics")[1].decode()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.cluster.kill(self.name, sig)
        self.proc = None

    def fake_root(self) -> Path:
        """The fake machine's filesystem tree this process generated."""
        (root,) = [p for p in self.fake_tmp.iterdir() if p.name.startswith("toposlice-fake-")]
        return root

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
