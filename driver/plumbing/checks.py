"""The checks and wording every command shares for its flags: listen addresses, the
kubeconfig, node and driver names, YAML errors as one line, and environment defaults.

Each refuses a bad value with one line naming the flag (or the variable it came from);
:class:`ConfigError` is exit status 2, :class:`ListenError` exit status 1. ``toposlice
run``'s own flags and :class:`~driver.config.DaemonConfig` are in driver/config.py.
"""

from __future__ import annotations

import os

from normalize.validation import driver_name_errors, is_dns_subdomain

DEFAULT_DRIVER = "toposlice.dev"


class ConfigError(ValueError):
    """A bad flag or variable: printed as one line, exit status 2."""


class ListenError(RuntimeError):
    """The HTTP address is well-formed but cannot be bound (in use, not this host's)."""


def parse_http_addr(addr: str, flag: str = "--http-addr") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[V6]:PORT`` -> (host, port); the one
    check and wording of a listen address for every command. ValueError when bad."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"{flag} {addr!r}: want HOST:PORT or :PORT with a port of 0-65535 (0: any free one)"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def check_listen(addr: str, flag: str = "--http-addr") -> None:
    """Bind ``addr`` once and let go: an address in use or not ours is refused in one line
    naming it, before anything is created on the host (the server binds it again later)."""
    import socket

    host, port = parse_http_addr(addr, flag)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        raise ListenError(
            f"{flag} {addr}: cannot listen on {where}: {exc.strerror or exc}"
        ) from exc


def yaml_error_line(exc: BaseException) -> str:
    """A PyYAML error as one line: what is wrong and where (line, column of the file)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    text = " ".join(str(problem or getattr(exc, "context", None) or exc).split())
    if mark is not None:
        text += f" at line {mark.line + 1}, column {mark.column + 1}"
    return text


def check_kubeconfig(path: str | None, flag: str = "--kubeconfig") -> None:
    """Refuse, in one line, a kubeconfig the client could not load, or no configuration at
    all: before the driver creates a socket or a directory on the host."""
    if not path:
        if not (
            os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")
        ):
            raise ConfigError(
                f"no kubeconfig and not in a cluster ($KUBERNETES_SERVICE_HOST unset): give "
                f"{flag} FILE or set $KUBECONFIG"
            )
        return
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: no such file")
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {path}: not valid YAML: {yaml_error_line(exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{flag} {path}: not a kubeconfig (want a mapping with clusters, users and "
            f"contexts, got a {type(data).__name__})"
        )


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


class NodeNameFromEnv(str):
    """``--node-name``'s value when it came from ``$NODE_NAME``: an error about it names
    the variable, not a flag nobody typed."""

    flag = "$NODE_NAME"


class DriverFromEnv(str):
    """``run --driver``'s value when it came from ``$DRIVER_NAME`` (named in errors)."""

    flag = "$DRIVER_NAME"


def driver_default() -> str:
    """``run --driver``'s default: ``$DRIVER_NAME`` (the chart's variable), else ours."""
    value = _env("DRIVER_NAME")
    return DEFAULT_DRIVER if value is None else DriverFromEnv(value)


def node_name_default() -> str | None:
    """The default of ``--node-name`` in every command that names a node: ``$NODE_NAME``
    (a DaemonSet sets it from the downward API); unset or empty: none."""
    value = _env("NODE_NAME")
    return None if value is None else NodeNameFromEnv(value)


def node_name_errors(name: str | None, flag: str = "--node-name") -> list[str]:
    """A Node name is a DNS-1123 subdomain; it also names the pool and the slices. The
    one rule and wording for every command; a name from ``$NODE_NAME`` is called that."""
    if not name:
        return [f"{flag} is required (or set NODE_NAME)"]
    flag = getattr(name, "flag", flag)
    if not is_dns_subdomain(name):
        return [
            f"{flag} {name!r} is not a valid Kubernetes node name (lower-case letters, digits, "
            "'-' and '.', starting and ending with a letter or digit, at most 253 characters)"
        ]
    return []


def driver_errors(name: str, flag: str = "--driver") -> list[str]:
    """CSI driver-name rules, lower case only (the name is also the CDI vendor and the
    taint-key prefix, which are case-sensitive); a name from ``$DRIVER_NAME`` is called so."""
    flag = getattr(name, "flag", flag)
    errs = [e.replace("spec.driver", f"{flag} {name!r}") for e in driver_name_errors(name)]
    if not errs and name != name.lower():
        errs.append(f"{flag} {name!r} must be lower case")
    return errs


def check_names(node_name: str | None, driver: str, driver_flag: str = "--driver") -> None:
    """Raise :class:`ConfigError` for names the API server would refuse."""
    errs = driver_errors(driver, driver_flag) + node_name_errors(node_name)
    if errs:
        raise ConfigError(errs[0])
