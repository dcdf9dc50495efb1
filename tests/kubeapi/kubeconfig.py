"""A kubeconfig file that points the ``kubernetes`` client (or kubectl) at a test server."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def write_kubeconfig(path: str | Path, server_url: str, token: str = "test-token") -> Path:
    """Write a one-context kubeconfig for ``server_url`` (plain HTTP, bearer token)."""
    path = Path(path)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server_url}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        yaml.safe_dump(config, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
