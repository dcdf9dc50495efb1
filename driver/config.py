"""``toposlice run`` flags, each with an environment variable, checked at the edge.

The flag names are the ecosystem's (dra-example-driver, NVIDIA's driver); every one can
also come from the environment (a DaemonSet sets ``NODE_NAME`` from the downward API), and
a flag wins over its variable. :func:`load_config` turns parsed arguments into a
:class:`DaemonConfig` or raises :class:`~driver.plumbing.checks.ConfigError` with one line
saying what is wrong. The checks every command shares (listen address, kubeconfig, node and
driver names) are in driver/plumbing/checks.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import TypedDict

from driver.plumbing.checks import (
    DEFAULT_DRIVER,
    ConfigError,
    _env,
    check_kubeconfig,
    driver_errors,
    node_name_default,
    node_name_errors,
    parse_http_addr,
)
from driver.plumbing.flag_types import seconds
from driver.plumbing.logs import add_log_args
from normalize.options import NormalizeOptions

DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_PARENT = "/var/lib/kubelet/plugins"
DEFAULT_CDI_ROOT = "/var/run/cdi"
KINDS = ("gpu", "nic", "cpu")
UNIX_PATH_MAX = 108


@dataclass(frozen=True)
class DaemonConfig:
    node_name: str
    driver_name: str
    kubeconfig: str | None
    """None: in-cluster service account."""
    registrar_dir: str
    plugins_dir: str
    cdi_root: str
    state_dir: str
    http_addr: str | None
    publish: frozenset[str]
    root: str
    """Host filesystem root (boot id, sysfs link state); ``/`` on the host itself."""
    live: bool
    """Reading the real host: udev hot-plug and sysfs link polling make sense."""
    normalize: NormalizeOptions
    rediscover_interval: float = 60.0
    resync_interval: float = 10.0
    startup_timeout: float = 10.0
    log_format: str = "text"
    log_level: str = "info"
    device_metadata: bool = True
    """Write KEP-5304 device metadata files at prepare (``--device-metadata``)."""
    device_metadata_versions: tuple[str, ...] = ("v1alpha1",)
    nrt: bool = False
    """Keep the node's NodeResourceTopology (``--nrt``)."""
    topology_manager_policy: str | None = None
    topology_manager_scope: str | None = None
    nrt_pods_fingerprint: bool = True
    """Write the NRT's pods fingerprint from a watch of the node's pods."""
    nrt_topology_policies: bool = False
    """Also write the deprecated ``topologyPolicies`` list."""
    node_feature: bool = False
    """Keep the node's NFD NodeFeature (``--node-feature``)."""
    node_feature_namespace: str | None = None
    bridge_auto: bool = False
    """Also speak the dialects of the drivers seen on the node (``--bridge auto``)."""
    duplicates: str = "yield"
    """``yield``: leave out devices another driver publishes for the same hardware;
    ``publish``: keep them (and say so)."""
    cdi_spec_dirs: tuple[str, ...] = ()
    """Where the vendor's CDI specs are looked for (``--cdi-spec-dirs`` + ``--cdi-root``);
    empty: the defaults and ``cdi_root``."""


