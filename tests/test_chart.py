"""charts/toposlice rendered by real Helm (its Go SDK through ``helm-python-sdk``), checked
against the Kubernetes schemas and against what ``toposlice run`` actually uses.

- default, fake and all-options values render, lint clean (strict) and every object
  validates against the newest schemas ``kubernetes-validate`` ships (strict);
- a schema violation in values is refused with a message naming the key;
- the DeviceClasses are exactly normalize/deviceclasses.py's;
- the DaemonSet's command line parses with the real ``toposlice run`` parser, and each
  directory flag points at a mounted host path (writable where the driver writes);
- the ClusterRole grants exactly the Kubernetes API calls found in the driver's code;
- the ValidatingAdmissionPolicy's CEL, evaluated by a CEL library, admits the node
  plugin's writes of its own node's slices (the ones ``toposlice slices`` prints) and
  refuses another node's.
"""

from __future__ import annotations

import ast
import copy
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) not installed")
cel = pytest.importorskip("cel", reason="common-expression-language (a dependency) not installed")

import kubernetes_validate  # noqa: E402
from kubernetes_validate.utils import latest_version  # noqa: E402

from normalize.deviceclasses import DEVICE_KINDS, device_classes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "toposlice"
RELEASE, NAMESPACE = "toposlice", "toposlice"
SA_USER = f"system:serviceaccount:{NAMESPACE}:toposlice"
# Kinds of CRDs the chart may render; kubernetes-validate ships only built-in schemas.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureRule"),
}

ALL_OPTIONS: dict[str, Any] = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "scorer": {"enabled": True, "scheduler": {"enabled": True}},
    "image": {"digest": "sha256:" + "ab" * 32},
    "privileged": True,
    "runtimeClassName": "nvidia",
    "hostNetwork": True,
    "http": {"bindAddress": "::"},
    "integrations": {
        "nrt": {
            "enabled": True,
            "installCRD": True,
            "topologyManagerPolicy": "restricted",
            "topologyPolicies": True,
        },
        "nodeFeature": {"enabled": True, "installCRD": True, "rule": True},
    },
}


def fake_values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values-fake.yaml").read_text())
    return data


VARIANTS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "fake": fake_values(),
    "all-options": ALL_OPTIONS,
    "observe": {"observe": True},
    "beside-vendor-gpu-driver": {"publish": ["nic", "cpu"]},
    "nvml-driver-root": {"nvml": {"driverRoot": {"enabled": True, "path": "/run/nvidia/driver"}}},
}


@cache
def _chart() -> Any:
    return helm.Chart.load(str(CHART))


def render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = _chart().render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    objs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith(".txt"):
            continue
        objs.extend(d for d in yaml.safe_load_all(text) if d)
    return objs


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"want one {kind} {name or ''}, rendered {len(found)}"
    return found[0]


