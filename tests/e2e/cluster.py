"""A real Kubernetes v1.36.2 control plane on 127.0.0.1 for the ``e2e`` tier.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are started from the
binaries of ``../shared/kube`` (README there) with the flags of its ``up.sh``, on free
loopback ports, in a folder of their own; every process is recorded by PID and stopped
by PID in :meth:`Cluster.stop` (also registered with ``atexit``). There is no kubelet:
:meth:`Cluster.add_node` creates a Node object and a background thread keeps it Ready
(Lease and Ready condition renewed), with the controller-manager's node-monitor grace
period shortened so that a lapse shows within seconds rather than a minute.

Where the binaries come from (:func:`find_assets`): ``$TOPOSLICE_KUBE_ASSETS`` (a folder
holding ``assets/`` and, for the node tier, ``node/``), else the tarballs in
``$TOPOSLICE_SHARED/kube`` (default ``../shared/kube``) unpacked once, atomically, into
``$XDG_CACHE_HOME/toposlice/kube-v1.36.2`` (``~/.cache`` without it).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hack.hwloc_fixtures import SHARED

KUBE_VERSION = "v1.36.2"
CONTROL_PLANE_TARBALL = f"kube-{KUBE_VERSION}-linux-amd64.tar.xz"
NODE_TARBALL = f"kube-node-{KUBE_VERSION}-containerd-2.3.4-linux-amd64.tar.xz"
SHARED_KUBE = SHARED / "kube"

SKIP_REASON = (
    f"Kubernetes {KUBE_VERSION} binaries not found: set TOPOSLICE_KUBE_ASSETS to a folder "
    f"holding assets/ (and node/), or put {CONTROL_PLANE_TARBALL} in {SHARED_KUBE} "
    "(see ../shared/kube/README.md)"
)

#: The DRA feature gates up.sh enables (all known to the v1.36.2 binaries).
FEATURE_GATES = (
    "DRADeviceTaints",
    "DRAPrioritizedList",
    "DRAPartitionableDevices",
    "DRAConsumableCapacity",
    "DRAResourceClaimDeviceStatus",
    "DRAAdminAccess",
    "DRAListTypeAttributes",
    "DRADeviceTaintRules",
)
RUNTIME_CONFIG = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"

#: The controller-manager marks a node NotReady when its Lease is older than this; the
#: harness renews the Lease every NODE_RENEW_S (what the lifecycle controller watches,
#: as the kubelet's) and the Ready condition every NODE_STATUS_ROUNDS renewals (every
#: renewal in a node's first NODE_STATUS_EARLY_S: status updates are what make the
#: controller lift a new node's not-ready taint), so a broken renewal shows within
#: seconds and a busy test process has 8 renewals of slack.
NODE_GRACE_S = 8
NODE_RENEW_S = 1.0
NODE_STATUS_ROUNDS = 10
NODE_STATUS_EARLY_S = 6.0

#: Seconds between SIGTERM and SIGKILL. kube-apiserver v1.36.2 closes its port at once on
#: SIGTERM but its process lingers ~15 s; etcd takes ~7 s while clients hold watches.
#: Neither keeps anything the tests need past that point (etcd runs --unsafe-no-fsync
#: but has written its WAL by then; restart_etcd checks the data survived).
STOP_GRACE_S = {"kube-apiserver": 3.0, "etcd": 3.0}
DEFAULT_GRACE_S = 10.0

T = TypeVar("T")


# --------------------------------------------------------------------------- binaries


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toposlice" / f"kube-{KUBE_VERSION}"


def _complete(root: Path, node: bool) -> bool:
    if not (root / "assets" / "kube-apiserver").is_file():
        return False
    return not node or (root / "node" / "kubelet").is_file()


def _unpack(tarball: Path, part: str, cache: Path) -> None:
    """Unpack ``tarball`` (whose top folder is ``part``) into ``cache/part`` atomically:
    into a temp folder beside it, then one rename; a concurrent winner is kept."""
    if (cache / part).is_dir():
        return
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{part}-", dir=cache))
    try:
        subprocess.run(["tar", "-xJf", str(tarball), "-C", str(tmp)], check=True)
        with contextlib.suppress(OSError):  # another process renamed first: keep theirs
            os.rename(tmp / part, cache / part)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def find_assets(node: bool = False) -> Path | None:
    """The folder holding ``assets/`` (and ``node/`` when ``node``), or None."""
    env = os.environ.get("TOPOSLICE_KUBE_ASSETS")
    if env:
        root = Path(env)
        if (root / "kube-apiserver").is_file():  # pointed at assets/ itself
            root = root.parent
        return root if _complete(root, node) else None
    cache = _cache_root()
    if _complete(cache, node):
        return cache
    cp, nd = SHARED_KUBE / CONTROL_PLANE_TARBALL, SHARED_KUBE / NODE_TARBALL
    if not cp.is_file() or (node and not nd.is_file()):
        return None
    _unpack(cp, "assets", cache)
    if node:
        _unpack(nd, "node", cache)
    return cache if _complete(cache, node) else None


# --------------------------------------------------------------------------- helpers


def poll(
    fn: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``fn`` until it returns something truthy (returned); exceptions count as "not
    yet". Raises TimeoutError naming ``what`` and the last exception after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached after {timeout:.0f}s (last error: {last!r})")
        time.sleep(interval)


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """CA, service-account key pair and the certificates up.sh makes (openssl)."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out"),
        *("ca.crt", "-days", "3650", "-subj", "/CN=toposlice-e2e-ca"),
        cwd=pki,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    sans = (
        "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1"
    )
    certs = [
        ("apiserver", "kube-apiserver", "", sans),
        ("admin", "kubernetes-admin", "system:masters", ""),
        ("controller-manager", "system:kube-controller-manager", "", ""),
        ("scheduler", "system:kube-scheduler", "", ""),
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters", ""),
    ]

    def cert(name: str, cn: str, org: str, san: str) -> None:
        subj = f"/O={org}/CN={cn}" if org else f"/CN={cn}"
        _openssl(
            *("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key"),
            *("-out", f"{name}.csr", "-subj", subj),
            cwd=pki,
        )
        ext = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
        ext += (
            ["extendedKeyUsage=serverAuth", f"subjectAltName={san}"]
            if san
            else ["extendedKeyUsage=clientAuth"]
        )
        (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _openssl(
            *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
            *("-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-out", f"{name}.crt"),
            *("-days", "3650", "-extfile", f"{name}.ext"),
            cwd=pki,
        )
        (pki / f"{name}.csr").unlink()
        (pki / f"{name}.ext").unlink()

    with ThreadPoolExecutor(len(certs)) as pool:  # RSA key generation dominates
        for f in [pool.submit(cert, *c) for c in certs]:
            f.result()


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    user: str,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> Path:
    creds: dict[str, str] = {}
    if cert and key:
        creds = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        creds = {"token": token}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)
    return path


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------- cluster


