"""Ctrl-C at a real terminal: every command ends quietly with status 130, its helper
processes included.

Each command runs in a new session on a pseudo-terminal (``pty.fork``: the pty is its
controlling terminal, its process group the foreground one), and the test types ``^C``
into the terminal, so the line discipline sends SIGINT to the whole foreground process
group, the spawned discovery helper and multiprocessing's resource tracker included, as
a person's Ctrl-C does. "During imports" is found with ``-X importtime``: the command is
interrupted right after the interpreter reported a given module imported, while the
command's own imports still run.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_cli_errors import cli_env

#: Text no interrupted command may print.
NOISE = ("Traceback", "KeyboardInterrupt", "Fatal Python error", "Exception ignored")


class Terminal:
    """A command on a pseudo-terminal: its output so far, and keys to type into it."""

    def __init__(self, args: list[str], tmp: Path, importtime: bool = False) -> None:
        env = cli_env(tmp)
        argv = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "toposlice"]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once (no Python code of the parent's runs)
            os.chdir(tmp)
            # A terminal's foreground job takes Ctrl-C; a suite started in the background
            # of a non-interactive shell inherits SIGINT ignored, and Python then installs
            # no handler for it. Reset it as a login shell would.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [*argv, *args], env)
        self.raw = b""
        self.status: int | None = None

    @property
    def text(self) -> str:
        return self.raw.decode(errors="replace").replace("\r\n", "\n")

    def output(self) -> str:
        """What the command printed: without the interpreter's ``-X importtime`` lines and
        the terminal's echo of the key (``^C``)."""
        lines = self.text.replace("^C", "").splitlines()
        return "\n".join(line for line in lines if not line.startswith("import time:")).strip()

    def read_until(self, done: Callable[[str], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done(self.text):
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                return done(self.text)
        return True

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: every process holding the terminal is gone
            return False
        self.raw += chunk
        return bool(chunk)

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")  # VINTR: the terminal sends SIGINT to the group

    def wait(self, timeout: float = 30) -> int:
        """The exit status, after reading the rest of the output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.2):
                    pass
                os.close(self.fd)
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            self._read(0.1)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        raise AssertionError(f"still running {timeout}s after Ctrl-C:\n{self.text}")

    def session_processes(self) -> list[int]:
        """Processes still in the command's session (its helpers), after a grace period."""
        deadline = time.monotonic() + 10
        while True:
            left = []
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[3]) == self.pid and fields[0] != "Z":  # session id
                    left.append(int(entry))
            if not left or time.monotonic() > deadline:
                for pid in left:  # never leave them behind, even when failing
                    os.kill(pid, signal.SIGKILL)
                return left
            time.sleep(0.1)


def interrupted(t: Terminal) -> None:
    """The command ended with 130, printed no traceback, and left no process."""
    rc = t.wait()
    shown = t.output()
    assert rc == 130, shown
    for noise in NOISE:
        assert noise not in shown, shown
    assert t.session_processes() == [], "helper processes outlived the command"


def imported(module: str) -> Callable[[str], bool]:
    """Output test: the interpreter reported ``module`` imported (``-X importtime``)."""
    pattern = re.compile(rf"^import time:.*\| +{re.escape(module)}\r?$", re.M)
    return lambda text: bool(pattern.search(text))


def test_serve_right_after_serving_on(tmp_path: Path) -> None:
    """Ctrl-C just after "serving on", while the discovery helper's interpreter starts
    (was: ``Fatal Python error: init_import_site``, or SpawnProcess-1's traceback)."""
    t = Terminal(["serve", "--fake", "cpu-2s", "--http-addr", "127.0.0.1:0"], tmp_path)
    assert t.read_until(lambda s: "serving on" in s, 60), t.text
    t.ctrl_c()
    interrupted(t)
    assert t.output().count("\n") == 0, t.output()  # the one "serving on" line


def test_serve_while_discovering(tmp_path: Path) -> None:
    """Ctrl-C while the helper runs a discovery (was: SpawnProcess-1 traceback)."""
    t = Terminal(["serve", "--fake", "dgx-h100", "--http-addr", "127.0.0.1:0"], tmp_path)
    assert t.read_until(lambda s: "serving on" in s, 60), t.text
    time.sleep(0.8)  # the helper is importing or discovering (a dgx-h100 takes ~1 s)
    t.ctrl_c()
    interrupted(t)


@pytest.mark.parametrize(
    ("command", "module"),
    [
        (["serve", "--fake", "cpu-2s", "--http-addr", "127.0.0.1:0"], "toposlice.cli"),
        (["serve", "--fake", "cpu-2s", "--http-addr", "127.0.0.1:0"], "driver.plumbing.checks"),
        (["score", "--request", "req.yaml", "--fake", "dgx-h100"], "scorer.request"),
        (["gather", "--fake", "dgx-h100", "--output-file", "x.tar.gz"], "discovery.gather"),
    ],
    ids=["serve-cli-imported", "serve-config-imported", "score-imports", "gather-imports"],
)
def test_during_imports(command: list[str], module: str, tmp_path: Path) -> None:
    """Ctrl-C while the command still imports (was: a KeyboardInterrupt traceback)."""
    (tmp_path / "req.yaml").write_text("gpus: 4\nnicsPerGpu: 1\n")
    t = Terminal(command, tmp_path, importtime=True)
    assert t.read_until(imported(module), 60), t.text
    t.ctrl_c()
    interrupted(t)
    assert t.output() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["req.yaml"]  # no archive, no temp


def test_long_score(tmp_path: Path) -> None:
    """A search over several machines, interrupted while it ranks."""
    (tmp_path / "req.yaml").write_text("gpus: 4\nnicsPerGpu: 1\n")
    fakes = [a for i in range(6) for a in ("--fake", f"dgx-h100:n{i}")]
    t = Terminal(["score", "--request", "req.yaml", *fakes, "--top", "50"], tmp_path, True)
    assert t.read_until(imported("scorer.search"), 60), t.text
    time.sleep(0.3)
    t.ctrl_c()
    interrupted(t)


def test_scorer_serve(tmp_path: Path) -> None:
    t = Terminal(
        ["scorer", "serve", "--no-kube", "--fake", "cpu-2s", "--http-addr", "127.0.0.1:0"],
        tmp_path,
    )
    assert t.read_until(lambda s: "serving on" in s, 60), t.text
    t.ctrl_c()
    interrupted(t)


def test_run_waiting_for_the_api_server(tmp_path: Path) -> None:
    """``run`` retrying an unreachable API server: Ctrl-C ends it at once with 130 (not
    the start-up timeout's exit 1 and error line)."""
    from tests.test_cli_errors import KUBECONFIG

    (tmp_path / "kc.yaml").write_text(KUBECONFIG)
    host = tmp_path / "h"
    t = Terminal(
        [
            "run",
            "--fake",
            "cpu-2s",
            "--node-name",
            "n1",
            "--kubeconfig",
            "kc.yaml",
            "--startup-timeout",
            "60",
            "--kubelet-registrar-directory-path",
            f"{host}/reg",
            "--kubelet-plugins-directory-path",
            f"{host}/p",
            "--cdi-root",
            f"{host}/cdi",
            "--state-dir",
            f"{host}/state",
        ],
        tmp_path,
        importtime=True,
    )
    assert t.read_until(imported("driver.daemon"), 60), t.text
    time.sleep(1.5)  # started: sockets bound, retrying the API server
    t.ctrl_c()
    interrupted(t)
    assert "error" not in t.output(), t.output()