def add_driver_args(p: argparse.ArgumentParser) -> None:
    """The daemon's own flags (the source and normalize flags come from the CLI)."""
    g = p.add_argument_group("driver")
    g.add_argument(
        "--node-name", default=node_name_default(), help="this Kubernetes node ($NODE_NAME)"
    )
    g.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig file ($KUBECONFIG); in-cluster service account when absent",
    )
    g.add_argument(
        "--kubelet-registrar-directory-path",
        default=_env("KUBELET_REGISTRAR_DIRECTORY_PATH", DEFAULT_REGISTRAR_DIR),
        metavar="DIR",
        help="kubelet plugin registration directory (default %(default)s)",
    )
    g.add_argument(
        "--kubelet-plugins-directory-path",
        default=_env("KUBELET_PLUGINS_DIRECTORY_PATH"),
        metavar="DIR",
        help=f"directory of dra.sock (default {DEFAULT_PLUGINS_PARENT}/<driver>)",
    )
    g.add_argument(
        "--cdi-root",
        default=_env("CDI_ROOT", DEFAULT_CDI_ROOT),
        metavar="DIR",
        help="where CDI specs are written (default %(default)s)",
    )
    g.add_argument(
        "--cdi-spec-dirs",
        default=_env("CDI_SPEC_DIRS"),
        metavar="DIRS",
        help="comma-separated CDI spec directories the container runtime reads, lowest "
        "priority first, searched for the GPU vendor's devices (nvidia.com/gpu, "
        "amd.com/gpu); the --cdi-root is always added (default /etc/cdi,/var/run/cdi)",
    )
    g.add_argument(
        "--state-dir",
        default=_env("STATE_DIR"),
        metavar="DIR",
        help="checkpoint and NCCL topology files (default: the plugins directory)",
    )
    g.add_argument(
        "--http-addr",
        default=_env("HTTP_ADDR"),
        metavar="HOST:PORT",
        help="serve /healthz, /readyz, /metrics and the exporter here (default: off)",
    )
    g.add_argument(
        "--publish",
        default=_env("PUBLISH", ",".join(KINDS)),
        metavar="KINDS",
        help="device kinds to publish, of gpu,nic,cpu (default %(default)s): leave out what "
        "a vendor driver on the node already offers",
    )
    g.add_argument(
        "--duplicates",
        choices=["yield", "publish"],
        default=_env("DUPLICATES", "yield"),
        help="devices another driver on the node publishes for the same hardware (CPUs of "
        "dra.cpu, NICs of dranet, GPUs of gpu.nvidia.com): yield leaves them to it, publish "
        "keeps toposlice's copy (a pod can then be given them twice) ($DUPLICATES; default "
        "%(default)s)",
    )
    g.add_argument(
        "--device-metadata",
        action=argparse.BooleanOptionalAction,
        default=(_env("DEVICE_METADATA", "true") or "true").lower() in ("1", "true", "yes"),
        help="write each prepared request's KEP-5304 device metadata file and mount it "
        "into the container ($DEVICE_METADATA; default on)",
    )
    g.add_argument(
        "--device-metadata-versions",
        default=_env("DEVICE_METADATA_VERSIONS", "v1alpha1"),
        metavar="VERSIONS",
        help="metadata.resource.k8s.io versions written, in this order, of v1alpha1 "
        "(Kubernetes 1.36) and v1beta1 (1.37) (default %(default)s)",
    )
    g.add_argument(
        "--rediscover-interval",
        type=seconds(),
        default=_env("REDISCOVER_INTERVAL", "60"),
        metavar="S",
        help="rediscover the node every S seconds, besides hot-plug events (default %(default)s)",
    )
    g.add_argument(
        "--resync-interval",
        type=seconds(),
        default=_env("RESYNC_INTERVAL", "10"),
        metavar="S",
        help="re-check the published slices every S seconds (default %(default)s)",
    )
    g.add_argument(
        "--startup-timeout",
        type=seconds(allow_low=True),
        default=_env("STARTUP_TIMEOUT", "10"),
        metavar="S",
        help="keep trying to reach the API server and find the Node this long at start, "
        "then exit 1 (default %(default)s; 0 = one try)",
    )
    add_log_args(g)
    _add_integration_args(p)


