"""The three daemons (``run``, ``serve``, ``scorer serve``) as processes: one log line
format for all of them, and ``--log-format json`` giving one JSON object per line; the
``run`` daemon names the attribute an API limit kept out of the slice (on a dgx-h100 with
more PCIe roots on a NUMA node than ``pcieRoots``…``pcieRoots4`` hold: the built-in machines
lose nothing)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inventories import many_roots_machine
from tests.kubeapi import KubeAPIServer
from tests.kubelet import run_argv

REPO = Path(__file__).resolve().parent.parent
NODE = "n1"
#: driver/plumbing/logs.py TEXT_FORMAT, as it prints.
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S"
)


class Daemon:
    """A daemon process whose standard error is collected line by line."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.lines}"
            assert time.monotonic() < deadline, f"no {text!r} in {self.lines}"
            time.sleep(0.05)

    def stop(self) -> list[str]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        return [line for line in self.lines if line.strip()]


@pytest.fixture(scope="module")
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        server.add_node(NODE)
        yield server


def _toposlice(*args: str) -> list[str]:
    return [sys.executable, "-m", "toposlice", *args]


def _run_daemon(api: KubeAPIServer, base: Path, *extra: str) -> list[str]:
    d = Daemon(
        run_argv(
            base,
            api.write_kubeconfig(base / "kubeconfig"),
            NODE,
            "--startup-timeout",
            "0",
            *extra,
            machine=str(many_roots_machine(base)),
        )
    )
    try:
        d.wait_for("attribute not published in full")
        deadline = time.monotonic() + 30
        while not api.slices("toposlice.dev", NODE):
            assert time.monotonic() < deadline, d.lines
            time.sleep(0.1)
    except BaseException:
        d.stop()
        raise
    return d.stop()


def _serve(*extra: str) -> list[str]:
    d = Daemon(
        _toposlice(
            "serve", "--fake", "cpu-2s", "--http-addr", "127.0.0.1:0", "--discover-in-process",
            *extra,
        )
    )  # fmt: skip
    d.wait_for("serving on")
    return d.stop()


def _scorer(*extra: str) -> list[str]:
    d = Daemon(
        _toposlice(
            "scorer", "serve", "--no-kube", "--fake", "dgx-h100", "--http-addr", "127.0.0.1:0",
            *extra,
        )
    )  # fmt: skip
    d.wait_for("serving on")
    return d.stop()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_daemon_logs_in_one_format(api: KubeAPIServer, fmt: str) -> None:
    with tempfile.TemporaryDirectory(prefix="ts-logs-") as d:
        logs = {
            "run": _run_daemon(api, Path(d), "--log-format", fmt),
            "serve": _serve("--log-format", fmt),
            "scorer serve": _scorer("--log-format", fmt),
        }
    for daemon, lines in logs.items():
        assert lines, daemon
        for line in lines:
            if fmt == "text":
                assert TEXT_LINE.match(line), (daemon, line)
            else:
                record = json.loads(line)
                assert set(record) >= {"ts", "level", "logger", "msg"}, (daemon, line)
        assert any("serving on" in line for line in lines) or daemon == "run", (daemon, lines)
    warned = [line for line in logs["run"] if "not published in full" in line]
    assert len(warned) == 1 and "cpu-numa0: pcieRoots" in warned[0], logs["run"]
    if fmt == "json":
        assert json.loads(warned[0])["level"] == "warning"


def test_a_bad_log_format_from_the_environment_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        _toposlice("scorer", "serve", "--no-kube", "--http-addr", "127.0.0.1:0"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOG_FORMAT": "xml"},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "toposlice: error: --log-format/$LOG_FORMAT 'xml': use text or json"
    ]
