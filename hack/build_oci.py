#!/usr/bin/env python3
"""Build the toposlice image without a container daemon: an OCI image tarball.

    python3 hack/build_oci.py [-o toposlice-image.tar] [--name docker.io/library/toposlice:dev]

The same image as the Dockerfile (entrypoint ``toposlice``, command ``run``, user
10001:10001), made from parts this machine can fetch with ordinary clients:

1. a Python 3.11 root filesystem from Debian packages (``apt-get download`` of the
   interpreter, its standard library and their shared libraries, including ``libstdc++6``
   for grpcio and ``libudev1`` for pyudev), unpacked with ``dpkg -x``;
2. the project and the wheels of its dependencies, ``pip install --target`` into the
   interpreter's ``dist-packages`` (binary wheels for CPython 3.11 / manylinux, whatever
   Python runs this script), and the ``toposlice`` command;
3. bytecode compiled ahead (``unchecked-hash``: the root filesystem is read-only);
4. one layer, written as an OCI image layout in a tar (``index.json`` names the image with
   its fully qualified name, which ``ctr images import`` needs for the kubelet to find
   ``toposlice:dev``) plus a ``manifest.json`` so ``docker load`` / ``podman load`` take it
   too.

Downloads are kept in a cache folder (``--cache``, default ``$XDG_CACHE_HOME`` or
``~/.cache``/toposlice/oci-build): a rebuild fetches no package again. Needs ``apt-get`` and
``dpkg`` (Debian or Ubuntu host). As root, the finished root filesystem is smoke-tested in
a chroot (``toposlice machines``), as the Dockerfile's build does. The layer is
reproducible: entries sorted, owned by root, one timestamp (``$SOURCE_DATE_EPOCH``, else 0).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_NAME = "docker.io/library/toposlice:dev"
PY = "python3.11"
SITE = "usr/local/lib/python3.11/dist-packages"
UID = GID = 10001

#: Debian (bookworm) packages of the root filesystem: the interpreter, its standard
#: library and every shared library they and the wheels load. Nothing else (no shell,
#: no package manager): the image runs one program.
PACKAGES = (
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "media-types",
    "libc6",
    "libgcc-s1",
    "gcc-12-base",
    "libstdc++6",
    "zlib1g",
    "libexpat1",
    "libssl3",
    "libbz2-1.0",
    "libcrypt1",
    "libdb5.3",
    "libffi8",
    "liblzma5",
    "libncursesw6",
    "libtinfo6",
    "libnsl2",
    "libtirpc3",
    "libtirpc-common",
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libkrb5support0",
    "libcom-err2",
    "libkeyutils1",
    "libreadline8",
    "readline-common",
    "libsqlite3-0",
    "libuuid1",
    "libudev1",
)

#: Parts of the packages a running image never reads.
PRUNE = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/locale",
    "usr/lib/python3.11/test",
    "usr/lib/python3.11/idlelib",
    "usr/lib/python3.11/tkinter",
    "usr/lib/python3.11/turtledemo",
    "usr/lib/python3.11/lib2to3/tests",
    "usr/lib/python3.11/ensurepip",
)

#: Machine names of Debian architectures, for wheel platform tags.
WHEEL_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}
GLIBC_MINOR = 36  # bookworm


def wheel_platforms(arch: str) -> list[str]:
    """``--platform`` arguments: every manylinux tag bookworm's glibc 2.36 runs (pip does
    not expand a given ``manylinux_2_36`` tag to the older ones)."""
    machine = WHEEL_ARCH.get(arch)
    if machine is None:
        raise BuildError(f"no wheel platform known for architecture {arch}")
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR, 16, -1)]
    tags += [f"manylinux2014_{machine}"]
    return [arg for tag in tags for arg in ("--platform", tag)]


#: The ``toposlice`` command, as pip writes console scripts: the guard matters, since the
#: rediscovery helper is a ``spawn`` child that runs this file again as ``__mp_main__``;
#: without it the child would start a second driver in the pod.
LAUNCHER = f"""#!/usr/bin/{PY}
import sys
from toposlice.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""


class BuildError(RuntimeError):
    """One line saying what failed."""


