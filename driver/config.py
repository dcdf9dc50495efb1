"""``toposlice run`` flags, each with an environment variable, checked at the edge.

The flag names are the ecosystem's (dra-example-driver, NVIDIA's driver); every one can
also come from the environment (a DaemonSet sets ``NODE_NAME`` from the downward API), and
a flag wins over its variable. :func:`load_config` turns parsed arguments into a
:class:`DaemonConfig` or raises :class:`ConfigError` with one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

from normalize.options import NormalizeOptions
from normalize.validation import driver_name_errors, is_dns_subdomain

DEFAULT_DRIVER = "toposlice.dev"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_PARENT = "/var/lib/kubelet/plugins"
DEFAULT_CDI_ROOT = "/var/run/cdi"
KINDS = ("gpu", "nic", "cpu")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
UNIX_PATH_MAX = 108


class ConfigError(ValueError):
    """A bad flag or variable: printed as one line, exit status 2."""


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


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def add_driver_args(p: argparse.ArgumentParser) -> None:
    """The daemon's own flags (the source and normalize flags come from the CLI)."""
    g = p.add_argument_group("driver")
    g.add_argument(
        "--node-name", default=_env("NODE_NAME"), help="this Kubernetes node ($NODE_NAME)"
    )
    g.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig file ($KUBECONFIG); in-cluster service account when absent",
    )
    g.add_argument(
        "--driver-name",
        default=_env("DRIVER_NAME"),
        help=f"DRA driver name ($DRIVER_NAME; default {DEFAULT_DRIVER})",
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
        help=f"directory of dra.sock (default {DEFAULT_PLUGINS_PARENT}/<driver-name>)",
    )
    g.add_argument(
        "--cdi-root",
        default=_env("CDI_ROOT", DEFAULT_CDI_ROOT),
        metavar="DIR",
        help="where CDI specs are written (default %(default)s)",
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
        "--rediscover-interval",
        type=float,
        default=float(_env("REDISCOVER_INTERVAL", "60") or 60),
        metavar="S",
        help="rediscover the node every S seconds, besides hot-plug events (default %(default)s)",
    )
    g.add_argument(
        "--resync-interval",
        type=float,
        default=float(_env("RESYNC_INTERVAL", "10") or 10),
        metavar="S",
        help="re-check the published slices every S seconds (default %(default)s)",
    )
    g.add_argument(
        "--startup-timeout",
        type=float,
        default=float(_env("STARTUP_TIMEOUT", "10") or 10),
        metavar="S",
        help="keep trying to reach the API server and find the Node this long at start, "
        "then exit 1 (default %(default)s; 0 = one try)",
    )
    g.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=_env("LOG_FORMAT", "text"),
        help="log lines as text or JSON ($LOG_FORMAT; default %(default)s)",
    )
    g.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=(_env("LOG_LEVEL", "info") or "info").lower(),
        help="($LOG_LEVEL; default %(default)s)",
    )


def node_name_errors(name: str | None, flag: str = "--node-name") -> list[str]:
    """A Node name is a DNS-1123 subdomain; it also names the pool and the slices."""
    if not name:
        return [f"{flag} is required (or set NODE_NAME)"]
    if not is_dns_subdomain(name):
        return [
            f"{flag} {name!r} is not a valid Kubernetes node name (lower-case letters, digits, "
            "'-' and '.', starting and ending with a letter or digit, at most 253 characters)"
        ]
    return []


def driver_errors(name: str, flag: str = "--driver-name") -> list[str]:
    """CSI driver-name rules, lower case only (the name is also the CDI vendor and the
    taint-key prefix, which are case-sensitive)."""
    errs = [e.replace("spec.driver", f"{flag} {name!r}") for e in driver_name_errors(name)]
    if not errs and name != name.lower():
        errs.append(f"{flag} {name!r} must be lower case")
    return errs


def check_names(node_name: str | None, driver: str, driver_flag: str = "--driver") -> None:
    """Raise :class:`ConfigError` for names the API server would refuse."""
    errs = driver_errors(driver, driver_flag) + node_name_errors(node_name)
    if errs:
        raise ConfigError(errs[0])


def parse_publish(text: str) -> frozenset[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ConfigError(f"--publish {text!r}: give one or more of {','.join(KINDS)}")
    return frozenset(kinds)


def _socket_fits(path: str, what: str) -> None:
    if len(os.fsencode(path)) >= UNIX_PATH_MAX:
        raise ConfigError(f"{what} socket path {path} is longer than {UNIX_PATH_MAX - 1} bytes")


def load_config(
    args: argparse.Namespace, root: str, live: bool, normalize: NormalizeOptions
) -> DaemonConfig:
    """Validate everything the daemon needs before it touches the host or the API."""
    normalize_driver = getattr(args, "driver", None)
    driver = args.driver_name or normalize_driver or DEFAULT_DRIVER
    if (
        args.driver_name
        and normalize_driver not in (None, DEFAULT_DRIVER)
        and normalize_driver != args.driver_name
    ):
        raise ConfigError(f"--driver {normalize_driver!r} and --driver-name {driver!r} differ")
    errs = driver_errors(driver) + node_name_errors(args.node_name)
    if errs:
        raise ConfigError(errs[0])
    plugins_dir = os.path.abspath(
        args.kubelet_plugins_directory_path or os.path.join(DEFAULT_PLUGINS_PARENT, driver)
    )
    registrar_dir = os.path.abspath(args.kubelet_registrar_directory_path)
    _socket_fits(os.path.join(registrar_dir, f"{driver}-reg.sock"), "registration")
    _socket_fits(os.path.join(plugins_dir, "dra.sock"), "DRA service")
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        raise ConfigError(f"--kubeconfig {args.kubeconfig}: no such file")
    for flag in ("rediscover_interval", "resync_interval"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be > 0")
    if args.startup_timeout < 0:
        raise ConfigError("--startup-timeout must be >= 0")
    http_addr = args.http_addr or None
    if http_addr is not None:
        _host, sep, port = http_addr.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"--http-addr {http_addr!r}: want HOST:PORT or :PORT")
    return DaemonConfig(
        node_name=args.node_name,
        driver_name=driver,
        kubeconfig=args.kubeconfig or None,
        registrar_dir=registrar_dir,
        plugins_dir=plugins_dir,
        cdi_root=os.path.abspath(args.cdi_root),
        state_dir=os.path.abspath(args.state_dir or plugins_dir),
        http_addr=http_addr,
        publish=parse_publish(args.publish),
        root=root,
        live=live,
        normalize=dataclasses.replace(normalize, driver=driver),
        rediscover_interval=args.rediscover_interval,
        resync_interval=args.resync_interval,
        startup_timeout=args.startup_timeout,
        log_format=args.log_format,
        log_level=args.log_level,
    )
