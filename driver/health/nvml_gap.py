"""NVIDIA GPUs without NVML, said loudly.

With the chart's defaults the plugin's container has neither ``/dev/nvidia*`` nor the
driver's ``libnvidia-ml.so.1``: NVML is reachable only with ``runtimeClassName: nvidia``
(the NVIDIA container toolkit injects both) or ``privileged: true`` plus the driver's
library. Without it discovery still finds the GPUs in sysfs and publishes them, but
without UUIDs, NVLink and fabric (clique) attributes, and claims written against those
attributes stop matching. That gap must not be silent on a real GPU node, so when the
``nvidia`` probe ran, ended ``unavailable`` or ``error``, and sysfs shows NVIDIA GPUs:

- ``/readyz`` still answers 200 (the driver works) with ``ok, degraded: <reason>``;
- a Warning Event ``NVMLUnavailable`` on the Node (``kubectl describe node``), once per
  distinct reason;
- the gauge ``toposlice_nvml_missing_gpus`` (0 when NVML answers or there is no NVIDIA
  GPU) and a warning in the log.

A probe left out on purpose (``--probes`` without ``nvidia``) is no gap.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from discovery.model import Inventory
from driver.plumbing.kube import request_json

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger("driver.nvml_gap")

REASON = "NVMLUnavailable"
PROBE = "nvidia"
#: Node events live in the default namespace (the kubelet's go there too).
EVENT_NAMESPACE = "default"
REMEDY = (
    "give the plugin NVML: runtimeClassName: nvidia (NVIDIA container toolkit) "
    "or privileged: true with the driver's libraries"
)


def missing_gpus(inv: Inventory) -> int:
    """NVIDIA GPUs published without NVML: 0 unless the nvidia probe ran and failed."""
    probe = next((p for p in inv.probes if p.name == PROBE), None)
    if probe is None or probe.state == "ok":
        return 0
    return sum(1 for g in inv.gpus if g.vendor == "nvidia")


def nvml_gap(inv: Inventory) -> str:
    """One line saying what is missing and what to do; empty when nothing is."""
    n = missing_gpus(inv)
    if not n:
        return ""
    probe = next(p for p in inv.probes if p.name == PROBE)
    why = f"{probe.state}: {probe.detail}" if probe.detail else probe.state
    return (
        f"NVML unavailable ({why}): {n} NVIDIA GPU(s) published from sysfs only, without "
        f"UUIDs, NVLink and fabric attributes; {REMEDY}"
    )


def node_event(
    node: dict[str, Any],
    message: str,
    component: str,
    reason: str = REASON,
    kind: str = "Warning",
) -> dict[str, Any]:
    """A core/v1 Event about ``node`` (as the kubelet writes its own): ``kind`` Warning, or
    Normal for news that asks nothing of anyone."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # Named after what it says: a restarted plugin finds its Event and does not
            # say the same thing again (once per node, not once per start).
            "name": f"{name}.{_digest(reason, message)}",
            "namespace": EVENT_NAMESPACE,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": str(meta.get("uid", "")),
        },
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": component, "host": name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": name,
    }


def _digest(reason: str, message: str) -> str:
    return hashlib.sha256(f"{reason}\n{message}".encode()).hexdigest()[:16]


def post_node_event(
    client: ApiClient,
    node: dict[str, Any],
    message: str,
    component: str,
    reason: str = REASON,
    kind: str = "Warning",
) -> bool:
    """Write the Event unless it is there already; False (logged) when the API server
    refused or is unreachable."""
    from kubernetes.client.exceptions import ApiException

    body = node_event(node, message, component, reason, kind)
    namespace = EVENT_NAMESPACE
    try:
        try:
            request_json(
                client,
                "GET",
                f"/api/v1/namespaces/{namespace}/events/{body['metadata']['name']}",
            )
            return True
        except ApiException as exc:
            if exc.status != 404:
                raise
        request_json(client, "POST", f"/api/v1/namespaces/{namespace}/events", body)
    except Exception as exc:  # an Event is best effort: the log and the metric remain
        log.warning("could not write the %s Event: %s", reason, exc)
        return False
    return True
