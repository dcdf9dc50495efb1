"""``toposlice serve`` stops within seconds of SIGTERM / SIGINT whatever it is doing (issue
#34: on a loaded 2-core machine it once did not exit within 15 s of SIGTERM). Its signal
handler set an Event -- a lock taken in a signal handler, which hangs for good when the signal
lands while the main thread holds that lock -- and a stop then waited for a discovery to end
(one stuck in a read never does) and joined the observer through an API call in flight.
``toposlice/shutdown.py`` takes no lock in the handler and ends what still runs after
``shutdown.GRACE`` seconds."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.exporter_view import request, serving_url, wait_for

REPO = Path(__file__).resolve().parent.parent
#: toposlice.shutdown.GRACE (test_the_grace_is_what_the_process_tests_assume holds it).
GRACE = 5.0
#: A stop may take GRACE seconds, plus an interpreter's exit on a loaded machine; the test
#: that failed gave 15.
BOUND = GRACE + 4.0


def _serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "toposlice", "-q", "serve", "--http-addr", "127.0.0.1:0", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str], sig: int, bound: float) -> tuple[int, float, str]:
    """Send SIG, wait up to BOUND: (exit status, seconds it took, rest of stderr). A process
    still there is killed (with its helper) and fails the test."""
    helpers = psutil.Process(proc.pid).children(recursive=True)
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        rc = proc.wait(bound)
    except subprocess.TimeoutExpired:
        for p in [psutil.Process(proc.pid), *helpers]:
            p.kill()
        proc.wait(10)
        pytest.fail(f"serve still running {bound:.0f} s after signal {sig}")
    took = time.monotonic() - t0
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, alive = psutil.wait_procs(helpers, timeout=5)
    assert not alive, f"discovery helper left running: {alive}"
    return rc, took, err


@pytest.fixture
def hung_root(tmp_path: Path) -> Path:
    """cpu-2s's generated tree whose /proc/cpuinfo is a FIFO nobody writes: discovery's
    read of it never returns (as a read of a wedged device's sysfs file, or an NVML call,
    may not)."""
    root = tmp_path / "root"
    done = subprocess.run(
        [sys.executable, "-m", "toposlice", "machines", "tree", "--to", str(root), "cpu-2s"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    cpuinfo = root / "proc" / "cpuinfo"
    cpuinfo.unlink()
    os.mkfifo(cpuinfo)
    return root


@pytest.mark.parametrize(
    ("mode", "sig", "status"),
    [
        pytest.param("helper", signal.SIGTERM, 0, id="helper-sigterm"),
        pytest.param("in-process", signal.SIGTERM, 0, id="in-process-sigterm"),
        pytest.param("in-process", signal.SIGINT, 130, id="in-process-sigint"),
    ],
)
def test_a_signal_during_a_discovery_that_never_ends_stops_serve_within_seconds(
    hung_root: Path, mode: str, sig: int, status: int
) -> None:
    extra = ["--discover-in-process"] if mode == "in-process" else []
    proc = _serve("--root", str(hung_root), "--node-name", "n1", *extra)
    serving_url(proc, time.monotonic() + 60)
    time.sleep(1.0)  # the first discovery is now stuck in its read
    rc, took, err = _stop(proc, sig, BOUND)
    assert rc == status, err
    if mode == "helper":
        # The main thread waits for the helper's answer and the stop at once: no grace.
        assert took < BOUND - GRACE, (took, err)
    else:
        assert "still running 5 s after the signal: exiting now" in err, err


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts connections and never answers (an API server that hangs)."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(lst.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield lst.getsockname()[1]
    finally:
        lst.close()
        for c in held:
            c.close()


def hung_kubeconfig(tmp_path: Path, port: int) -> Path:
    """A kubeconfig whose API server is the black hole on ``port``."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
            users: [{{name: u, user: {{token: t}}}}]
            contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
            current-context: x
            """
        )
    )
    return path


def test_sigterm_while_the_api_server_hangs_stops_serve_at_once(
    black_hole: int, tmp_path: Path
) -> None:
    kubeconfig = hung_kubeconfig(tmp_path, black_hole)
    registry = tmp_path / "registry"
    registry.mkdir()
    proc = _serve(
        "--fake", "cpu-2s", "--observe", "--kubeconfig", str(kubeconfig),
        "--plugins-registry", str(registry), "--observe-interval", "0.5",
    )  # fmt: skip
    url = serving_url(proc, time.monotonic() + 60)

    def ready() -> bool:
        try:
            return request(url, "/readyz", timeout=2).status == 200
        except OSError:
            return False

    assert wait_for(ready, 60)
    time.sleep(1.0)  # the observer is in its list call, which waits 10 s for an answer
    rc, took, err = _stop(proc, signal.SIGTERM, BOUND)
    assert rc == 0, err
    # It used to join the observer for 5 s; now nothing waits for the call in flight.
    assert took < GRACE - 1.0 and "exiting now" not in err, (took, err)


def test_the_grace_is_what_the_process_tests_assume() -> None:
    from toposlice import shutdown

    assert shutdown.GRACE == GRACE


def test_the_handler_takes_no_lock_the_main_thread_may_hold() -> None:
    """The signal lands while the main thread holds the stop event's lock (as on its way
    into or out of ``event.wait()``): an ``Event.set()`` in the handler would wait for that
    lock forever. In a child: a hang fails by timeout, not by hanging the test run."""
    code = textwrap.dedent(
        """
        import signal
        from toposlice.shutdown import StopSignals

        stop = StopSignals(grace=60).install()
        with stop.event._cond:  # what Event.wait() holds around its waiting
            signal.raise_signal(signal.SIGTERM)  # runs the Python handler here and now
        assert stop.event.wait(10), "the watcher did not set the event"
        assert stop.received == [signal.SIGTERM] and stop.status() == 0
        stop.uninstall()
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_what_runs_past_the_grace_is_not_waited_for() -> None:
    from toposlice.shutdown import StopSignals

    exits: list[int] = []
    ended = threading.Event()

    def fake_exit(status: int) -> None:
        exits.append(status)
        ended.set()

    stop = StopSignals(grace=0.3, exit_fn=fake_exit).install()
    try:
        t0 = time.monotonic()
        signal.raise_signal(signal.SIGINT)
        assert stop.event.wait(5)
        assert ended.wait(5) and exits == [130]
        assert 0.25 <= time.monotonic() - t0 < 3
    finally:
        stop.uninstall()
    # A second signal does not wait for the grace at all.
    exits.clear()
    ended.clear()
    stop = StopSignals(grace=60, exit_fn=fake_exit).install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert stop.event.wait(5)
        signal.raise_signal(signal.SIGTERM)
        assert ended.wait(5) and exits == [0]
    finally:
        stop.uninstall()


