"""What the driver says when the API server does not answer, and what it leaves out."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from driver.plumbing.kube import build_api_client, failure, get_node, no_answer_reason
from driver.plumbing.logs import setup_logging


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: connecting is refused


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return str(path)


def test_refused_connection_is_named_in_the_sockets_words(tmp_path: Path) -> None:
    server = f"https://127.0.0.1:{_closed_port()}"
    client = build_api_client(_kubeconfig(tmp_path, server))
    with pytest.raises(Exception) as info:
        get_node(client, "n1")
    # urllib3's MaxRetryError text (pool, URL, retry count, repr of the cause) is gone
    assert str(info.value) == f"API server {server} unreachable: Connection refused"
    f = failure(info.value.__cause__ or info.value)
    assert (f.status, f.transient, f.message) == (None, True, "Connection refused")


def test_reason_follows_the_chain_and_stops_on_a_cycle() -> None:
    inner = ConnectionResetError(104, "Connection reset by peer")
    outer = RuntimeError("wrapped")
    outer.__cause__ = inner
    assert no_answer_reason(outer) == "Connection reset by peer"
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a  # a cycle must not hang
    assert no_answer_reason(a) in ("ValueError: a", "ValueError: b")
    assert no_answer_reason(TimeoutError()) == "TimeoutError: "


def test_urllib3_retry_warnings_are_dropped_and_others_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("text", "info")
        pool = logging.getLogger("urllib3.connectionpool")
        pool.warning("Retrying (%r) after connection broken by '%r': %s", "Retry", "E", "/x")
        pool.warning("Connection pool is full, discarding connection: %s", "h")
        logging.getLogger("toposlice.daemon").warning("API server x unreachable")
        err = capsys.readouterr().err
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert "Retrying" not in err
    assert "Connection pool is full" in err and "API server x unreachable" in err