def _add_integration_args(p: argparse.ArgumentParser) -> None:
    """Objects for schedulers that do not read DRA slices (docs/integrations.md)."""
    from normalize.nrt import POLICIES, SCOPES

    g = p.add_argument_group("integrations")
    g.add_argument(
        "--nrt",
        action="store_true",
        default=(_env("NRT", "") or "").lower() in ("1", "true", "yes"),
        help="keep the node's NodeResourceTopology (topology.node.k8s.io/v1alpha2) ($NRT=true)",
    )
    g.add_argument(
        "--topology-manager-policy",
        choices=POLICIES,
        default=_env("TOPOLOGY_MANAGER_POLICY"),
        help="the kubelet's --topology-manager-policy, written into the NRT object",
    )
    g.add_argument(
        "--topology-manager-scope",
        choices=SCOPES,
        default=_env("TOPOLOGY_MANAGER_SCOPE"),
        help="the kubelet's --topology-manager-scope, written into the NRT object",
    )
    g.add_argument(
        "--nrt-pods-fingerprint",
        action=argparse.BooleanOptionalAction,
        default=(_env("NRT_PODS_FINGERPRINT", "true") or "").lower() in ("1", "true", "yes"),
        help="write the NRT's nodeTopologyPodsFingerprint from a watch of the node's pods, "
        "which the NodeResourceTopology plugin's cached mode needs (default on; "
        "$NRT_PODS_FINGERPRINT)",
    )
    g.add_argument(
        "--nrt-topology-policies",
        action="store_true",
        default=(_env("NRT_TOPOLOGY_POLICIES", "") or "").lower() in ("1", "true", "yes"),
        help="also write the deprecated topologyPolicies list of the NRT, for readers of "
        "API v1alpha1 ($NRT_TOPOLOGY_POLICIES=true)",
    )
    g.add_argument(
        "--node-feature",
        action="store_true",
        default=(_env("NODE_FEATURE", "") or "").lower() in ("1", "true", "yes"),
        help="keep the node's NFD NodeFeature (toposlice.dev/ labels) ($NODE_FEATURE=true)",
    )
    g.add_argument(
        "--node-feature-namespace",
        default=_env("NODE_FEATURE_NAMESPACE", _env("POD_NAMESPACE")),
        metavar="NS",
        help="namespace of the NodeFeature ($NODE_FEATURE_NAMESPACE, else $POD_NAMESPACE)",
    )


