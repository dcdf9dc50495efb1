"""The page at ``/``: drawn in headless Chromium (DevTools protocol), plus the markup checks
that need no browser."""

from __future__ import annotations

import base64
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from driver.exporter.http_server import HttpServer
from driver.interfaces import DeviceHealth
from tests.exporter_view import View, request, snapshot_of

GPU0 = "gpu-0000-1b-00-0"
NIC0 = "nic-0000-18-00-0"


@pytest.fixture
def server() -> Iterator[HttpServer]:
    snap = snapshot_of("dgx-h100")
    view = View(
        snap,
        alloc={GPU0: "3f1c2a7e-0000-4000-8000-000000000001"},
        healths=[DeviceHealth(snap.pool, NIC0, "Unhealthy", "carrier down", fatal=False)],
    )
    with HttpServer("127.0.0.1:0", view) as srv:
        yield srv


def test_page_markup(server: HttpServer) -> None:
    resp = request(server.url, "/")
    assert resp.status == 200 and resp.headers["content-type"].startswith("text/html")
    html = resp.body.decode()
    assert html.count('data-kind="gpu"') == 8
    assert html.count('data-kind="nic"') == 12
    assert html.count('data-kind="nvswitch"') == 4
    assert html.count('data-kind="numa"') == 2 and html.count('data-kind="socket"') == 2
    cell = re.search(r"data-row='GPU0' data-col='NIC0'>([A-Z0-9]+)<", html)
    assert cell is not None and cell.group(1) == "PXB"
    assert html.count('data-allocated="true"') == 1
    assert html.count('data-tainted="true"') == 1
    assert "<script" not in html  # nothing to execute, nothing fetched


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A minimal DevTools-protocol client over one page target."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                result: dict[str, Any] = msg.get("result", {})
                return result

    def js(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate to ``url`` and wait until the document has loaded."""
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while self.js("document.readyState") != "complete" and time.monotonic() < deadline:
            time.sleep(0.1)


@contextmanager
def headless_chromium() -> Iterator[tuple[DevTools, Path]]:
    """Chromium (and its DevTools client, and its folder) with its profile and temporary
    files (the ``org.chromium.Chromium.*`` singleton folder, shared-memory files under
    ``--disable-dev-shm-usage``) in a folder of its own, removed afterwards: nothing is
    left in the system's temporary folder. The folder's path is short: the singleton
    socket's path must fit a Unix socket address (108 bytes)."""
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not installed (Debian package `chromium`; CI installs it)")
    folder = Path(tempfile.mkdtemp(prefix="toposlice-chromium-"))
    tmp = folder / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            f"--user-data-dir={folder / 'profile'}",
            "--window-size=1400,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        port = None
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"chromium exited with {proc.returncode}")
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = int(m.group(1))
        assert port is not None, "chromium did not open its DevTools port"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        tools = DevTools(pages[0]["webSocketDebuggerUrl"])
        yield tools, folder
        tools.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def browser() -> Iterator[DevTools]:
    with headless_chromium() as (tools, _):
        yield tools


def _chromium_leftovers() -> set[str]:
    tmp = tempfile.gettempdir()
    return {
        p
        for pattern in ("org.chromium.*", ".org.chromium.*")
        for p in glob.glob(f"{tmp}/{pattern}")
    }


def test_chromium_leaves_nothing_in_the_temporary_folder() -> None:
    before = _chromium_leftovers()
    with headless_chromium() as (tools, folder):
        assert tools.js("1 + 1") == 2
        assert any(folder.glob("tmp/*")), "chromium's temporary files went to its own folder"
    assert not folder.exists()
    assert _chromium_leftovers() - before == set()


def test_page_in_headless_chromium(server: HttpServer, browser: DevTools, tmp_path: Path) -> None:
    browser.open(server.url + "/")
    count = "document.querySelectorAll('svg#topology [data-kind=\"{}\"]').length"
    assert browser.js(count.format("gpu")) == 8
    assert browser.js(count.format("nic")) == 12
    assert browser.js(count.format("nvswitch")) == 4
    assert browser.js(count.format("nvlink-link")) == 32
    cell = 'document.querySelector(\'#relations td[data-row="GPU0"][data-col="NIC0"]\')'
    assert browser.js(f"{cell}.textContent") == "PXB"
    # Drawn, not just present: every device box has a size and lies inside the diagram.
    boxes = browser.js(
        'Array.from(document.querySelectorAll(\'svg#topology [data-kind="gpu"],'
        ' svg#topology [data-kind="nic"]\')).map(g => {const r = g.getBoundingClientRect();'
        " return [r.width, r.height, r.left, r.top]})"
    )
    svg = browser.js(
        "(() => {const r = document.querySelector('svg#topology').getBoundingClientRect();"
        " return [r.left, r.top, r.right, r.bottom]})()"
    )
    assert len(boxes) == 20
    for w, h, left, top in boxes:
        assert w > 20 and h > 10
        assert svg[0] <= left <= svg[2] and svg[1] <= top <= svg[3]
    allocated = browser.js(
        "Array.from(document.querySelectorAll('[data-allocated=\"true\"]'))"
        ".map(g => g.dataset.label)"
    )
    tainted = browser.js(
        "Array.from(document.querySelectorAll('[data-tainted=\"true\"]')).map(g => g.dataset.label)"
    )
    assert allocated == ["GPU0"] and tainted == ["NIC0"]
    shot = browser.call("Page.captureScreenshot", format="png")
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG")
    (tmp_path / "page.png").write_bytes(png)