def log(msg: str) -> None:
    print(f"build-oci: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)
    except FileNotFoundError as exc:
        raise BuildError(f"{cmd[0]} not found (needs a Debian/Ubuntu host)") from exc
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
        raise BuildError(f"{' '.join(cmd[:4])}...: {' / '.join(tail)}") from exc


def deb_arch() -> str:
    return run(["dpkg", "--print-architecture"]).stdout.strip()


def cache_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "toposlice" / "oci-build"


# -- 1. the Debian root filesystem ---------------------------------------------------------


def fetch_debs(cache: Path, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The packages' .deb files (the candidate versions of this host's apt lists)."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_", 1)[0]: p for p in debs.glob("*.deb")}
    missing = [p for p in packages if p not in have]
    if missing:
        log(f"apt-get download {len(missing)} package(s)")
        run(["apt-get", "download", *missing], cwd=debs)
        have = {p.name.split("_", 1)[0]: p for p in debs.glob("*.deb")}
    lost = [p for p in packages if p not in have]
    if lost:
        raise BuildError(f"apt-get download did not fetch {', '.join(lost)}")
    return [have[p] for p in packages]


def unpack_debs(debs: list[Path], rootfs: Path, *, python: bool = True) -> None:
    for deb in debs:
        run(["dpkg", "-x", str(deb), str(rootfs)])
    for rel in PRUNE:
        shutil.rmtree(rootfs / rel, ignore_errors=True)
    # Debian's python3-minimal would add these; the image has only one interpreter.
    for name in ("python3", "python") if python else ():
        link = rootfs / "usr/bin" / name
        if not link.exists():
            link.symlink_to(PY)


# -- 2. the project and its wheels ---------------------------------------------------------


def fetch_wheels(cache: Path, arch: str, source: Path) -> Path:
    """The project's wheel (built from ``source``) and its dependencies' wheels."""
    wheels = cache / "wheels"
    shutil.rmtree(wheels / "project", ignore_errors=True)
    (wheels / "project").mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run([*pip, "wheel", "--no-deps", "-w", str(wheels / "project"), str(source)])
    project = next((wheels / "project").glob("toposlice-*.whl"))
    # pip download saves the project's own wheel among the dependencies; an earlier build's
    # copy of the same version would be taken instead of this one, with its old
    # requirements (a dependency added since would then be missing at install).
    for stale in (wheels / "deps").glob("toposlice-*.whl"):
        stale.unlink()
    run(
        [
            *pip,
            "download",
            "-d",
            str(wheels / "deps"),
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            *wheel_platforms(arch),
            str(project),
        ]
    )
    return project


def install_wheels(project: Path, cache: Path, rootfs: Path) -> None:
    target = rootfs / SITE
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "-q",
            "install",
            "--no-index",
            "--find-links",
            str(cache / "wheels" / "deps"),
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            *wheel_platforms(deb_arch()),
            "--no-compile",
            "--target",
            str(target),
            str(project),
        ]
    )
    shutil.rmtree(target / "bin", ignore_errors=True)  # scripts with this host's shebang
    launcher = rootfs / "usr/local/bin/toposlice"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)