def node_plugin(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


# -- render, lint, schemas ----------------------------------------------------------------


def test_chart_metadata_matches_the_package() -> None:
    meta = _chart().metadata
    assert meta["apiVersion"] == "v2"
    project = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', project, re.M)
    assert version is not None
    assert meta["appVersion"] == version.group(1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_lint_is_clean(variant: str) -> None:
    report = helm.lint(str(CHART), copy.deepcopy(VARIANTS[variant]), strict=True)
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == [], serious


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates(variant: str) -> None:
    version = latest_version()
    objs = render(VARIANTS[variant])
    assert objs
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            assert obj["metadata"]["name"] and obj["spec"]
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_all_options_render_the_optional_objects() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(ALL_OPTIONS)}
    assert ("ServiceMonitor", "toposlice") in kinds
    assert ("Deployment", "toposlice-scorer") in kinds
    assert ("Deployment", "toposlice-scheduler") in kinds
    assert ("ConfigMap", "toposlice-scheduler-config") in kinds
    default = {(o["kind"], o["metadata"]["name"]) for o in render(None)}
    assert not any(k in ("ServiceMonitor", "Deployment", "ConfigMap") for k, _ in default)


@pytest.mark.parametrize(
    ("values", "where", "what"),
    [
        ({"publish": ["gpu", "tpu"]}, "/publish/1", "must be one of"),
        ({"deviceMetadata": {"versions": ["v2"]}}, "/deviceMetadata/versions/0", "must be one of"),
        ({"logging": {"level": "loud"}}, "/logging/level", "must be one of"),
        ({"driverName": "Bad_Driver"}, "/driverName", "does not match pattern"),
        ({"http": {"port": 70000}}, "/http/port", "maximum"),
        ({"sevice": {"enabled": True}}, "additional properties 'sevice'", "not allowed"),
        ({"host": {"kubeletDir": "relative/dir"}}, "/host/kubeletDir", "pattern"),
    ],
)
def test_schema_violation_is_refused_with_the_key(
    values: dict[str, Any], where: str, what: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    message = str(err.value)
    assert where in message and what in message, message


# -- DeviceClasses ------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["toposlice.dev", "topo.example.com"])
def test_device_classes_are_the_normalize_ones(driver: str) -> None:
    rendered = [o for o in render({"driverName": driver}) if o["kind"] == "DeviceClass"]
    want = device_classes(driver)
    assert len(rendered) == len(want) == len(DEVICE_KINDS) + 1
    for got, exp in zip(rendered, want, strict=True):
        assert got["apiVersion"] == exp["apiVersion"] and got["kind"] == exp["kind"]
        assert got["metadata"]["name"] == exp["metadata"]["name"]
        assert got["spec"] == exp["spec"]


def test_device_classes_follow_publish_and_observe() -> None:
    beside = render({"publish": ["nic", "cpu"]})
    names = [o["metadata"]["name"] for o in beside if o["kind"] == "DeviceClass"]
    assert names == ["nic.toposlice.dev", "cpu.toposlice.dev", "device.toposlice.dev"]
    assert not [o for o in render({"observe": True}) if o["kind"] == "DeviceClass"]


# -- the DaemonSet against `toposlice run` ------------------------------------------------


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of container args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)


def container_env(c: dict[str, Any], node: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, e
            env[e["name"]] = node
    return env


def flag_values(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in args:
        if a.startswith("--"):
            k, _, v = a.partition("=")
            out[k] = v
    return out


def mounts(spec: dict[str, Any]) -> dict[str, tuple[str | None, bool]]:
    """Container mount path -> (host path or None, read-only)."""
    (c,) = spec["containers"]
    vols = {v["name"]: v for v in spec["volumes"]}
    out: dict[str, tuple[str | None, bool]] = {}
    for m in c["volumeMounts"]:
        host = vols[m["name"]].get("hostPath", {}).get("path")
        out[m["mountPath"]] = (host, bool(m.get("readOnly")))
    return out


def command_parser(command: str) -> Any:
    """The real argparse parser of ``toposlice <command>``; skip while it does not exist."""
    import importlib.util

    from toposlice import cli

    if command not in cli.MODULE_COMMANDS:
        pytest.skip(f"`toposlice {command}` is not registered in toposlice/cli.py yet")
    module = cli.MODULE_COMMANDS[command][0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"`toposlice {command}` is registered but {module} does not exist yet")
    return cli.build_parser(command)


def parsed_command(spec: dict[str, Any], node: str = "node-a") -> tuple[str, Any]:
    """(command, argparse namespace) of the node plugin container, after Kubernetes'
    ``$(VAR)`` expansion, through the real ``toposlice`` parser of that command."""
    (c,) = spec["containers"]
    assert c["command"] == ["toposlice"]
    env = container_env(c, node)
    args = [expand(a, env) for a in c["args"]]
    ns = command_parser(args[0]).parse_args(args)
    assert ns.command == args[0]
    return args[0], ns


def run_config(spec: dict[str, Any]) -> Any:
    """The daemon's :class:`DaemonConfig`, built by the driver's own ``load_config`` from the
    DaemonSet's command line and environment (as the container would see them)."""
    command, ns = parsed_command(spec)
    assert command == "run"
    config = pytest.importorskip("driver.config", reason="driver/config.py not there yet")
    from toposlice.sources import host_root, normalize_options

    (c,) = spec["containers"]
    root = container_env(c, "node-a").get("HOST_ROOT")
    # In its pod the kubelet sets these (no --kubeconfig: the in-cluster config is used).
    pod_env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in pod_env.items():
            mp.setenv(key, value)
        return config.load_config(
            ns, host_root(ns.root or root), not ns.fake, normalize_options(ns)
        )


def dir_flags() -> list[str]:
    """The ``toposlice run`` options that name a directory (metavar DIR) of the driver."""
    parser = command_parser("run")
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    run = sub.choices["run"]
    group = next(g for g in run._action_groups if g.title == "driver")
    return [a.option_strings[0] for a in group._group_actions if a.metavar == "DIR"]


@pytest.mark.parametrize(
    "variant", ["default", "fake", "all-options", "beside-vendor-gpu-driver", "nvml-driver-root"]
)
def test_daemonset_command_line_is_a_valid_toposlice_run(variant: str) -> None:
    values = VARIANTS[variant] or {}
    cfg = run_config(node_plugin(render(values)))
    assert cfg.node_name == "node-a"
    assert cfg.driver_name == "toposlice.dev"
    assert cfg.kubeconfig is None  # in-cluster service account
    assert cfg.publish == frozenset(values.get("publish", ["gpu", "nic", "cpu"]))
    assert cfg.log_format == "json"
    assert cfg.live is not bool(values.get("fake"))


@pytest.mark.parametrize(
    ("values", "enabled", "versions"),
    [
        ({}, True, ("v1alpha1",)),
        ({"deviceMetadata": {"enabled": False}}, False, ("v1alpha1",)),
        ({"deviceMetadata": {"versions": ["v1beta1", "v1alpha1"]}}, True, ("v1beta1", "v1alpha1")),
    ],
)
def test_device_metadata_values_reach_the_driver(
    values: dict[str, Any], enabled: bool, versions: tuple[str, ...]
) -> None:
    """KEP-5304 files, on by default; their host directory is under the plugin directory,
    which is mounted at its host path (the CDI mount's hostPath is resolved on the host)."""
    spec = node_plugin(render(values))
    cfg = run_config(spec)
    assert (cfg.device_metadata, cfg.device_metadata_versions) == (enabled, versions)
    assert mounts(spec)[cfg.plugins_dir] == (cfg.plugins_dir, False)


@pytest.mark.parametrize("variant", ["default", "fake", "all-options", "nvml-driver-root"])
def test_daemonset_mounts_what_toposlice_run_uses(variant: str) -> None:
    values = VARIANTS[variant] or {}
    spec = node_plugin(render(values))
    cfg = run_config(spec)
    (c,) = spec["containers"]
    flags = flag_values(c["args"])
    mounted = mounts(spec)
    # Every directory option of `toposlice run` is set explicitly (not left to a default
    # that might not be mounted).
    assert set(dir_flags()) <= set(flags), sorted(set(dir_flags()) - set(flags))
    # Sockets, CDI specs and the checkpoint are written: host paths at the same path inside
    # (kubelet and the runtime resolve them on the host), writable.
    written = {cfg.registrar_dir, cfg.plugins_dir, cfg.cdi_root, cfg.state_dir}
    for path in written:
        assert mounted.get(path) == (path, False), f"{path} is not a writable host mount"
    assert cfg.plugins_dir == "/var/lib/kubelet/plugins/toposlice.dev"
    assert cfg.registrar_dir == "/var/lib/kubelet/plugins_registry"
    # Everything else from the host is read-only.
    assert {m for m, (host, ro) in mounted.items() if host and not ro} == written
    env = container_env(c, "node-a")
    if values.get("fake"):
        assert "HOST_ROOT" not in env
        assert not [m for m, (host, _) in mounted.items() if host in ("/sys", "/proc")]
    else:
        assert cfg.root == env["HOST_ROOT"]
        assert mounted[f"{cfg.root}/sys"] == ("/sys", True)
        # The checkpoint's boot id: <root>/proc/sys/kernel/random/boot_id.
        assert mounted[f"{cfg.root}/proc"] == ("/proc", True)
        assert mounted[f"{cfg.root}/etc/hostname"] == ("/etc/hostname", True)
    # The HTTP server listens on the container port the probes and the Service use.
    port = int(cfg.http_addr.rsplit(":", 1)[1])
    assert [p["containerPort"] for p in c["ports"] if p["name"] == "http"] == [port]


def env_vars_read() -> set[str]:
    """Environment variables the code reads: ``os.environ.get("X")``, ``os.getenv("X")``,
    ``os.environ["X"]`` and driver/config.py's ``_env("X")``."""
    names: set[str] = set()
    for pkg in ("toposlice", "driver", "discovery"):
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                arg: ast.AST | None = None
                if isinstance(node, ast.Call) and node.args:
                    f = node.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                    if name in ("get", "getenv", "_env"):
                        arg = node.args[0]
                elif isinstance(node, ast.Subscript):
                    if ast.unparse(node.value) == "os.environ":
                        arg = node.slice
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
    return names


@pytest.mark.parametrize("variant", ["default", "fake", "observe"])
def test_daemonset_env_is_read_by_the_code(variant: str) -> None:
    (c,) = node_plugin(render(VARIANTS[variant]))["containers"]
    command_parser(c["args"][0])  # skips while that command does not exist
    expanded = set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(c["args"])))
    unread = {e["name"] for e in c["env"]} - env_vars_read() - expanded
    assert not unread, f"environment neither the code nor the args use: {sorted(unread)}"


def test_fake_values_run_on_nodes_without_accelerator_labels() -> None:
    """values-fake.yaml is for nodes with no accelerator labels: its DaemonSet must have no
    node affinity left over from the defaults (Helm merges a `{}` into the default map;
    only null removes it), while the default values keep the accelerator affinity."""
    terms = node_plugin(render(None))["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert any(e["key"] == "nvidia.com/gpu.present" for t in terms for e in t["matchExpressions"])
    fake = node_plugin(render(fake_values()))
    assert "affinity" not in fake
    assert "nodeSelector" not in fake
    assert "affinity" in node_plugin(render({"fake": "dgx-h100", "affinity": {}})), (
        "Helm no longer merges {} into defaults: values-fake.yaml may use {} again"
    )


def test_live_daemonset_mounts_host_dev_for_cdi_device_nodes() -> None:
    """CDI specs name only device nodes that exist under <host root>/dev (containerd
    refuses a container with a missing one): the live DaemonSet mounts the host's /dev
    there read-only; fake hardware has no device nodes and mounts nothing."""
    spec = node_plugin(render(None))
    (c,) = spec["containers"]
    host_root = container_env(c, "node-a")["HOST_ROOT"]
    vols = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == f"{host_root}/dev"]
    assert mount["readOnly"] is True
    assert vols[mount["name"]]["hostPath"]["path"] == "/dev"
    fake = node_plugin(render(fake_values()))
    assert not [v for v in fake["volumes"] if (v.get("hostPath") or {}).get("path") == "/dev"]


def test_vendor_cdi_spec_dirs_are_mounted_read_only_where_the_driver_reads_them() -> None:
    """`--cdi-spec-dirs` (plus `--cdi-root`, mounted writable once) are the host's
    directories at the same paths, read-only: the ids the driver hands out resolve against
    what the runtime reads."""
    for values in (None, fake_values(), {"host": {"cdiSpecDirs": ["/etc/cdi", "/opt/cdi"]}}):
        spec = node_plugin(render(values))
        cfg = run_config(spec)
        mounted = mounts(spec)
        assert cfg.cdi_spec_dirs[-1] == cfg.cdi_root
        for d in cfg.cdi_spec_dirs[:-1]:
            assert mounted[d] == (d, True), d
        assert mounted[cfg.cdi_root] == (cfg.cdi_root, False)
    spec = node_plugin(render({"host": {"cdiSpecDirs": []}}))
    assert run_config(spec).cdi_spec_dirs == ("/var/run/cdi",)


def test_nvml_driver_root_mode() -> None:
    """Off by default; on, it does what the NVIDIA DRA driver's chart does for its NVML:
    the host's driver root read-only at /driver-root (HostToContainer), the variable the
    nvidia probe loads libnvidia-ml.so.1 from, NVIDIA_VISIBLE_DEVICES=void, privileged."""
    (c,) = node_plugin(render(None))["containers"]
    assert c["securityContext"]["privileged"] is False
    assert "NVIDIA_DRIVER_ROOT" not in container_env(c, "node-a")
    assert "/driver-root" not in mounts(node_plugin(render(None)))
    from plugins.nvidia import DRIVER_ROOT_ENV

    spec = node_plugin(render(VARIANTS["nvml-driver-root"]))
    (c,) = spec["containers"]
    env = container_env(c, "node-a")
    assert env[DRIVER_ROOT_ENV] == "/driver-root" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert mounts(spec)["/driver-root"] == ("/run/nvidia/driver", True)
    (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/driver-root"]
    assert m["mountPropagation"] == "HostToContainer"
    assert c["securityContext"]["privileged"] is True
    assert "capabilities" not in c["securityContext"]
    assert "allowPrivilegeEscalation" not in c["securityContext"]
    # Observe mode runs no NVML of the driver's: the mode adds nothing there.
    observe = node_plugin(render({"observe": True, **VARIANTS["nvml-driver-root"]}))
    assert "/driver-root" not in mounts(observe)


def test_daemonset_node_name_comes_from_the_downward_api() -> None:
    (c,) = node_plugin(render(None))["containers"]
    (node_env,) = [e for e in c["env"] if e["name"] == "NODE_NAME"]
    assert node_env["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "--node-name=$(NODE_NAME)" in c["args"]


@pytest.mark.parametrize("variant", ["default", "all-options"])
def test_daemonset_ports_probes_and_scheduling(variant: str) -> None:
    objs = render(VARIANTS[variant])
    ds = one(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    flags = flag_values(c["args"])
    port = int(flags["--http-addr"].rsplit(":", 1)[1])
    (http,) = c["ports"]
    assert (http["name"], http["containerPort"], http["protocol"]) == ("http", port, "TCP")
    assert http.get("hostPort", port) == port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    svc = one(objs, "Service", "toposlice")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    if variant == "all-options":
        assert flags["--http-addr"] == f"[::]:{port}"
        sm = one(objs, "ServiceMonitor")
        assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


def test_observe_mode_writes_nothing() -> None:
    objs = render({"observe": True})
    spec = node_plugin(objs)
    role = one(objs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}
    ]
    assert not [o for o in objs if o["kind"] == "DeviceClass"]
    mounted = mounts(spec)
    assert not [m for m, (host, ro) in mounted.items() if host and not ro]
    command, ns = parsed_command(spec)
    assert command == "serve" and ns.observe is True
    assert ns.node_name == "node-a" and ns.driver == "toposlice.dev"
    assert mounted[ns.plugins_registry] == (ns.plugins_registry, True)


def test_scorer_is_wired_as_scheduler_extender() -> None:
    objs = render(ALL_OPTIONS)
    dep = one(objs, "Deployment", "toposlice-scorer")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["toposlice"] and c["args"][:2] == ["scorer", "serve"]
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    svc = one(objs, "Service", "toposlice-scorer")
    port = svc["spec"]["ports"][0]["port"]
    config = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == f"http://toposlice-scorer.{NAMESPACE}.svc:{port}"
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    # It fetches each node's graph from the node plugin's port on the node's address.
    url = flag_values(c["args"])["--topology-url"]
    (ds_port,) = node_plugin(objs)["containers"][0]["ports"]
    assert url == f"http://{{address}}:{ds_port['hostPort']}/v1/topology"
    assert ds_port["hostPort"] == ds_port["containerPort"]
    sched = one(objs, "Deployment", "toposlice-scheduler")
    tmpl = sched["spec"]["template"]["spec"]
    assert tmpl["volumes"][0]["configMap"]["name"] == "toposlice-scheduler-config"


def test_scorer_command_line_parses_with_toposlice_scorer() -> None:
    dep = one(render(ALL_OPTIONS), "Deployment", "toposlice-scorer")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    ns = command_parser("scorer").parse_args(c["args"])
    assert ns.command == "scorer"


# -- RBAC against the API calls in the driver's code --------------------------------------

_CLIENT_METHOD = re.compile(
    r"^(list|read|create|replace|patch|delete)_(?:namespaced_)?([a-z_]+?)"
    r"(?:_status|_for_all_namespaces)?$"
)
_VERB = {"read": "get", "replace": "update"}
_HTTP_VERB = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_PLURAL = {
    "resource_slice": "resourceslices",
    "resource_claim": "resourceclaims",
    "resource_claim_template": "resourceclaimtemplates",
    "node": "nodes",
}
_GROUP = {
    "resourceslices": "resource.k8s.io",
    "resourceclaims": "resource.k8s.io",
    "resourceclaimtemplates": "resource.k8s.io",
    "nodes": "",
    # The Node Events of driver/health/nvml_gap.py (the fake GPUs have no vendor CDI spec).
    "events": "",
}


def driver_sources() -> Iterator[Path]:
    for path in sorted((REPO / "driver").rglob("*.py")):
        # topology_objects.py builds its paths per kind, off by default: its calls are
        # recorded and compared with the optional grants in tests/test_topology_objects.py.
        # node_pods.py (the NRT's pods fingerprint) likewise: tests/test_topology_objects.py.
        if path.name in ("topology_objects.py", "node_pods.py"):
            continue
        if "gen" not in path.relative_to(REPO / "driver").parts:
            yield path
    yield from sorted((REPO / "toposlice").glob("cmd_run*.py"))


def scorer_sources() -> Iterator[Path]:
    yield from sorted((REPO / "scorer").rglob("*.py"))
    yield from sorted((REPO / "toposlice").glob("cmd_scorer*.py"))


def api_calls(sources: Iterator[Path] | None = None) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every Kubernetes API call in the driver's code: typed
    client methods (``list_resource_slice``), watches over them (streamed, or handed to an
    ``Informer``, which lists and watches), ``collection_lister(client, PATH)`` (list and
    watch of PATH), and raw
    ``request_json(client, "GET", "/api/v1/nodes/...")`` calls."""
    found: set[tuple[str, str, str]] = set()
    for path in driver_sources() if sources is None else sources:
        tree = ast.parse(path.read_text(), str(path))
        assigned = {
            t.id: ast.unparse(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        wrappers = {"request_json": (1, 2), **_request_wrappers(tree)}
        for node in ast.walk(tree):
            # Any reference to a typed client method counts (``fn = api.read_x if ... else
            # api.read_y`` too); a list method streamed or called with watch=True watches.
            if isinstance(node, ast.Attribute):
                m = _CLIENT_METHOD.match(node.attr)
                if m is not None and m[2] in _PLURAL:
                    resource = _PLURAL[m[2]]
                    found.add((_GROUP[resource], resource, _VERB.get(m[1], m[1])))
            if not isinstance(node, ast.Call):
                continue
            listed = [
                _CLIENT_METHOD.match(a.attr)
                for a in [node.func, *node.args]
                if isinstance(a, ast.Attribute)
            ]
            is_stream = isinstance(node.func, ast.Attribute) and node.func.attr == "stream"
            # driver/plumbing/informer.py lists, then watches, with the list method it is handed.
            informer = isinstance(node.func, ast.Name) and node.func.id == "Informer"
            watching = (
                is_stream
                or informer
                or any(
                    k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in node.keywords
                )
            )
            for m in listed:
                if watching and m is not None and m[1] == "list" and m[2] in _PLURAL:
                    resource = _PLURAL[m[2]]
                    found.add((_GROUP[resource], resource, "watch"))
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else None
            if isinstance(node.func, ast.Name):
                callee = node.func.id
            if callee == "collection_lister" and len(node.args) == 2:
                # driver/plumbing/kube.py's list call of a collection, handed to an Informer: it
                # lists, then watches.
                text = _resolve(ast.unparse(node.args[1]), assigned)
                m3 = re.search(r"/(?:api/v1|apis/([a-z0-9.]+)/v1)/([a-z]+)$", text)
                assert m3 is not None, f"{path}: unrecognised collection {text}"
                found.add((m3[1] or "", m3[2], "list"))
                found.add((m3[1] or "", m3[2], "watch"))
                continue
            if callee in wrappers:
                at_method, at_path = wrappers[callee]
                if len(node.args) <= at_path:
                    continue
                method, url = node.args[at_method], node.args[at_path]
                if not isinstance(method, ast.Constant) and len(wrappers) > 1:
                    continue  # a wrapper passing its own parameters on: seen at its callers
                assert isinstance(method, ast.Constant), f"{path}: request method not literal"
                text = _resolve(ast.unparse(url), assigned)
                m2 = re.search(
                    r"/(?:api/v1|apis/([a-z0-9.]+)/v1)/(?:namespaces/\{[^}]*\}/)?([a-z]+)(/)?", text
                )
                assert m2 is not None, f"{path}: unrecognised API path {text}"
                resource = m2[2]
                named = m2[3] is not None
                if method.value == "GET":
                    verb = "get" if named else ("watch" if "watch" in text else "list")
                else:
                    verb = _HTTP_VERB[str(method.value)]
                found.add((m2[1] or "", resource, verb))
    return found


def _request_wrappers(tree: ast.AST) -> dict[str, tuple[int, int]]:
    """Functions that hand their own ``method`` and ``path`` parameters to ``request_json``
    (``def _call(self, what, method, path, ...)``): name -> (method, path) argument index."""
    out: dict[str, tuple[int, int]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        params = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
        for call in ast.walk(fn):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "request_json"
                and len(call.args) >= 3
                and all(isinstance(a, ast.Name) and a.id in params for a in call.args[1:3])
            ):
                m, p = call.args[1], call.args[2]
                assert isinstance(m, ast.Name) and isinstance(p, ast.Name)
                out[fn.name] = (params.index(m.id), params.index(p.id))
    return out


def _resolve(text: str, assigned: dict[str, str]) -> str:
    """Follow names to the URL: ``path`` -> ``CLAIM_PATH.format(...)`` -> its literal, and
    ``f"{SLICES}/{name}"`` -> the literal of ``SLICES``."""
    for _ in range(6):
        changed = False
        for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text):
            value = assigned.get(name)
            if value is not None and (value[:1] in "'\"" or value.startswith(("f'", 'f"'))):
                text = text.replace(name, value.strip("'\"").removeprefix("f"), 1)
                changed = True
            elif value is not None and "/" not in text:
                text = text.replace(name, value, 1)
                changed = True
            if changed:
                break
        if not changed:
            break
    return text


def granted(
    objs: list[dict[str, Any]], role_name: str = "toposlice-node-plugin"
) -> set[tuple[str, str, str]]:
    role = one(objs, "ClusterRole", role_name)
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_rbac_covers_every_call_of_the_driver() -> None:
    calls = api_calls()
    if not calls:
        pytest.skip("the driver's code makes no Kubernetes API call yet")
    have = granted(render(None))
    assert calls <= have, f"calls the ClusterRole does not allow: {sorted(calls - have)}"


def test_rbac_grants_nothing_the_driver_does_not_call() -> None:
    calls = api_calls()
    if not calls:
        pytest.skip("the driver's code makes no Kubernetes API call yet")
    have = granted(render(None))
    assert have <= calls, f"granted but never called: {sorted(have - calls)}"
    role = one(render(None), "ClusterRole", "toposlice-node-plugin")
    assert not [r for r in role["rules"] if "*" in r["verbs"] or "*" in r["resources"]]


def test_scorer_rbac_is_exactly_its_api_calls() -> None:
    calls = api_calls(scorer_sources())
    if not calls:
        pytest.skip("the scorer's code makes no Kubernetes API call yet")
    have = granted(render(ALL_OPTIONS), "toposlice-scorer")
    assert calls == have, f"missing {sorted(calls - have)}, unused {sorted(have - calls)}"


def test_rbac_binds_the_daemonset_service_account() -> None:
    objs = render(None)
    binding = one(objs, "ClusterRoleBinding", "toposlice-node-plugin")
    sa = one(objs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert node_plugin(objs)["serviceAccountName"] == sa["metadata"]["name"]
    assert SA_USER == f"system:serviceaccount:{NAMESPACE}:{sa['metadata']['name']}"


# -- the ValidatingAdmissionPolicy's CEL --------------------------------------------------


@cache
def printed_slices(node: str) -> tuple[dict[str, Any], ...]:
    args = ["-q", "slices", "--fake", "dgx-h100", "--node-name", node, "-o", "yaml"]
    proc = subprocess.run(
        [sys.executable, "-m", "toposlice", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def admit(
    policy: dict[str, Any],
    operation: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None,
    user: str,
    extra: dict[str, list[str]],
) -> tuple[bool, str]:
    """(allowed, message) as the API server evaluates a ValidatingAdmissionPolicy."""
    spec = policy["spec"]
    request = {"operation": operation, "userInfo": {"username": user, "extra": extra}}
    ctx: dict[str, Any] = {"request": request, "object": obj, "oldObject": old}
    for cond in spec.get("matchConditions", []):
        if cel.evaluate(cond["expression"], ctx) is not True:
            return True, "not matched"
    variables: dict[str, Any] = {}
    for var in spec.get("variables", []):
        variables[var["name"]] = cel.evaluate(var["expression"], {**ctx, "variables": variables})
    ctx["variables"] = variables
    for rule in spec["validations"]:
        if cel.evaluate(rule["expression"], ctx) is not True:
            if "messageExpression" in rule:
                return False, str(cel.evaluate(rule["messageExpression"], ctx))
            return False, " ".join(rule["message"].split())
    return True, ""


def _policy() -> dict[str, Any]:
    objs = render(None)
    policy = one(objs, "ValidatingAdmissionPolicy")
    binding = one(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["resourceslices"]
    assert set(rules[0]["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    return policy


NODE_CLAIM = "authentication.kubernetes.io/node-name"


def test_admission_admits_own_node_slices() -> None:
    policy = _policy()
    on_a = {NODE_CLAIM: ["node-a"]}
    for s in printed_slices("node-a"):
        assert admit(policy, "CREATE", s, None, SA_USER, on_a) == (True, "")
        assert admit(policy, "UPDATE", s, s, SA_USER, on_a) == (True, "")
        assert admit(policy, "DELETE", None, s, SA_USER, on_a) == (True, "")


def test_admission_refuses_another_nodes_slices() -> None:
    policy = _policy()
    on_a = {NODE_CLAIM: ["node-a"]}
    for s in printed_slices("node-b"):
        for op, obj, old in (("CREATE", s, None), ("UPDATE", s, s), ("DELETE", None, s)):
            ok, msg = admit(policy, op, obj, old, SA_USER, on_a)
            assert not ok, op
            assert "node-a" in msg and "node-b" in msg, msg
    # Moving an own slice to another node is refused too (the new object decides).
    (mine,) = printed_slices("node-a")[:1]
    moved = copy.deepcopy(mine)
    moved["spec"]["nodeName"] = "node-b"
    assert admit(policy, "UPDATE", moved, mine, SA_USER, on_a)[0] is False
    # A slice without nodeName (a cluster-wide pool) is not the node plugin's to write.
    pool_wide = copy.deepcopy(mine)
    del pool_wide["spec"]["nodeName"]
    pool_wide["spec"]["allNodes"] = True
    ok, msg = admit(policy, "CREATE", pool_wide, None, SA_USER, on_a)
    assert not ok and "without a node" in msg


def test_admission_refuses_a_token_without_a_node() -> None:
    policy = _policy()
    (s,) = printed_slices("node-a")[:1]
    ok, msg = admit(policy, "CREATE", s, None, SA_USER, {})
    assert not ok and "no node name" in msg


def test_admission_leaves_other_users_to_rbac() -> None:
    policy = _policy()
    (s,) = printed_slices("node-b")[:1]
    other = "system:serviceaccount:kube-system:some-other-driver"
    assert admit(policy, "CREATE", s, None, other, {NODE_CLAIM: ["node-a"]}) == (
        True,
        "not matched",
    )


# -- the image the chart runs -------------------------------------------------------------


def _stages() -> list[list[str]]:
    """Dockerfile instructions (continuations joined), split into build stages."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    stages: list[list[str]] = [[]]
    for ln in lines:
        if ln.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(ln)
    return stages


def test_dockerfile_is_multi_stage_pinned_and_non_root() -> None:
    preamble, *stages = _stages()
    assert len(stages) >= 2
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", "\n".join(preamble), re.M)
    assert base is not None, "the base image is an ARG with a default"
    # An exact patch release of a named Debian suite, or a digest; never a floating tag.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base[1])
    assert all(s[0].split()[1] == "${PYTHON_IMAGE}" for s in stages)
    first, last = "\n".join(stages[0]), "\n".join(stages[-1])
    assert "pip wheel" in first and " AS build" in stages[0][0]
    assert "--no-index" in last and "from=build" in last
    user = [ln for ln in stages[-1] if ln.startswith("USER ")]
    assert user and user[-1].split()[1].split(":")[0] not in ("0", "root")
    entry = [ln for ln in stages[-1] if ln.startswith("ENTRYPOINT")]
    assert entry == ['ENTRYPOINT ["toposlice"]']
    (c,) = node_plugin(render(None))["containers"]
    assert c["command"] == ["toposlice"]


def test_dockerignore_lets_in_every_shipped_package() -> None:
    allowed = {
        ln[1:].strip("/")
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.startswith("!")
    }
    ignore_all = "*" in (REPO / ".dockerignore").read_text().splitlines()
    assert ignore_all, ".dockerignore is an allow-list"
    project = (REPO / "pyproject.toml").read_text()
    include = re.search(r"^include = \[(.*)\]$", project, re.M)
    assert include is not None
    packages = {p.strip(' "*') for p in include[1].split(",")}
    missing = {p for p in packages if (REPO / p).is_dir()} - allowed
    assert not missing, f"packages left out of the image build context: {sorted(missing)}"
    assert {"pyproject.toml", "README.md"} <= allowed


@pytest.mark.parametrize("script", ["hack/build-image.sh", "hack/kind-up.sh"])
def test_hack_scripts_are_valid_bash(script: str) -> None:
    path = REPO / script
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "set -euo pipefail" in path.read_text()


# -- the DaemonSet's command line, run: the API calls it really makes ---------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_rbac_and_admission_hold_for_a_running_driver() -> None:
    """Run the fake-values DaemonSet's own command line (host paths moved to a temp dir,
    the test API server as cluster), register it and prepare a claim as the kubelet does;
    every API call it made must be granted, and every slice it wrote admitted."""
    import os
    import shutil
    import signal
    import tempfile
    import time

    command_parser("run")
    from tests.kubeapi import KubeAPIServer
    from tests.kubelet import NodeClient, allocated_claim, register, wait_for_socket

    objs = render(fake_values())
    spec = node_plugin(objs)
    (c,) = spec["containers"]
    env = container_env(c, "node-a")
    base = Path(tempfile.mkdtemp(prefix="tsc"))  # short: unix socket paths <= 107 bytes
    moved = {flag: str(base / flag.strip("-")) for flag in dir_flags()}
    args = []
    for a in c["args"]:
        flag = a.partition("=")[0]
        if flag in moved:
            a = f"{flag}={moved[flag]}"
        elif flag == "--http-addr":
            a = f"--http-addr=127.0.0.1:{_free_port()}"
        args.append(expand(a, env))
    api = KubeAPIServer().start()
    proc = None
    try:
        api.add_node("node-a")
        kubeconfig = api.write_kubeconfig(base / "kubeconfig")
        run_env = {**os.environ, **env, "TOPOSLICE_FAKE_TMPDIR": str(base)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "toposlice", *args, f"--kubeconfig={kubeconfig}"],
            env=run_env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        driver = "toposlice.dev"
        reg = Path(moved["--kubelet-registrar-directory-path"]) / f"{driver}-reg.sock"
        wait_for_socket(reg, timeout=30)
        registered = register(reg)
        deadline = time.monotonic() + 30
        while not api.slices(driver, "node-a") and time.monotonic() < deadline:
            time.sleep(0.05)
        slices = api.slices(driver, "node-a")
        assert slices, "the driver published no slice"
        api.add_claim(allocated_claim("c1", ["gpu-0000-1b-00-0"], pool="node-a", driver=driver))
        uid = api.store.get("resourceclaims", "default", "c1")["metadata"]["uid"]
        with NodeClient(registered.info.endpoint, registered.version) as node:
            prepared = node.prepare([("default", "c1", uid)])
            assert not prepared.claims[uid].error, prepared.claims[uid].error
            node.unprepare([("default", "c1", uid)])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        api.stop()
        shutil.rmtree(base, ignore_errors=True)
    made = {
        (_GROUP[resource], resource, verb)
        for (verb, resource), n in api.requests.items()
        if n and resource in _GROUP
    }
    assert ("resource.k8s.io", "resourceclaims", "get") in made
    assert ("", "nodes", "get") in made
    have = granted(objs)
    assert made <= have, f"calls the ClusterRole does not allow: {sorted(made - have)}"
    assert {r for (_v, r) in api.requests} <= set(_GROUP), dict(api.requests)
    policy = one(objs, "ValidatingAdmissionPolicy")
    for s in slices:
        assert admit(policy, "CREATE", s, None, SA_USER, {NODE_CLAIM: ["node-a"]}) == (True, "")
