"""Unix-socket hygiene for the kubelet-facing gRPC servers (plugin-watcher rules).

Before listen: remove a stale socket at *our own* path (a previous run that died). On
exit: remove it again, but only if it is still the one we created -- a newer instance may
already have replaced it. The kubelet reaches the sockets as root; nobody else needs to,
so they are created without world access.

gRPC unlinks the path it bound when the server shuts down, whoever owns that path by
then. So the server binds a hidden per-process name (the kubelet ignores dot files) and
the socket is renamed onto the public name once it listens: the public name appears
atomically, fully set up, and gRPC's own unlink at shutdown hits the old hidden name.

A socket is stale only when nobody accepts connections on it. A live one belongs to
another process serving the same driver on this node; replacing it would take over its
kubelet registration, and that process (or ours, if our start then fails and removes
what it bound) would leave the kubelet with no plugin at all: "DRA driver ... is not
registered". So a live socket is never removed; the start fails with :class:`SocketInUse`
(the kubelet restarts the container with back-off until the other one has gone).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import stat
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from driver.kubelet.grpc_logging import LoggingInterceptor

log = logging.getLogger("driver.sockets")

SOCKET_MODE = 0o660
UNIX_PATH_MAX = 108
_umask_lock = threading.Lock()
#: How long a connect to an existing socket may take before it counts as live (a busy
#: server with a full backlog); a stale file refuses at once.
PROBE_TIMEOUT_S = 1.0


class SocketInUse(FileExistsError):
    """Another process accepts connections on the socket path."""


def is_live(path: Path) -> bool:
    """Whether some process accepts connections on the unix socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(str(path))
    except TimeoutError:
        return True
    except OSError:  # refused (nobody listens), gone, not a socket
        return False
    finally:
        probe.close()
    return True


def check_socket_path(path: Path) -> None:
    if not path.is_absolute():
        raise ValueError(f"socket path {path} must be absolute (the kubelet dials it as is)")
    if len(os.fsencode(path)) >= UNIX_PATH_MAX:
        raise ValueError(f"socket path {path} is longer than {UNIX_PATH_MAX - 1} bytes")


def remove_stale(path: Path) -> None:
    """Unlink a socket file left at ``path``; refuse to touch anything that is not one,
    or a socket another process still serves (:class:`SocketInUse`)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket; not removing it")
    if is_live(path):
        raise SocketInUse(
            f"{path} is served by another running process (a second instance of this "
            "driver on this node?); not replacing it"
        )
    log.info("removing stale socket %s", path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@dataclass
class SocketServer:
    """A started gRPC server on one unix socket; ``stop`` removes that socket."""

    server: grpc.Server
    path: Path
    inode: tuple[int, int]
    """(inode, ctime ns) of the socket file: an inode number alone is reused at once on
    tmpfs, so a successor's socket could pass for ours."""
    on_stop: Callable[[], None] | None = None

    def stop(self, grace: float | None = 5.0) -> None:
        """Stop accepting, let in-flight calls finish for ``grace`` seconds, remove the
        socket (only if it is still ours)."""
        if self.on_stop is not None:
            self.on_stop()
        self.server.stop(grace).wait()
        remove_own(self.path, self.inode)

    def wait(self, timeout: float | None = None) -> bool:
        return bool(self.server.wait_for_termination(timeout))


def file_id(st: os.stat_result) -> tuple[int, int]:
    return (st.st_ino, st.st_ctime_ns)


def remove_own(path: Path, inode: tuple[int, int]) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and file_id(st) == inode:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def serve_unix(
    path: Path,
    register: Callable[[grpc.Server], None],
    *,
    max_workers: int = 16,
    interceptors: tuple[grpc.ServerInterceptor, ...] = (),
) -> SocketServer:
    """Create, bind (stale socket removed first), restrict the mode and start a server."""
    check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    remove_stale_binds(path)
    bind_path = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}")
    if len(os.fsencode(bind_path)) >= UNIX_PATH_MAX:
        bind_path = path
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=(LoggingInterceptor(), *interceptors),
        options=[("grpc.so_reuseport", 0)],
    )
    register(server)
    # The umask covers the window between bind() and chmod(); it is process-wide, so
    # servers started from several threads take turns.
    with _umask_lock:
        old = os.umask(0o117)
        try:
            if server.add_insecure_port(f"unix://{bind_path}") == 0:
                raise OSError(f"cannot listen on {bind_path}")
        finally:
            os.umask(old)
    os.chmod(bind_path, SOCKET_MODE)
    server.start()
    if bind_path != path:
        os.replace(bind_path, path)  # a rename changes the ctime: identify it after
    inode = file_id(path.lstat())
    return SocketServer(server=server, path=path, inode=inode)


def remove_stale_binds(path: Path) -> None:
    """Hidden bind names (``.<name>.<pid>.<hex>``) left by a run that was killed."""
    prefix = f".{path.name}."
    try:
        entries = os.listdir(path.parent)
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.startswith(prefix) and not _pid_alive(entry[len(prefix) :].split(".")[0]):
            # PIDs of other containers' processes are not ours to judge: a live bind
            # (another instance starting up right now) raises SocketInUse and stays.
            with contextlib.suppress(FileExistsError):
                remove_stale(path.parent / entry)


def _pid_alive(text: str) -> bool:
    """Another live process of ours may be starting up right now: leave its bind alone."""
    if not text.isdigit() or int(text) == os.getpid():
        return False
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