def parse_publish(text: str) -> frozenset[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ConfigError(f"--publish {text!r}: give one or more of {','.join(KINDS)}")
    return frozenset(kinds)


def parse_metadata_versions(text: str | None) -> tuple[str, ...]:
    from driver.kubelet.device_metadata import DEFAULT_VERSIONS, check_versions

    if text is None:
        return DEFAULT_VERSIONS
    try:
        return check_versions([v.strip() for v in text.split(",") if v.strip()])
    except ValueError as exc:
        raise ConfigError(f"--device-metadata-versions {text!r}: {exc}") from None


def _socket_fits(path: str, what: str) -> None:
    if len(os.fsencode(path)) >= UNIX_PATH_MAX:
        raise ConfigError(f"{what} socket path {path} is longer than {UNIX_PATH_MAX - 1} bytes")


def load_config(
    args: argparse.Namespace, root: str, live: bool, normalize: NormalizeOptions
) -> DaemonConfig:
    """Validate everything the daemon needs before it touches the host or the API."""
    driver = getattr(args, "driver", None) or DEFAULT_DRIVER
    errs = driver_errors(driver) + node_name_errors(args.node_name)
    if errs:
        raise ConfigError(errs[0])
    plugins_dir = os.path.abspath(
        args.kubelet_plugins_directory_path or os.path.join(DEFAULT_PLUGINS_PARENT, driver)
    )
    registrar_dir = os.path.abspath(args.kubelet_registrar_directory_path)
    _socket_fits(os.path.join(registrar_dir, f"{driver}-reg.sock"), "registration")
    _socket_fits(os.path.join(plugins_dir, "dra.sock"), "DRA service")
    http_addr = args.http_addr or None
    if http_addr is not None:
        parse_http_addr(http_addr)
    publish = parse_publish(args.publish)
    spec_dirs = parse_cdi_spec_dirs(getattr(args, "cdi_spec_dirs", None), args.cdi_root)
    metadata_versions = parse_metadata_versions(getattr(args, "device_metadata_versions", None))
    if getattr(args, "device_metadata", True) and not driver[:1].isalpha():
        # The driver name is the CDI vendor of the metadata specs, which starts with a letter.
        raise ConfigError(
            f"--device-metadata: driver name {driver!r} must start with a letter "
            "(it is the CDI vendor of the metadata specs); or give --no-device-metadata"
        )
    duplicates = str(getattr(args, "duplicates", "yield"))
    if duplicates not in ("yield", "publish"):
        raise ConfigError(f"--duplicates {duplicates!r}: want yield or publish")
    check_kubeconfig(args.kubeconfig)  # last: the other flags' errors are the likelier typo
    return DaemonConfig(
        node_name=str(args.node_name),
        driver_name=str(driver),
        kubeconfig=args.kubeconfig or None,
        registrar_dir=registrar_dir,
        plugins_dir=plugins_dir,
        cdi_root=os.path.abspath(args.cdi_root),
        state_dir=os.path.abspath(args.state_dir or plugins_dir),
        http_addr=http_addr,
        publish=publish,
        root=root,
        live=live,
        normalize=dataclasses.replace(normalize, driver=str(driver)),
        rediscover_interval=args.rediscover_interval,
        resync_interval=args.resync_interval,
        startup_timeout=args.startup_timeout,
        log_format=args.log_format,
        log_level=args.log_level,
        device_metadata=bool(getattr(args, "device_metadata", True)),
        device_metadata_versions=metadata_versions,
        **_integration_config(args),
        bridge_auto=getattr(args, "bridge", None) == "auto",
        duplicates=duplicates,
        cdi_spec_dirs=spec_dirs,
    )


def parse_cdi_spec_dirs(text: str | None, cdi_root: str) -> tuple[str, ...]:
    """``--cdi-spec-dirs`` (None: the defaults) with ``--cdi-root`` added, absolute."""
    from discovery.vendor_cdi import spec_dirs

    given = None if text is None else [d.strip() for d in text.split(",") if d.strip()]
    return spec_dirs(given, cdi_root)


class _Integrations(TypedDict):
    nrt: bool
    topology_manager_policy: str | None
    topology_manager_scope: str | None
    nrt_pods_fingerprint: bool
    nrt_topology_policies: bool
    node_feature: bool
    node_feature_namespace: str | None


def _integration_config(args: argparse.Namespace) -> _Integrations:
    from normalize.node_feature import is_label_value
    from normalize.validation import is_dns_label

    nrt = bool(getattr(args, "nrt", False))
    policy = getattr(args, "topology_manager_policy", None)
    scope = getattr(args, "topology_manager_scope", None)
    if (policy or scope) and not nrt:
        raise ConfigError("--topology-manager-policy/--topology-manager-scope need --nrt")
    policies = bool(getattr(args, "nrt_topology_policies", False))
    if policies and not policy:
        raise ConfigError("--nrt-topology-policies needs --topology-manager-policy")
    node_feature = bool(getattr(args, "node_feature", False))
    namespace = getattr(args, "node_feature_namespace", None) or None
    if node_feature:
        if not namespace:
            raise ConfigError("--node-feature needs --node-feature-namespace (or $POD_NAMESPACE)")
        if not is_dns_label(namespace):
            raise ConfigError(f"--node-feature-namespace {namespace!r} is not a DNS-1123 label")
        if not is_label_value(args.node_name):
            raise ConfigError(
                f"--node-feature: node name {args.node_name!r} is longer than 63 characters, "
                "too long for NFD's nfd.node.kubernetes.io/node-name label"
            )
    return {
        "nrt": nrt,
        "topology_manager_policy": policy,
        "topology_manager_scope": scope,
        "nrt_pods_fingerprint": bool(getattr(args, "nrt_pods_fingerprint", True)),
        "nrt_topology_policies": policies,
        "node_feature": node_feature,
        "node_feature_namespace": namespace,
    }
