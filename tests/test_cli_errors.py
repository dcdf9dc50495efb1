"""Bad input and unusable configuration, through the real command line (a subprocess, as a
person runs it): one line on stderr, no traceback, exit 2 for bad input or 1 for a runtime
failure, and nothing created on the host (directories the command was pointed at stay
absent). One row per case; ``{tmp}`` is the test's temporary directory, ``{busy}`` an
address already in use, ``{host_dirs}`` the driver's directories under ``{host}``; leading
``VAR=value`` words set environment variables, as in a shell.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _truncated_archive() -> bytes:
    """The first half of a gzip'd tar (as a copy or download cut short leaves it)."""
    import gzip
    import io
    import random
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        data = random.Random(0).randbytes(64 << 10)  # incompressible: the cut is mid-stream
        info = tarfile.TarInfo("sys/devices/blob")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    packed = gzip.compress(raw.getvalue())
    return packed[: len(packed) // 2]


#: Files the rows refer to, written into {tmp}.
FILES: dict[str, str | bytes] = {
    "garbage.yaml": "a: [\n",
    "string.yaml": '"just a string"\n',
    "mapping.json": '{"a": 1}\n',
    "notjson.txt": "notjson\n",
    "kubeconfig.yaml": KUBECONFIG,
    "request.yaml": "gpus: 16\n",
    "machine.yaml": "name: x\n",
    "two.yaml": "gpus: 2\n",
    "latin1.yaml": b"gpus: 2\nname: caf\xe9\n",
    "truncated.tar.gz": _truncated_archive(),
}

#: The driver's host directories, pointed into {host} (a short temporary directory: socket
#: paths have a length limit): a refused start must not create them, and a start that
#: fails later must remove those it created.
HOST_DIRS = (
    "--kubelet-registrar-directory-path {host}/registry "
    "--kubelet-plugins-directory-path {host}/plugins/toposlice.dev --cdi-root {host}/cdi "
    "--state-dir {host}/state"
)


class Case(NamedTuple):
    args: str
    rc: int
    needles: tuple[str, ...]
    """Text the one stderr line must contain (after formatting with the row's values)."""


CASES: dict[str, Case] = {
    # Bugs
    "serve-unknown-fake": Case(
        "serve --fake nope --http-addr 127.0.0.1:0", 2, ("unknown fake machine 'nope'",)
    ),
    "serve-invalid-machine-file": Case(
        "serve --fake {tmp}/machine.yaml --http-addr 127.0.0.1:0",
        2,
        ("{tmp}/machine.yaml: missing required key 'cpu'",),
    ),
    "scorer-serve-unknown-fake": Case(
        "scorer serve --no-kube --fake nope --http-addr 127.0.0.1:0",
        2,
        ("unknown fake machine 'nope'",),
    ),
    # Tracebacks instead of one line
    "run-kubeconfig-garbage-yaml": Case(
        "run --fake cpu-2s --node-name n1 --kubeconfig {tmp}/garbage.yaml {host_dirs}",
        2,
        ("--kubeconfig {tmp}/garbage.yaml: not valid YAML", "line 2, column 1"),
    ),
    "run-kubeconfig-yaml-string": Case(
        "run --fake cpu-2s --node-name n1 --kubeconfig {tmp}/string.yaml {host_dirs}",
        2,
        ("--kubeconfig {tmp}/string.yaml: not a kubeconfig",),
    ),
    "serve-port-out-of-range": Case(
        "serve --fake cpu-2s --http-addr 127.0.0.1:99999",
        2,
        ("--http-addr '127.0.0.1:99999': want HOST:PORT or :PORT with a port of 0-65535",),
    ),
    "scorer-serve-port-out-of-range": Case(
        "scorer serve --no-kube --http-addr 127.0.0.1:99999",
        2,
        ("--http-addr '127.0.0.1:99999': want HOST:PORT or :PORT with a port of 0-65535",),
    ),
    "run-port-out-of-range": Case(
        "run --fake cpu-2s --node-name n1 --kubeconfig {tmp}/kubeconfig.yaml "
        "--http-addr 127.0.0.1:99999 {host_dirs}",
        2,
        ("--http-addr '127.0.0.1:99999': want HOST:PORT or :PORT with a port of 0-65535",),
    ),
    "serve-addr-without-port": Case(
        "serve --fake cpu-2s --http-addr localhost",
        2,
        ("--http-addr 'localhost': want HOST:PORT or :PORT",),
    ),
    # Exit 0 on bad input
    "discover-unknown-probe": Case(
        "discover --fake cpu-2s --probes bogus", 2, ("--probes 'bogus': unknown probe 'bogus'",)
    ),
    "discover-missing-root": Case(
        "discover --root {tmp}/missing", 2, ("--root {tmp}/missing: no such directory",)
    ),
    "discover-inventory-not-an-inventory": Case(
        "discover --inventory {tmp}/mapping.json",
        2,
        ("--inventory {tmp}/mapping.json: not a toposlice inventory",),
    ),
    "doctor-slices-yaml-string": Case(
        "doctor --fake cpu-2s --slices {tmp}/string.yaml",
        2,
        ("--slices {tmp}/string.yaml: no ResourceSlice in it",),
    ),
    "doctor-other-nodes-slices": Case(
        "doctor --fake cpu-2s --slices {tmp}/node-b.yaml",
        2,
        ("is for node 'cpu-2s'", "node-b", "--node-name"),
    ),
    "slices-empty-node-name": Case(
        "slices --fake cpu-2s --node-name ''", 2, ("--node-name '': give a node name",)
    ),
    "serve-empty-node-name": Case(
        "serve --fake cpu-2s --node-name '' --http-addr 127.0.0.1:0",
        2,
        ("--node-name '': give a node name",),
    ),
    "serve-invalid-node-name": Case(
        "serve --fake cpu-2s --node-name Bad_Name --http-addr 127.0.0.1:0",
        2,
        ("--node-name 'Bad_Name' is not a valid Kubernetes node name",),
    ),
    "doctor-invalid-node-name": Case(
        "doctor --fake cpu-2s --node-name Bad_Name --slices {tmp}/node-b.yaml",
        2,
        ("--node-name 'Bad_Name' is not a valid Kubernetes node name",),
    ),
    "serve-invalid-node-name-env": Case(
        "NODE_NAME=Bad_Name serve --fake cpu-2s --http-addr 127.0.0.1:0",
        2,
        ("$NODE_NAME 'Bad_Name' is not a valid Kubernetes node name",),
    ),
    "doctor-invalid-node-name-env": Case(
        "NODE_NAME=Bad_Name doctor --fake cpu-2s --slices {tmp}/node-b.yaml",
        2,
        ("$NODE_NAME 'Bad_Name' is not a valid Kubernetes node name",),
    ),
    "slices-invalid-node-name-env": Case(
        "NODE_NAME=Bad_Name slices --fake cpu-2s",
        2,
        ("$NODE_NAME 'Bad_Name' is not a valid Kubernetes node name",),
    ),
    "graph-invalid-node-name-env": Case(
        "NODE_NAME=Bad_Name graph --fake cpu-2s",
        2,
        ("$NODE_NAME 'Bad_Name' is not a valid Kubernetes node name",),
    ),
    "run-invalid-node-name-env": Case(
        "NODE_NAME=Bad_Name run --fake cpu-2s --kubeconfig {tmp}/kubeconfig.yaml {host_dirs}",
        2,
        ("$NODE_NAME 'Bad_Name' is not a valid Kubernetes node name",),
    ),
    # Messages
    "inventory-not-json": Case(
        "discover --inventory {tmp}/notjson.txt",
        2,
        ("--inventory {tmp}/notjson.txt: not JSON", "line 1 column 1"),
    ),
    "fake-garbage-yaml": Case(
        "discover --fake {tmp}/garbage.yaml",
        2,
        ("--fake {tmp}/garbage.yaml: not valid YAML", "at line 2, column 1"),
    ),
    "doctor-slices-garbage-yaml": Case(
        "doctor --fake cpu-2s --slices {tmp}/garbage.yaml",
        2,
        ("{tmp}/garbage.yaml", "at line 2, column 1"),
    ),
    "serve-slices-garbage-yaml": Case(
        "serve --fake cpu-2s --slices {tmp}/garbage.yaml --http-addr 127.0.0.1:0",
        2,
        ("{tmp}/garbage.yaml", "at line 2, column 1"),
    ),
    "serve-observe-kubeconfig-garbage-yaml": Case(
        "serve --fake cpu-2s --observe --kubeconfig {tmp}/garbage.yaml --http-addr 127.0.0.1:0",
        2,
        ("--kubeconfig {tmp}/garbage.yaml: not valid YAML",),
    ),
    "serve-port-in-use": Case(
        "serve --fake cpu-2s --http-addr {busy}",
        1,
        ("--http-addr {busy}: cannot listen on {busy}: Address already in use",),
    ),
    "scorer-serve-port-in-use": Case(
        "scorer serve --no-kube --http-addr {busy}",
        1,
        ("--http-addr {busy}: cannot listen on {busy}: Address already in use",),
    ),
    "run-port-in-use": Case(
        "run --fake cpu-2s --node-name n1 --kubeconfig {tmp}/kubeconfig.yaml "
        "--http-addr {busy} {host_dirs}",
        1,
        ("--http-addr {busy}: cannot listen on {busy}: Address already in use",),
    ),
    "run-api-server-unreachable": Case(
        # Started (sockets, checkpoint, directories), then found no API server: all undone,
        # and the one line says so at the default log level (no "serving" line taken back,
        # no "stopped", no urllib3 retry line; the cause in the socket's own words).
        "run --fake dgx-h100 --node-name n1 --kubeconfig {tmp}/kubeconfig.yaml "
        "--startup-timeout 0 {host_dirs}",
        1,
        ("API server https://127.0.0.1:1 unreachable: Connection refused",),
    ),
    "run-without-kubeconfig": Case(
        "run --fake cpu-2s --node-name n1 {host_dirs}",
        2,
        ("give --kubeconfig FILE or set $KUBECONFIG",),
    ),
    "scorer-serve-without-kubeconfig": Case(
        "scorer serve --http-addr 127.0.0.1:0",
        2,
        ("$KUBECONFIG", "--no-kube"),
    ),
    "gather-into-missing-directory": Case(
        "gather --fake cpu-2s --output-file {tmp}/missing/dir/x.tar.gz",
        2,
        ("--output-file {tmp}/missing/dir/x.tar.gz: {tmp}/missing/dir: no such directory",),
    ),
    "score-nothing-fits-says-why": Case(
        "score --request {tmp}/request.yaml --fake cpu-2s",
        1,
        ("no placement fits the request: it asks for 16 GPUs", "0 (cpu-2s)"),
    ),
    # Issue #23: files and flags named, once
    "gathered-truncated": Case(
        "discover --gathered {tmp}/truncated.tar.gz",
        2,
        ("--gathered {tmp}/truncated.tar.gz: truncated",),
    ),
    "serve-gathered-truncated": Case(
        "serve --gathered {tmp}/truncated.tar.gz --http-addr 127.0.0.1:0",
        2,
        ("--gathered {tmp}/truncated.tar.gz: truncated",),
    ),
    "gathered-directory": Case(
        "discover --gathered {tmp}", 2, ("--gathered {tmp}: is a directory",)
    ),
    "gathered-not-an-archive": Case(
        "graph --gathered {tmp}/mapping.json",
        2,
        ("--gathered {tmp}/mapping.json: not a tar archive",),
    ),
    "nccl-topo-output-file-directory": Case(
        "nccl-topo --fake cpu-2s --output-file {tmp}",
        2,
        ("--output-file {tmp}: is a directory",),
    ),
    "capture-output-file-directory": Case(
        "machines capture --fake cpu-2s --output-file {tmp}",
        2,
        ("--output-file {tmp}: is a directory",),
    ),
    "gather-output-file-directory": Case(
        "gather --fake cpu-2s --output-file {tmp}", 2, ("--output-file {tmp}: is a directory",)
    ),
    "score-emit-claim-directory": Case(
        "score --request {tmp}/two.yaml --fake dgx-h100 --emit-claim {tmp}",
        2,
        ("--emit-claim {tmp}: is a directory",),
    ),
    "score-emit-claim-missing-directory": Case(
        "score --request {tmp}/two.yaml --fake dgx-h100 --emit-claim {tmp}/no/dir/x.yaml",
        2,
        ("--emit-claim {tmp}/no/dir/x.yaml: {tmp}/no/dir: no such directory",),
    ),
    "claim-invalid-name": Case(
        "claim --gpus 4 --name 'Bad Name'",
        2,
        ("--name 'Bad Name' is not a valid Kubernetes object name",),
    ),
    "score-fake-invalid-node-name": Case(
        "score --request {tmp}/two.yaml --fake dgx-h100:BAD_NAME",
        2,
        ("--fake dgx-h100:BAD_NAME: NODE 'BAD_NAME' is not a valid Kubernetes node name",),
    ),
    "score-invalid-claim-name": Case(
        "score --request {tmp}/two.yaml --fake dgx-h100 --claim-name Bad_Name",
        2,
        ("--claim-name 'Bad_Name' is not a valid Kubernetes ResourceClaimTemplate name",),
    ),
    "score-request-not-utf8": Case(
        "score --request {tmp}/latin1.yaml --fake cpu-2s",
        2,
        ("{tmp}/latin1.yaml: not JSON/YAML: not UTF-8 text",),
    ),
    "score-graph-not-utf8": Case(
        "score --request {tmp}/two.yaml --graph {tmp}/latin1.yaml",
        2,
        ("{tmp}/latin1.yaml: not JSON/YAML: not UTF-8 text",),
    ),
    "doctor-slices-not-utf8": Case(
        "doctor --fake cpu-2s --slices {tmp}/latin1.yaml",
        2,
        ("cannot read slices from {tmp}/latin1.yaml: not UTF-8 text",),
    ),
    "doctor-slices-directory": Case(
        "doctor --fake cpu-2s --slices {tmp}",
        2,
        ("cannot read slices from {tmp}: Is a directory",),
    ),
    "inventory-not-utf8": Case(
        "discover --inventory {tmp}/latin1.yaml",
        2,
        ("--inventory {tmp}/latin1.yaml: not UTF-8 text",),
    ),
    "claim-min-gpu-memory-not-a-quantity": Case(
        "claim --gpus 2 --min-gpu-memory lots",
        2,
        ("--min-gpu-memory 'lots': not a quantity",),
    ),
    "score-devices-empty": Case(
        "score --request {tmp}/two.yaml --fake dgx-h100 --devices ''",
        2,
        ("--devices '': no device named",),
    ),
    "nccl-topo-devices-empty": Case(
        "nccl-topo --fake dgx-h100 --devices ''", 2, ("--devices '': no device named",)
    ),
    "discover-probes-empty": Case(
        "discover --fake cpu-2s --probes ''", 2, ("--probes '': no probe named",)
    ),
    "run-invalid-driver": Case(
        "run --fake cpu-2s --node-name n1 --kubeconfig {tmp}/kubeconfig.yaml --driver bad_driver "
        "{host_dirs}",
        2,
        ("--driver 'bad_driver'",),
    ),
    "run-invalid-driver-env": Case(
        "DRIVER_NAME=bad_driver run --fake cpu-2s --node-name n1 --kubeconfig "
        "{tmp}/kubeconfig.yaml {host_dirs}",
        2,
        ("$DRIVER_NAME 'bad_driver'",),
    ),
}


@pytest.fixture(scope="module")
def busy_addr() -> Iterator[str]:
    """An address something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def cli_env(tmp: Path) -> dict[str, str]:
    """No cluster, no kubeconfig, no host root from the caller's environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KUBE") and k not in ("NODE_NAME", "HOST_ROOT", "HTTP_ADDR")
    }
    env["HOME"] = str(tmp)  # no ~/.kube/config
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def toposlice(args: list[str], tmp: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the CLI; leading ``VAR=value`` words of ``args`` go into its environment."""
    env = cli_env(tmp)
    while args and "=" in args[0] and args[0].split("=")[0].isupper():
        var, _, value = args[0].partition("=")
        env[var] = value
        args = args[1:]
    return subprocess.run(
        [sys.executable, "-m", "toposlice", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp,
        env=env,
    )


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_leaves_nothing(
    name: str, tmp_path: Path, busy_addr: str
) -> None:
    case = CASES[name]
    for file, text in FILES.items():
        if isinstance(text, bytes):
            (tmp_path / file).write_bytes(text)
        else:
            (tmp_path / file).write_text(text)
    if "node-b.yaml" in case.args:
        out = toposlice(["slices", "--fake", "cpu-2s", "--node-name", "node-b"], tmp_path)
        (tmp_path / "node-b.yaml").write_text(out.stdout)
    host = tempfile.mkdtemp(prefix="ts-")
    values = {"tmp": str(tmp_path), "busy": busy_addr, "host": host}
    values["host_dirs"] = HOST_DIRS.format(**values)
    before = sorted(p.name for p in tmp_path.iterdir())
    try:
        r = toposlice(shlex.split(case.args.format(**values)), tmp_path)
        assert os.listdir(host) == [], "the driver created host directories"
    finally:
        shutil.rmtree(host)
    lines = r.stderr.splitlines()
    assert r.returncode == case.rc, r.stderr
    assert "Traceback" not in r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("toposlice: "), lines[0]
    for needle in case.needles:
        assert needle.format(**values) in lines[0], lines[0]
    # Nothing created: no host directories, no output, no parent directories.
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_quiet_flag_after_the_command(tmp_path: Path) -> None:
    before = toposlice(["-q", "discover", "--fake", "cpu-2s", "-o", "json"], tmp_path)
    after = toposlice(["discover", "--fake", "cpu-2s", "-o", "json", "-q"], tmp_path)
    assert before.returncode == after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout)


def test_table_names_the_source_in_words(tmp_path: Path) -> None:
    from toposlice.output import source_text

    assert source_text({"fake": "dgx-h100"}) == "fake machine dgx-h100"
    assert source_text({"sysfs_root": "/host"}) == "sysfs under /host"
    assert source_text({}) == "-"
    r = toposlice(["discover", "--fake", "cpu-2s"], tmp_path)
    assert r.stdout.splitlines()[0] == "host: cpu-2s   source: fake machine cpu-2s"


def test_score_table_leaves_out_nic_locality_without_nics(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text("gpus: 2\n")
    (tmp_path / "nics.yaml").write_text("gpus: 2\nnicsPerGpu: 1\n")
    plain = toposlice(["score", "--request", "two.yaml", "--fake", "dgx-h100"], tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "bandwidth=" in plain.stdout and "nic_locality" not in plain.stdout
    with_nics = toposlice(["score", "--request", "nics.yaml", "--fake", "dgx-h100"], tmp_path)
    assert with_nics.returncode == 0, with_nics.stderr
    assert "nic_locality=" in with_nics.stdout