def add_user(rootfs: Path) -> None:
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"toposlice:x:{UID}:{GID}::/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\ntoposlice:x:{GID}:\n")
    for d in ("tmp", "var/tmp"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
        (rootfs / d).chmod(0o1777)
    for d in ("proc", "sys", "dev", "run", "root"):
        (rootfs / d).mkdir(exist_ok=True)


# -- 3. bytecode and a smoke test ----------------------------------------------------------


def in_chroot_ok() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("chroot") is not None


def compile_bytecode(rootfs: Path) -> str:
    """With this Python when it is a 3.11 (same bytecode magic; parallel), else with the
    image's own interpreter in a chroot (one process: no /dev/shm there)."""
    args = ["-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash"]
    dirs = ["usr/lib/python3.11", SITE]
    if sys.version_info[:2] == (3, 11):
        for d in dirs:
            run([sys.executable, *args, "-j", "0", "-s", str(rootfs), "-p", "/", str(rootfs / d)])
        return "host python 3.11"
    if in_chroot_ok():
        run(["chroot", str(rootfs), f"/usr/bin/{PY}", *args, *(f"/{d}" for d in dirs)])
        return "chroot"
    return "skipped (not root and this Python is not 3.11)"


def smoke_test(rootfs: Path) -> bool:
    if not in_chroot_ok():
        return False
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent"}
    chroot = shutil.which("chroot") or "chroot"
    run([chroot, f"--userspec={UID}:{GID}", str(rootfs), "toposlice", "machines"], env=env)
    return True


# -- 4. the OCI image ----------------------------------------------------------------------


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to ``out``."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


def _walk(rootfs: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(rootfs):
        dirnames.sort()
        here = Path(dirpath)
        names = sorted(dirnames + filenames)
        for name in names:
            yield here / name


def write_layer(rootfs: Path, out: Path, mtime: int) -> tuple[str, str, int]:
    """gzip'd tar of ``rootfs``: (diff_id, digest, size)."""

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = mtime
        return info

    with out.open("wb") as fh:
        outer = _Hashing(fh)
        with gzip.GzipFile(fileobj=outer, mode="wb", compresslevel=6, mtime=mtime) as gz:
            inner = _Hashing(gz)  # type: ignore[arg-type]
            with tarfile.open(fileobj=inner, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path in _walk(rootfs):
                    rel = path.relative_to(rootfs).as_posix()
                    tar.add(str(path), arcname=rel, recursive=False, filter=normalize)
    return f"sha256:{inner.sha.hexdigest()}", f"sha256:{outer.sha.hexdigest()}", outer.size


def _blob(data: bytes) -> tuple[str, bytes]:
    return f"sha256:{hashlib.sha256(data).hexdigest()}", data


def _canon(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


#: What the Dockerfile's runtime stage declares.
TOPOSLICE_CONFIG: dict[str, Any] = {
    "User": f"{UID}:{GID}",
    "Entrypoint": ["toposlice"],
    "Cmd": ["run"],
    "Env": [
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
        "LANG=C.UTF-8",
    ],
    "Labels": {"org.opencontainers.image.source": "toposlice"},
}


def image_config(arch: str, diff_id: str, created: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "created": created,
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "hack/build_oci.py"}],
    }


def write_image(
    layer: Path,
    diff_id: str,
    digest: str,
    size: int,
    name: str,
    out: Path,
    config: dict[str, Any] = TOPOSLICE_CONFIG,
) -> None:
    arch = deb_arch()
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
    cfg_digest, cfg = _blob(_canon(image_config(arch, diff_id, created, config)))
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": cfg_digest,
            "size": len(cfg),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": digest,
                "size": size,
            }
        ],
    }
    man_digest, man = _blob(_canon(manifest))
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": manifest["mediaType"],
                "digest": man_digest,
                "size": len(man),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    docker = [
        {
            "Config": f"blobs/sha256/{cfg_digest[7:]}",
            "RepoTags": [name.removeprefix("docker.io/library/")],
            "Layers": [f"blobs/sha256/{digest[7:]}"],
        }
    ]

    def entry(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
        info = tarfile.TarInfo(arcname)
        info.size, info.mtime, info.mode = len(data), mtime, 0o644
        tar.addfile(info, io.BytesIO(data))

    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        entry(tar, "oci-layout", _canon({"imageLayoutVersion": "1.0.0"}))
        entry(tar, "index.json", _canon(index))
        entry(tar, "manifest.json", _canon(docker))
        entry(tar, f"blobs/sha256/{cfg_digest[7:]}", cfg)
        entry(tar, f"blobs/sha256/{man_digest[7:]}", man)
        info = tarfile.TarInfo(f"blobs/sha256/{digest[7:]}")
        info.size, info.mtime, info.mode = size, mtime, 0o644
        with layer.open("rb") as blob:
            tar.addfile(info, blob)
    with tmp.open("rb+") as written:
        os.fsync(written.fileno())
    os.replace(tmp, out)


# -- main ----------------------------------------------------------------------------------


def build(
    out: Path, name: str, cache: Path, source: Path = REPO, work: Path | None = None
) -> dict[str, Any]:
    """Build the image tarball; returns the figures it prints."""
    if ":" not in name.rsplit("/", 1)[-1] or "/" not in name:
        raise BuildError(f"--name {name!r}: give the fully qualified name, e.g. {DEFAULT_NAME}")
    started = time.monotonic()
    arch = deb_arch()
    with tempfile.TemporaryDirectory(prefix="toposlice-oci-", dir=work) as tmp:
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir()
        unpack_debs(fetch_debs(cache), rootfs)
        base_mb = _du(rootfs) / 1e6
        install_wheels(fetch_wheels(cache, arch, source), cache, rootfs)
        add_user(rootfs)
        compiled = compile_bytecode(rootfs)
        smoked = smoke_test(rootfs)
        rootfs_mb = _du(rootfs) / 1e6
        layer = Path(tmp) / "layer.tar.gz"
        mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
        diff_id, digest, size = write_layer(rootfs, layer, mtime)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_image(layer, diff_id, digest, size, name, out)
    return {
        "image": name,
        "tarball": str(out),
        "tarball_mb": round(out.stat().st_size / 1e6, 1),
        "debian_rootfs_mb": round(base_mb, 1),
        "rootfs_mb": round(rootfs_mb, 1),
        "packages": len(PACKAGES),
        "bytecode": compiled,
        "smoke_test": "toposlice machines in a chroot" if smoked else "skipped (not root)",
        "build_s": round(time.monotonic() - started, 1),
        "platform": f"linux/{arch} ({platform.machine()})",
    }


#: ``--workload``: a stand-in for the examples' ``ubuntu:24.04`` on a node without a
#: registry: bash (the examples run ``bash -c``) and busybox's tools, nothing else.
WORKLOAD_PACKAGES = ("bash", "libc6", "libtinfo6", "busybox-static")
WORKLOAD_CONFIG: dict[str, Any] = {
    "Cmd": ["bash"],
    "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
}


def build_workload(out: Path, name: str, cache: Path, work: Path | None = None) -> dict[str, Any]:
    """A small image with bash and busybox's applets (``cat``, ``env``, ``grep``,
    ``sleep``...) linked in ``/usr/local/bin``."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="toposlice-oci-", dir=work) as tmp:
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir()
        unpack_debs(fetch_debs(cache, WORKLOAD_PACKAGES), rootfs, python=False)
        busybox = rootfs / "bin" / "busybox"
        applets = run([str(busybox), "--list"]).stdout.split()
        bindir = rootfs / "usr/local/bin"
        bindir.mkdir(parents=True, exist_ok=True)
        for applet in applets:
            if not any((rootfs / d / applet).exists() for d in ("bin", "usr/bin", "sbin")):
                (bindir / applet).symlink_to("/bin/busybox")
        add_user(rootfs)
        layer = Path(tmp) / "layer.tar.gz"
        mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
        diff_id, digest, size = write_layer(rootfs, layer, mtime)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_image(layer, diff_id, digest, size, name, out, WORKLOAD_CONFIG)
    return {
        "image": name,
        "tarball": str(out),
        "tarball_mb": round(out.stat().st_size / 1e6, 1),
        "build_s": round(time.monotonic() - started, 1),
    }


def _du(root: Path) -> int:
    total = 0
    for path in _walk(root):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("-o", "--output", default="toposlice-image.tar", help="OCI tarball to write")
    ap.add_argument("--name", default=DEFAULT_NAME, help="fully qualified image name")
    ap.add_argument("--cache", help="download cache (default ~/.cache/toposlice/oci-build)")
    ap.add_argument(
        "--source", default=str(REPO), help="project tree to install (default: this checkout)"
    )
    ap.add_argument(
        "--workload",
        action="store_true",
        help="build the examples' stand-in workload image (bash + busybox) instead",
    )
    ns = ap.parse_args(argv)
    try:
        source = Path(ns.source).absolute()
        if ns.workload:
            figures = build_workload(Path(ns.output).absolute(), ns.name, cache_dir(ns.cache))
        else:
            figures = build(Path(ns.output).absolute(), ns.name, cache_dir(ns.cache), source)
    except BuildError as exc:
        print(f"build-oci: {exc}", file=sys.stderr)
        return 1
    for key, value in figures.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
