"""The pods bound to this node, watched, for the NodeResourceTopology's pods fingerprint.

The fingerprint (normalize/pod_fingerprint.py) tells the NodeResourceTopology plugin's
cached mode which pods the object accounts for. It is computed from a watch of this node's
pods on the API server (one LIST, then a WATCH with the field selector
``spec.nodeName=<node>``, the same request the kubelet makes), not from the kubelet's
pod-resources socket, which NFD's topology updater reads:

- the plugin checks the fingerprint against the pods its own informer got from the API
  server, so signing the same source agrees by construction, with no window where the
  kubelet admitted a pod the API server does not show as Running yet;
- it needs no hostPath mount of the kubelet's pod-resources socket and works on nodes
  whose kubelet is not reachable from the driver (and in the fake-hardware tiers);
- the cost is one watch per node, narrowed to the node's pods, and the permission to list
  and watch pods (granted by the chart only with ``integrations.nrt.podsFingerprint``).

``on_change(fingerprint)`` runs on the informer's thread when the fingerprint changes
after the first sync; events that leave it as it was (a label edited, a pod still
Pending) call nothing, so a steady node sends no write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from driver.plumbing.informer import Informer
from driver.plumbing.kube import collection_lister, server_url
from normalize.pod_fingerprint import counted, sign

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

PODS = "/api/v1/pods"

Pod = tuple[str, str, bool]
"""(namespace, name, counted in the fingerprint)."""


class NodePods:
    """The fingerprint of the pods bound to ``node_name``, kept current by a watch."""

    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        on_change: Callable[[str], None] | None = None,
        **informer_args: Any,
    ) -> None:
        self.node_name = node_name
        self.on_change = on_change
        self._lock = threading.Lock()
        self._last: str | None = None
        self._stopped = threading.Event()
        self.informer: Informer[Pod] = Informer(
            "pods",
            collection_lister(client, PODS),
            self._pod,
            on_event=self._event,
            selectors={"field_selector": f"spec.nodeName={node_name}"},
            server=server_url(client),
            **informer_args,
        )

    def _pod(self, obj: dict[str, Any]) -> Pod:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        return (namespace, name, counted(obj, self.node_name))

    def start(self) -> NodePods:
        self.informer.start()
        threading.Thread(target=self._after_first_list, name="pods-synced", daemon=True).start()
        return self

    def _after_first_list(self) -> None:
        """Tell of the first fingerprint once the first LIST is in, however long it took."""
        while not self.informer.wait_synced(1.0):
            if self._stopped.is_set():
                return
        self._notify()

    def stop(self) -> None:
        self._stopped.set()
        self.informer.stop()

    def wait_synced(self, timeout: float) -> bool:
        return self.informer.wait_synced(timeout)

    def fingerprint(self) -> str | None:
        """The fingerprint of the node's counted pods; None before the first LIST."""
        if not self.informer.synced.is_set():
            return None
        pods = [(ns, name) for ns, name, yes in list(self.informer.store.values()) if yes]
        return sign(pods)

    def _event(self, typ: str, key: str, old: Pod | None, new: Pod | None) -> None:
        if not self.informer.synced.is_set():
            return  # the first LIST's ADDED events: read once by the caller after the sync
        if (old is not None and old[2]) == (new is not None and new[2]):
            return  # counted before and after (or neither): the fingerprint is the same
        self._notify()

    def _notify(self) -> None:
        value = self.fingerprint()
        with self._lock:
            if value == self._last:
                return
            self._last = value
        if value is not None and self.on_change is not None:
            self.on_change(value)
