"""The fleet the readers look at: fake nodes, one ``toposlice run --node-feature --nrt`` each
(as the chart's ServiceAccount), and the peers kit's scripts that start and stop nfd-master,
the NodeResourceTopology scheduler and Kueue against the same control plane.

Nothing here re-implements a reader: each runs from ``../shared/peers`` with the kit's own
scripts, configurations and CRDs (NFD's strict NodeFeature schema included).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import Cluster, poll
from tests.e2e.toposlice_setup import NAMESPACE, NodeDriver, chart_objects, in_release_namespace
from tests.interop.peers import run_kit_script

REPO = Path(__file__).resolve().parents[2]
MACHINES = REPO / "discovery" / "fake" / "machines"

#: name -> value, printed in the terminal summary (tests/consumers/conftest.py).
FIGURES: dict[str, Any] = {}

#: The chart's values for the tier: both objects, the NodeFeatureRule for deny mode.
VALUES: dict[str, Any] = {
    "integrations": {
        "nrt": {"enabled": True},
        "nodeFeature": {"enabled": True, "rule": True},
    }
}

DGX = ("cons-dgx-a", "cons-dgx-b")
CLIQUES = {"a": ("cons-tray-a1", "cons-tray-a2"), "b": ("cons-tray-b1", "cons-tray-b2")}


def clique_machine(base: Path, clique: str, clique_id: int) -> Path:
    """The GB200 tray machine with its own NVLink clique: a file per clique (the fabric's
    cluster UUID is derived from the machine's name, the clique id is set here)."""
    text = (MACHINES / "gb200-nvl72-tray.yaml").read_text()
    text, n = re.subn(r"clique_id: \d+", f"clique_id: {clique_id}", text)
    assert n == 1, "the tray machine's fabric clique is no longer where this expects it"
    text = re.sub(r"(?m)^name: .*$", f"name: gb200-clique-{clique}", text)
    path = base / f"gb200-clique-{clique}.yaml"
    path.write_text(text)
    return path


@dataclass
class Fleet:
    cluster: Cluster
    kit: Path
    base: Path
    drivers: dict[str, NodeDriver] = field(default_factory=dict)
    chart: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.base / "run"

    # -- the kit's scripts --------------------------------------------------------------

    def script(self, name: str, *args: str, env: dict[str, str] | None = None) -> float:
        """Run ``scripts/NAME`` with the control plane and run dirs; seconds it took."""
        kubectl = {"KUBECTL": str(self.cluster.bin / "kubectl")}
        return run_kit_script(self.kit, name, list(args), {**kubectl, **(env or {})})

    def up(self, name: str, *flags: str, env: dict[str, str] | None = None) -> float:
        """Start a reader; one more try after a failure: the kit's scripts wait for CRDs
        with ``kubectl wait --for=condition=Established``, which fails instead of waiting
        when it reads a just-created CRD before its first status (``.status.conditions
        accessor error``)."""
        args = (f"{name}-up.sh", str(self.cluster.dir), str(self.run_dir), *flags)
        try:
            return self.script(*args, env=env)
        except RuntimeError as exc:
            print(f"{name}-up.sh failed once, trying again: {exc}")
            self.down(name)
            time.sleep(1)
            return self.script(*args, env=env)

    def down(self, name: str, *args: str) -> None:
        try:
            self.script(f"{name}-down.sh", str(self.run_dir), *args)
        except RuntimeError:
            pass

    def log(self, name: str) -> str:
        path = self.run_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- what the readers decided ------------------------------------------------------

    def node_labels(self, node: str) -> dict[str, str]:
        out = self.cluster.kubectl("get", "node", node, "-o", "json")
        labels: dict[str, str] = json.loads(out)["metadata"].get("labels") or {}
        return labels

    def toposlice_labels(self, node: str) -> dict[str, str]:
        return {k: v for k, v in self.node_labels(node).items() if k.startswith("toposlice.dev/")}

    def node_feature(self, node: str) -> dict[str, Any]:
        out = self.cluster.kubectl(
            "get", "nodefeature", f"toposlice-{node}", "-n", NAMESPACE, "-o", "json"
        )
        obj: dict[str, Any] = json.loads(out)
        return obj

    def get(self, *args: str) -> dict[str, Any] | None:
        out = self.cluster.kubectl("get", *args, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def apply(self, objs: list[dict[str, Any]]) -> None:
        self.cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
        )

    def ensure_labels(self) -> None:
        """nfd-master running (started in its default mode when it is not) and every node
        carrying its NodeFeature's labels."""
        pid = self.run_dir / "pids" / "nfd-master.pid"
        running = pid.exists() and Path(f"/proc/{pid.read_text().strip()}").exists()
        if not running:
            self.up("nfd-master", env={"NFD_CRDS": "none"})
        want = {n: self.node_feature(n)["spec"]["labels"] for n in self.drivers}
        wait(
            lambda: all(self.toposlice_labels(n) == labels for n, labels in want.items()),
            60,
            "toposlice.dev labels on every node",
        )

    def stop(self) -> None:
        for name in ("kueue", "nrt-scheduler", "nfd-master"):
            self.down(name)
        self.down("nrt-scheduler", "cached")
        for d in self.drivers.values():
            d.cleanup()


def wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    return poll(check, timeout, 0.25, what)


def start_fleet(cluster: Cluster, kit: Path, base: Path) -> Fleet:
    """The chart's objects, NFD's strict NodeFeature CRD and the NRT CRD, the nodes, and a
    ``toposlice run --node-feature --nrt`` per node (waited for: registered, published)."""
    fleet = Fleet(cluster, kit, base)
    fleet.run_dir.mkdir(parents=True, exist_ok=True)
    (cluster.dir / "ports.env").write_text(f"APISERVER_PORT={cluster.api_port}\n")
    manifests = kit / "manifests"
    # The strict NodeFeature schema from the start: replacing a CRD under a running
    # nfd-master blinds it (peers README), and the strict one is what must accept us.
    for name in (
        "nfd-crds.yaml",
        "nfd-nodefeature-crd-strict.yaml",
        "noderesourcetopology-crd.yaml",
    ):
        cluster.kubectl("apply", "-f", str(manifests / name))
    for crd in (
        "nodefeatures.nfd.k8s-sigs.io",
        "nodefeaturerules.nfd.k8s-sigs.io",
        "noderesourcetopologies.topology.node.k8s.io",
    ):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    objs = [
        o
        for o in chart_objects(
            {**yaml.safe_load((REPO / "charts/toposlice/values-fake.yaml").read_text()), **VALUES}
        )
        if o["kind"] not in ("DaemonSet", "NodeFeatureRule")
    ]
    cluster.apply(in_release_namespace(objs))
    fleet.chart = objs
    machines: dict[str, str] = {n: "dgx-h100" for n in DGX}
    for i, (clique, nodes) in enumerate(sorted(CLIQUES.items())):
        path = clique_machine(base, clique, 100 + i)
        machines.update({n: str(path) for n in nodes})
    t0 = time.monotonic()
    for node, machine in machines.items():
        cluster.add_node(node, {"kubernetes.io/hostname": node})
        fleet.drivers[node] = NodeDriver(
            cluster,
            node,
            machine,
            "--nrt",
            # Without the kubelet's policy the plugin reads the object as "invalid node
            # topology data" and refuses the node.
            "--topology-manager-policy",
            "single-numa-node",
            "--topology-manager-scope",
            "pod",
            "--node-feature",
            "--node-feature-namespace",
            NAMESPACE,
        ).start()
    for d in fleet.drivers.values():
        d.wait_started(timeout=120)
    # Each driver's token is bound to a Pod on its node: the DaemonSet pod it stands for,
    # which on a real node runs. The harness is the kubelet here: it marks them Running
    # (the NRT plugin resyncs only nodes where it finds a running pod).
    for node in machines:
        cluster.kubectl(
            "patch", "pod", f"toposlice-{node}"[:63], "-n", NAMESPACE, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"phase": "Running"}}),
        )  # fmt: skip
    FIGURES["toposlice run on 6 fake nodes, all ready"] = f"{time.monotonic() - t0:.1f} s"
    return fleet