def test_on_stop_runs_once_outside_the_handler_before_the_event() -> None:
    """``run`` asks its daemon to stop from here: on the watcher's thread (the daemon's
    request_stop takes a lock), once, before waiters wake."""
    from toposlice.shutdown import StopSignals

    seen: list[tuple[str, bool]] = []
    stop: StopSignals

    def on_stop() -> None:
        seen.append((threading.current_thread().name, stop.event.is_set()))

    stop = StopSignals(grace=60, exit_fn=lambda _s: None, on_stop=on_stop).install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert stop.event.wait(5)
        assert seen == [("toposlice-stop", False)]
    finally:
        stop.uninstall()


def test_sigterm_stops_run_waiting_for_a_hung_api_server(black_hole: int, tmp_path: Path) -> None:
    """``toposlice run`` at start, its API server accepting and never answering: SIGTERM
    ends it with 0 within its stop grace, under a pod's 30 s before SIGKILL. (It used to
    wait for the Node read in flight, up to its 30 s read timeout, after the signal.)"""
    from toposlice.cmd_run import STOP_GRACE_S

    kubeconfig = hung_kubeconfig(tmp_path, black_hole)
    base = Path(tempfile.mkdtemp(prefix="ts-stop-"))  # short: unix socket paths
    try:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "toposlice", "run", "--fake", "cpu-2s",
                "--node-name", "n1", "--kubeconfig", str(kubeconfig),
                "--kubelet-registrar-directory-path", str(base / "reg"),
                "--kubelet-plugins-directory-path", str(base / "plug"),
                "--cdi-root", str(base / "cdi"), "--state-dir", str(base / "state"),
                "--startup-timeout", "120",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        time.sleep(4.0)  # started, its first call to the API server hanging
        assert proc.poll() is None
        rc, took, err = _stop(proc, signal.SIGTERM, STOP_GRACE_S + 4.0)
        assert rc == 0, (took, err)
    finally:
        shutil.rmtree(base, ignore_errors=True)
