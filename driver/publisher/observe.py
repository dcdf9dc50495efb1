"""Reading other DRA drivers' ResourceSlices of this node, and which drivers the kubelet knows.

Observe mode (``toposlice serve --observe``) and ``toposlice doctor`` publish nothing; they
read what the other drivers published (from the API server, or from slice files saved with
``kubectl get resourceslices -o yaml``) and which drivers are registered with the kubelet
here (the plugin-registration directory), and hand both to
:func:`normalize.crossdriver.normalization_report`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from normalize.crossdriver import NormalizationReport, normalization_report, registered_driver
from normalize.snapshot import Snapshot

log = logging.getLogger("driver.observe")

PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"


def load_slice_files(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """ResourceSlices from YAML/JSON files in every form kubectl reads or writes: one
    object, a ``kind: List``, a YAML stream, a JSON array. A file that cannot be read,
    decoded or parsed raises ``ValueError`` naming it, in one line."""
    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                docs = list(yaml.safe_load_all(fh))
        except OSError as exc:
            raise ValueError(f"cannot read slices from {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"cannot read slices from {path}: not UTF-8 text (byte {exc.start})"
            ) from exc
        except yaml.YAMLError as exc:
            from driver.plumbing.checks import yaml_error_line

            raise ValueError(f"cannot read slices from {path}: {yaml_error_line(exc)}") from exc
        for doc in docs:
            out.extend(_slices_of(doc))
    return out


def _slices_of(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, list):  # a JSON array (what `toposlice slices -o json` printed once)
        return [d for item in doc for d in _slices_of(item)]
    if not isinstance(doc, dict):
        return []
    if isinstance(doc.get("items"), list):
        return [d for item in doc["items"] for d in _slices_of(item)]
    if doc.get("kind") == "ResourceSlice" or isinstance(doc.get("spec"), dict):
        return [doc]
    return []


def registered_drivers(registry_dir: str | Path = PLUGINS_REGISTRY) -> set[str] | None:
    """DRA drivers with a kubelet registration socket in ``registry_dir``; None when the
    directory does not exist (not on a node: the check is skipped). Hashed socket names
    (``dra-<hash>-reg.sock``) are asked for their name over the Registration service."""
    try:
        names = os.listdir(registry_dir)
    except OSError:
        return None
    drivers: set[str] = set()
    for name in names:
        if not name.endswith("-reg.sock") or name.startswith("."):
            continue
        driver = registered_driver(name)
        if driver is None:
            driver = _ask_plugin_name(os.path.join(str(registry_dir), name))
        if driver:
            drivers.add(driver)
    return drivers


def _ask_plugin_name(path: str, timeout: float = 1.0) -> str | None:
    """``GetInfo`` on a registration socket, as the kubelet does (1 s timeout)."""
    try:
        import grpc

        from driver.plumbing.gen import pluginregistration_pb2 as pb
        from driver.plumbing.gen import pluginregistration_pb2_grpc as pb_grpc

        with grpc.insecure_channel(f"unix://{path}") as channel:
            info = pb_grpc.RegistrationStub(channel).GetInfo(pb.InfoRequest(), timeout=timeout)
        return str(info.name) or None
    except Exception as exc:
        log.debug("GetInfo on %s failed: %s", path, exc)
        return None


class ApiSlices:
    """Lists the node's ResourceSlices (every driver) from the API server."""

    def __init__(self, node: str, kubeconfig: str | None = None, timeout: float = 10.0) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
        cfg.retries = 1
        self.node = node
        self.timeout = timeout
        self._api = client.ResourceV1Api(client.ApiClient(cfg))

    def list(self) -> list[dict[str, Any]]:
        # Raw JSON, not the generated models: unknown (newer) fields survive and the
        # report sees the slices exactly as the drivers wrote them.
        resp = self._api.list_resource_slice(
            field_selector=f"spec.nodeName={self.node}",
            _preload_content=False,
            _request_timeout=self.timeout,
        )
        data = json.loads(resp.data)  # type: ignore[attr-defined]  # raw urllib3 response
        items = data.get("items") or []
        return [i for i in items if isinstance(i, dict)]

    def server_version(self) -> tuple[int, int] | None:
        """The API server's (major, minor), or None when it does not say (the advice on
        list attributes then covers both cases)."""
        import re

        from kubernetes import client

        try:
            info = client.VersionApi(self._api.api_client).get_code(_request_timeout=self.timeout)
        except Exception as exc:
            log.debug("GET /version failed: %s", exc)
            return None
        major = re.match(r"\d+", str(info.major or ""))
        minor = re.match(r"\d+", str(info.minor or ""))
        return (int(major.group()), int(minor.group())) if major and minor else None


class Observer:
    """Re-reads the other drivers' slices every ``interval`` seconds and reports.

    ``on_report`` gets a fresh :class:`NormalizationReport` after each successful read;
    API errors are logged and retried at the next tick (never a crash loop).
    """

    def __init__(
        self,
        source: Callable[[], list[dict[str, Any]]],
        snapshot: Callable[[], Snapshot | None],
        on_report: Callable[[NormalizationReport], None],
        *,
        interval: float = 15.0,
        registry_dir: str | Path | None = PLUGINS_REGISTRY,
        exclude_driver: str | None = None,
    ) -> None:
        self.source = source
        self.snapshot = snapshot
        self.on_report = on_report
        self.interval = interval
        self.registry_dir = registry_dir
        self.exclude_driver = exclude_driver
        self.last_error = ""
        self.reads = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def observe_once(self) -> NormalizationReport | None:
        snap = self.snapshot()
        if snap is None:
            return None
        try:
            slices = self.source()
        except Exception as exc:
            self.last_error = f"listing ResourceSlices failed: {exc}"
            log.warning("%s", self.last_error)
            return None
        if self.exclude_driver:
            slices = [s for s in slices if s.get("spec", {}).get("driver") != self.exclude_driver]
        drivers = registered_drivers(self.registry_dir) if self.registry_dir else None
        report = normalization_report(snap, slices, snap.node_name, drivers)
        self.last_error = ""
        self.reads += 1
        self.on_report(report)
        return report

    def poke(self) -> None:
        """Observe again now (a new snapshot arrived)."""
        self._wake.set()

    def start(self) -> Observer:
        self._thread = threading.Thread(target=self._loop, name="toposlice-observe", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.observe_once()
            except Exception:
                log.exception("observing other drivers failed")
            self._wake.wait(self.interval)
            self._wake.clear()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; wait up to ``timeout`` for a read in flight (the thread is a daemon:
        one still in an API call, up to ApiSlices' 10 s, does not hold the process)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