def node_object(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node with the labels a kubelet sets on itself, plus LABELS (no status)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
    }


class Cluster:
    """A running control plane. Build it with :meth:`Cluster.start`."""

    COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")

    def __init__(
        self, dir: Path, assets: Path, extra_args: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        self.dir = dir.resolve()
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self._restart_args: dict[str, list[str]] = {}
        """Flags a restart appended, per component (restart_apiserver)."""
        self.assets = assets.resolve()
        self.bin = self.assets / "assets"
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.pids = self.dir / "pids"
        (
            self.etcd_port,
            self.etcd_peer_port,
            self.api_port,
            self.kcm_port,
            self.sched_port,
        ) = free_ports(5)
        self.api_url = f"https://127.0.0.1:{self.api_port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}
        self._nodes: dict[str, float] = {}
        self._nodes_lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._client: Any = None
        self.timings: dict[str, float] = {}

    # ---- start / stop

    @classmethod
    def start(
        cls,
        dir: Path,
        assets: Path | None = None,
        extra_args: Mapping[str, Sequence[str]] | None = None,
    ) -> Cluster:
        """Start every component; ``extra_args`` appends flags per component name (a later
        flag wins, e.g. ``--controllers`` for a cluster of Node objects that no lifecycle
        controller should mark NotReady)."""
        assets = assets or find_assets()
        if assets is None:
            raise RuntimeError(SKIP_REASON)
        c = cls(dir, assets, extra_args)
        atexit.register(c.stop)
        try:
            c._start_all()
        except BaseException:
            c.stop()
            raise
        return c

    def _start_all(self) -> None:
        for d in (self.logs, self.pids, self.dir / "etcd-data"):
            d.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        make_pki(self.pki)
        self.timings["pki"] = time.monotonic() - t0
        write_kubeconfig(
            self.kubeconfig,
            self.api_url,
            self.pki / "ca.crt",
            "admin",
            cert=self.pki / "admin.crt",
            key=self.pki / "admin.key",
        )
        for name, cert in (
            ("controller-manager", "controller-manager"),
            ("scheduler", "scheduler"),
        ):
            write_kubeconfig(
                self.dir / f"{name}.kubeconfig",
                self.api_url,
                self.pki / "ca.crt",
                f"system:kube-{name}",
                cert=self.pki / f"{cert}.crt",
                key=self.pki / f"{cert}.key",
            )
        gates = ",".join(f"{g}=true" for g in FEATURE_GATES)
        pki, b = self.pki, self.bin
        self._argv["etcd"] = [
            str(b / "etcd"),
            *("--name", "e2e", "--data-dir", str(self.dir / "etcd-data")),
            f"--listen-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            "--unsafe-no-fsync",
            *("--log-level", "warn"),
        ]
        self._argv["kube-apiserver"] = [
            str(b / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={pki}/apiserver.crt",
            f"--tls-private-key-file={pki}/apiserver.key",
            f"--client-ca-file={pki}/ca.crt",
            f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
            f"--service-account-key-file={pki}/sa.pub",
            f"--service-account-signing-key-file={pki}/sa.key",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            f"--feature-gates={gates}",
            f"--runtime-config={RUNTIME_CONFIG}",
            "--profiling=false",
        ]
        common = [
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--feature-gates={gates}",
        ]
        kcm = self.dir / "controller-manager.kubeconfig"
        self._argv["kube-controller-manager"] = [
            str(b / "kube-controller-manager"),
            f"--kubeconfig={kcm}",
            f"--authentication-kubeconfig={kcm}",
            f"--authorization-kubeconfig={kcm}",
            f"--secure-port={self.kcm_port}",
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki}/sa.key",
            f"--root-ca-file={pki}/ca.crt",
            f"--cluster-signing-cert-file={pki}/ca.crt",
            f"--cluster-signing-key-file={pki}/ca.key",
            f"--node-monitor-grace-period={NODE_GRACE_S}s",
            "--node-monitor-period=1s",
            *common,
        ]
        sched = self.dir / "scheduler.kubeconfig"
        self._argv["kube-scheduler"] = [
            str(b / "kube-scheduler"),
            f"--kubeconfig={sched}",
            f"--authentication-kubeconfig={sched}",
            f"--authorization-kubeconfig={sched}",
            f"--secure-port={self.sched_port}",
            *common,
        ]
        for name, extra in self.extra_args.items():
            self._argv[name] = [*self._argv[name], *extra]
        for name in self.COMPONENTS:
            t0 = time.monotonic()
            self._launch(name)
            self._wait_ready(name)
            self.timings[name] = time.monotonic() - t0
        self._renewer = threading.Thread(target=self._renew_nodes, name="e2e-nodes", daemon=True)
        self._renewer.start()

    def _launch(self, name: str) -> None:
        self.spawn(name, self._argv[name])

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a process whose output goes to ``logs/NAME.log`` (appended) and whose PID
        is recorded; :meth:`stop` ends it (also any process a test starts this way)."""
        log = open(self.logs / f"{name}.log", "ab")
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        (self.pids / f"{name}.pid").write_text(f"{proc.pid}\n")
        return proc

    def kill(self, name: str, sig: int = signal.SIGTERM, timeout: float | None = None) -> None:
        """Stop the process recorded as ``name`` by its PID: ``sig``, then SIGKILL after
        ``timeout`` (default: STOP_GRACE_S for the component, else DEFAULT_GRACE_S)."""
        self._signal(name, sig)
        self._reap(name, time.monotonic() + self._grace(name, timeout))

    def _grace(self, name: str, timeout: float | None) -> float:
        return timeout if timeout is not None else STOP_GRACE_S.get(name, DEFAULT_GRACE_S)

    def _signal(self, name: str, sig: int) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)

    def _reap(self, name: str, deadline: float) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            (self.pids / f"{name}.pid").unlink()

    def kill_all(self, names: Iterable[str], sig: int = signal.SIGTERM) -> None:
        """:meth:`kill` for several processes at once: all signalled, then each reaped."""
        names = list(names)
        start = time.monotonic()
        for name in names:
            self._signal(name, sig)
        for name in names:
            self._reap(name, start + self._grace(name, None))

    def stop(self) -> None:
        """Stop the node renewer and every process started (SIGTERM to all, newest first,
        then each reaped by PID, SIGKILL after its grace period)."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=10)
        self.kill_all(reversed(list(self.procs)))

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ---- readiness

    def _ssl(self, verify: bool) -> ssl.SSLContext:
        if not verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _get_ok(self, url: str, ctx: ssl.SSLContext | None) -> bool:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
            return bool(resp.status == 200)

    def _wait_ready(self, name: str, timeout: float = 120.0) -> None:
        url, ctx = {
            "etcd": (f"{self.etcd_url}/health", None),
            "kube-apiserver": (f"{self.api_url}/readyz", self._ssl(True)),
            "kube-controller-manager": (
                f"https://127.0.0.1:{self.kcm_port}/healthz",
                self._ssl(False),
            ),
            "kube-scheduler": (f"https://127.0.0.1:{self.sched_port}/readyz", self._ssl(False)),
        }[name]
        proc = self.procs[name]

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{self.log_tail(name)}")
            return self._get_ok(url, ctx)

        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except RuntimeError:
                raise
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout:.0f}s:\n{self.log_tail(name)}")
            time.sleep(0.1)

    def apiserver_ready(self) -> bool:
        try:
            return self._get_ok(f"{self.api_url}/readyz", self._ssl(True))
        except Exception:
            return False

    def restart_apiserver(self, extra_args: Sequence[str] | None = None) -> None:
        """Stop kube-apiserver (SIGTERM, by PID) and start it again on the same port;
        with ``extra_args``, with those flags in place of an earlier restart's (``()``
        drops them; None keeps them)."""
        self.kill("kube-apiserver")
        if extra_args is not None:
            argv = self._argv["kube-apiserver"]
            before = self._restart_args.get("kube-apiserver", [])
            self._argv["kube-apiserver"] = [*argv[: len(argv) - len(before)], *extra_args]
            self._restart_args["kube-apiserver"] = list(extra_args)
        self._launch("kube-apiserver")
        self._wait_ready("kube-apiserver")

    def restart_scheduler(self, extra_args: Sequence[str] = ()) -> None:
        """Stop kube-scheduler (by PID) and start it again with the harness's flags plus
        ``extra_args`` (replacing those given before)."""
        self.kill("kube-scheduler")
        base = [
            a
            for a in self._argv["kube-scheduler"]
            if a not in self.extra_args.get("kube-scheduler", [])
        ]
        self.extra_args["kube-scheduler"] = list(extra_args)
        self._argv["kube-scheduler"] = [*base, *extra_args]
        self._launch("kube-scheduler")
        self._wait_ready("kube-scheduler")

    def restart_etcd(self) -> None:
        """Stop etcd (SIGTERM, by PID) and start it again on the same data; returns when
        the API server is ready again (its etcd check passes)."""
        self.kill("etcd")
        self._launch("etcd")
        self._wait_ready("etcd")
        self._wait_ready("kube-apiserver")

    # ---- clients

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run the real kubectl with the admin kubeconfig; stdout (stderr appended when
        ``check`` is False). Raises CalledProcessError with stderr when ``check``."""
        cmd = [
            str(self.bin / "kubectl"),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.dir / 'kubectl-cache'}",
            *args,
        ]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)
        return res.stdout if check else res.stdout + res.stderr

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient with the admin credentials (a new one each call)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def _core(self) -> Any:
        from kubernetes import client

        if self._client is None:
            self._client = self.api_client()
        return client.CoreV1Api(self._client), client.CoordinationV1Api(self._client)

    def apply(self, objs: Iterable[dict[str, Any]]) -> None:
        """Create or update each object (server-side apply through kubectl). CRDs go first
        and are waited for until established, so their kinds can follow in the same call."""
        objs = list(objs)
        crds = [o for o in objs if o.get("kind") == "CustomResourceDefinition"]
        rest = [o for o in objs if o.get("kind") != "CustomResourceDefinition"]
        for batch in (crds, rest):
            if not batch:
                continue
            doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": batch})
            self.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=e2e",
                "-f",
                "-",
                input=doc,
            )
            if batch is crds:
                names = [f"crd/{o['metadata']['name']}" for o in crds]
                self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)

    # ---- nodes

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A Node object kept Ready: a background thread renews its Lease every
        NODE_RENEW_S seconds (and its Ready condition every NODE_STATUS_ROUNDS renewals)
        until :meth:`remove_node`/:meth:`stop`."""
        core, _ = self._core()
        core.create_node(node_object(name, labels))
        self._renew_node(name, status=True, first=True)
        with self._nodes_lock:
            self._nodes[name] = time.monotonic()

    def remove_node(self, name: str) -> None:
        """Stop keeping ``name`` Ready and delete its Node and Lease."""
        from kubernetes.client.exceptions import ApiException

        with self._nodes_lock:
            self._nodes.pop(name, None)
        core, coord = self._core()
        for call in (
            lambda: core.delete_node(name),
            lambda: coord.delete_namespaced_lease(name, "kube-node-lease"),
        ):
            try:
                call()
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def _renew_node(self, name: str, status: bool = False, first: bool = False) -> None:
        from kubernetes.client.exceptions import ApiException

        core, coord = self._core()
        now = _now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kept Ready by the e2e harness (no kubelet)",
            "lastHeartbeatTime": now,
        }
        if first:
            ready["lastTransitionTime"] = now
        node_status = {
            "status": {
                "conditions": [ready],
                "capacity": {"cpu": "128", "memory": "1Ti", "pods": "250"},
                "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "250"},
                "nodeInfo": {
                    "kubeletVersion": KUBE_VERSION,
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                    "kernelVersion": "",
                    "osImage": "",
                    "containerRuntimeVersion": "",
                    "kubeProxyVersion": "",
                },
            }
        }
        if status:
            core.patch_node_status(name, node_status)
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": _now_micro(),
            },
        }
        try:
            coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": lease["spec"]})
        except ApiException as exc:
            if exc.status != 404:
                raise
            coord.create_namespaced_lease("kube-node-lease", lease)

    def _renew_nodes(self) -> None:
        rounds = 0
        while not self._stop.wait(NODE_RENEW_S):
            rounds += 1
            with self._nodes_lock:
                nodes = sorted(self._nodes.items())
            now = time.monotonic()
            for name, added in nodes:
                if self._stop.is_set():
                    return
                status = rounds % NODE_STATUS_ROUNDS == 0 or now - added < NODE_STATUS_EARLY_S
                with contextlib.suppress(Exception):  # API server restarting: next round
                    self._renew_node(name, status=status)

    # ---- identities

    def token_kubeconfig(
        self,
        namespace: str,
        service_account: str,
        node: str,
        expiration_s: int = 7200,
    ) -> Path:
        """A kubeconfig for ``service_account`` whose token is a TokenRequest bound to a Pod
        on ``node`` (created here, Pending for ever: there is no kubelet), so the token's
        user extra carries ``authentication.kubernetes.io/node-name`` = ``node``."""
        from kubernetes.client.exceptions import ApiException

        core, _ = self._core()
        pod_name = f"{service_account}-{node}"[:63].rstrip("-.")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": namespace},
            "spec": {
                "nodeName": node,
                "serviceAccountName": service_account,
                "automountServiceAccountToken": False,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "identity", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        try:
            created = core.create_namespaced_pod(namespace, pod)
        except ApiException as exc:
            if exc.status != 409:
                raise
            created = core.read_namespaced_pod(pod_name, namespace)
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "expirationSeconds": expiration_s,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": created.metadata.uid,
                },
            },
        }
        resp = core.create_namespaced_service_account_token(service_account, namespace, request)
        token: str = resp.status.token
        out = self.dir / "identities"
        out.mkdir(exist_ok=True)
        return write_kubeconfig(
            out / f"{namespace}.{service_account}.{node}.kubeconfig",
            self.api_url,
            self.pki / "ca.crt",
            f"{service_account}@{node}",
            token=token,
        )


def token_claims(token: str) -> dict[str, Any]:
    """The (unverified) payload of a JWT, for tests that check a token's bound node."""
    payload = token.split(".")[1]
    payload += "=" * (-len(payload) % 4)
    data: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload))
    return data
