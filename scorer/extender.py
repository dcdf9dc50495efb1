"""kube-scheduler extender: ``filter`` and ``prioritize`` over nodes' topology graphs.

Wire format (k8s.io/kube-scheduler ``extender/v1``): kube-scheduler POSTs ExtenderArgs to
``<urlPrefix>/<filterVerb>`` and ``<urlPrefix>/<prioritizeVerb>``. Those Go types carry no
JSON tags, so the real scheduler sends Go's field names, capitalised:
``{"Pod": Pod, "Nodes": NodeList, "NodeNames": null}`` (``"Nodes": null, "NodeNames": [...]``
when the extender is ``nodeCacheCapable``). Keys are matched as Go's decoder matches them
(exact first, then without regard to case), so lowercase senders work too. The answers use
the same Go field names: ExtenderFilterResult ``{"Nodes", "NodeNames", "FailedNodes",
"FailedAndUnresolvableNodes", "Error"}`` and HostPriorityList ``[{"Host": name, "Score":
0..10}]`` (MaxExtenderPriority = 10). The Pod and NodeList inside are ordinary API objects
(lowercase keys).

The pod's workload comes from its ``toposlice.dev/workload`` annotation (a request document,
as for ``toposlice score``); missing fields — the GPU and NIC counts — are read from the pod's
ResourceClaims (or their templates). An extender ranks whole nodes; the claim the scorer
emits (``toposlice score --emit-claim``) carries the choice down to devices.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import yaml

from normalize.deviceclasses import device_class_name

from .completion import filter_waits
from .estimate import kueue_hint
from .request import PROFILE_ANNOTATION, Occupancy, Request, request_from_dict
from .search import node_placements
from .topology import GraphFetcher, NodeTopology, from_graph

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
MAX_BODY = 16 << 20

#: (kind, namespace, name) -> the object, or None when it does not exist.
ObjectReader = Callable[[str, str, str], dict[str, Any] | None]


@dataclass
class NodeGraphs:
    """Where node graphs come from: fixed graphs by node name, and/or a URL template
    (``{node}``, ``{address}`` = the node's InternalIP) fetched with ETag revalidation."""

    static: dict[str, dict[str, Any]] = field(default_factory=dict)
    url_template: str | None = None
    fetcher: GraphFetcher = field(default_factory=GraphFetcher)
    _views: dict[str, tuple[int, NodeTopology]] = field(default_factory=dict)

    def topology(self, node: dict[str, Any]) -> NodeTopology | None:
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        graph = self.static.get(name)
        if graph is None and self.url_template:
            url = self.url_template.format(node=name, address=_address(node) or name)
            try:
                graph = self.fetcher.get(url)
            except ValueError as exc:
                log.warning("node %s: no topology graph: %s", name, exc)
                return None
        if graph is None:
            return None
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        cached = self._views.get(name)
        if cached is None or cached[0] != id(graph):
            view = from_graph(graph, labels)
            self._views[name] = (id(graph), view)
        else:
            view = cached[1]
            view.labels = labels
        return view

    def known(self) -> list[NodeTopology]:
        """Every node with a graph at hand: the fixed graphs and the nodes seen so far
        (labels as last seen; a fixed graph's node never seen has none)."""
        for name, graph in self.static.items():
            if name not in self._views:
                self._views[name] = (id(graph), from_graph(graph, {}))
        return [view for _, view in self._views.values()]


def _address(node: dict[str, Any]) -> str | None:
    for a in (node.get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            return str(a.get("address"))
    return None


def _claim_counts(spec: dict[str, Any], driver: str) -> tuple[int, int]:
    """(GPUs, NICs) a ResourceClaimSpec asks from this driver's classes."""
    gpu_cls, nic_cls = device_class_name("gpu", driver), device_class_name("nic", driver)
    gpus = nics = 0
    for r in (spec.get("devices") or {}).get("requests") or []:
        body = r.get("exactly") or ((r.get("firstAvailable") or [None])[0]) or {}
        # allocationMode All: as many as match; count it as one (the least it can be).
        all_mode = body.get("allocationMode") == "All"
        count = 1 if all_mode else int(body.get("count", 1))
        if body.get("deviceClassName") == gpu_cls:
            gpus += count
        elif body.get("deviceClassName") == nic_cls:
            nics += count
    return gpus, nics


class Extender:
    def __init__(
        self,
        graphs: NodeGraphs,
        reader: ObjectReader | None = None,
        occupancy: Callable[[], Occupancy] | None = None,
        driver: str = "toposlice.dev",
    ) -> None:
        self.graphs = graphs
        self.reader = reader
        self.occupancy = occupancy or Occupancy
        self.driver = driver

    # -- the pod's workload --------------------------------------------------------------

    def workload(self, pod: dict[str, Any]) -> Request | None:
        """The pod's request, or None when it asks for no GPUs of this driver."""
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        ann = (meta.get("annotations") or {}).get(PROFILE_ANNOTATION)
        profile: dict[str, Any] = {}
        if ann:
            data = yaml.safe_load(ann)
            if not isinstance(data, dict):
                raise ValueError(f"annotation {PROFILE_ANNOTATION}: not a mapping")
            profile = dict(data)
        if "gpus" not in profile or ("nicsPerGpu" not in profile and self.reader):
            gpus, nics = self._from_claims(pod, ns)
            if "gpus" not in profile:
                if gpus == 0:
                    return None
                profile["gpus"] = gpus
            if "nicsPerGpu" not in profile and gpus:
                profile["nicsPerGpu"] = nics // gpus
        return request_from_dict(profile, f"pod {ns}/{meta.get('name')}")

    def _from_claims(self, pod: dict[str, Any], ns: str) -> tuple[int, int]:
        if self.reader is None:
            return 0, 0
        spec = pod.get("spec") or {}
        generated = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        gpus = nics = 0
        for ref in spec.get("resourceClaims") or []:
            obj = None
            claim_name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
            if claim_name:
                obj = self.reader("ResourceClaim", ns, claim_name)
                claim_spec = (obj or {}).get("spec") or {}
            if obj is None and ref.get("resourceClaimTemplateName"):
                obj = self.reader("ResourceClaimTemplate", ns, ref["resourceClaimTemplateName"])
                claim_spec = ((obj or {}).get("spec") or {}).get("spec") or {}
            if obj is None:
                continue
            g, n = _claim_counts(claim_spec, self.driver)
            gpus, nics = gpus + g, nics + n
        return gpus, nics

    # -- verbs -----------------------------------------------------------------------------

    def _nodes(self, args: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        nodes = (wire_field(args, "Nodes") or {}).get("items")
        if nodes is not None:
            return list(nodes), False
        names = wire_field(args, "NodeNames") or []
        return [{"metadata": {"name": n}} for n in names], True

    def _best(self, node: dict[str, Any], req: Request, occ: Occupancy) -> tuple[float, str]:
        """(best score, "") on a node, or (-1, why not)."""
        topo = self.graphs.topology(node)
        if topo is None:
            return -1.0, "no topology graph for this node"
        if not all(topo.labels.get(k) == v for k, v in req.node_labels.items()):
            return -1.0, "node labels do not meet the workload's constraints"
        found = node_placements(topo, occ, req, 1)
        if not found:
            return -1.0, f"no {req.gpus}-GPU placement fits the free devices"
        return found[0].score, ""

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        nodes, by_name = self._nodes(args)
        try:
            req = self.workload(wire_field(args, "Pod") or {})
        except ValueError as exc:
            return _filter_result([], {}, by_name, error=str(exc))
        if req is None:
            return _filter_result(nodes, {}, by_name)
        occ = self.occupancy()
        failed: dict[str, str] = {}
        kept = []
        for node in nodes:
            score, why = self._best(node, req, occ)
            if score < 0:
                failed[str(node["metadata"]["name"])] = why
            else:
                kept.append(node)
        # Expected completion (issue #24): hold the pod off slow nodes while a faster one
        # may free within its bound; the reason goes to FailedNodes.
        waits = self._waits(wire_field(args, "Pod") or {}, req, nodes, kept, occ)
        if waits:
            failed.update(waits)
            kept = [n for n in kept if str(n["metadata"]["name"]) not in waits]
        return _filter_result(kept, failed, by_name)

    def _waits(
        self,
        pod: dict[str, Any],
        req: Request,
        nodes: list[dict[str, Any]],
        kept: list[dict[str, Any]],
        occ: Occupancy,
    ) -> dict[str, str]:
        """Nodes to refuse for now (``completion.filter_waits``): only for a pod that
        states its run time (``expectedRunSeconds`` or Kueue's max-exec-time label)."""
        expected = req.expected_run_s or kueue_hint(pod)
        created = _timestamp((pod.get("metadata") or {}).get("creationTimestamp"))
        if expected is None or created is None:
            return {}
        for n in nodes:
            self.graphs.topology(n)  # fresh labels for the nodes the scheduler sent
        # The yardstick is every node the pod may run on, not only those that passed the
        # scheduler's own filters (a taken NVSwitch node never reaches the extender).
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        topos = [
            t
            for t in self.graphs.known()
            if not t.labels or all(t.labels.get(k) == str(v) for k, v in selector.items())
        ]
        fits = {str(n["metadata"]["name"]) for n in kept}
        return filter_waits(topos, fits, occ, req, expected, time.time() - created)

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        nodes, _ = self._nodes(args)
        try:
            req = self.workload(wire_field(args, "Pod") or {})
        except ValueError:
            req = None
        out = []
        occ = self.occupancy() if req is not None else Occupancy()
        for node in nodes:
            name = str(node["metadata"]["name"])
            if req is None:
                out.append({"Host": name, "Score": 0})
                continue
            score, _ = self._best(node, req, occ)
            value = 0 if score < 0 else round(max(0.0, min(100.0, score)) / 10.0)
            out.append({"Host": name, "Score": int(min(MAX_EXTENDER_PRIORITY, value))})
        return out


def _timestamp(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 API timestamp, or None."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def wire_field(args: dict[str, Any], name: str) -> Any:
    """``args[name]`` matched as Go's encoding/json matches a struct field: the exact key
    first, else the first key equal to it without regard to case (``Pod``/``pod``)."""
    if name in args:
        return args[name]
    folded = name.casefold()
    for key, value in args.items():
        if isinstance(key, str) and key.casefold() == folded:
            return value
    return None


def _filter_result(
    nodes: list[dict[str, Any]], failed: dict[str, str], by_name: bool, error: str = ""
) -> dict[str, Any]:
    """ExtenderFilterResult as Go marshals it: every field, nil pointers as null."""
    names = [str(n["metadata"]["name"]) for n in nodes] if by_name else None
    node_list = (
        None
        if by_name
        else {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes}
    )
    return {
        "Nodes": node_list,
        "NodeNames": names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": {},
        "Error": error,
    }


# ------------------------------------------------------------------ Kubernetes access


class KubeReader:
    """Reads claims/templates and lists allocated claims through the API (in-cluster or
    kubeconfig). Listing needs ``list`` on resourceclaims; without it the occupancy is
    empty and a warning is logged once."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.api = client.ResourceV1Api()
        self.ttl_s = ttl_s
        self._occ: tuple[float, Occupancy] | None = None
        self._warned = False
        self._lock = threading.Lock()

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        fn = (
            self.api.read_namespaced_resource_claim
            if kind == "ResourceClaim"
            else self.api.read_namespaced_resource_claim_template
        )
        try:
            obj = fn(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ValueError(f"{kind} {namespace}/{name}: HTTP {exc.status}") from exc
        data: dict[str, Any] = json.loads(cast(Any, obj).data)
        return data

    def occupancy(self) -> Occupancy:
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            now = time.monotonic()
            if self._occ is not None and now - self._occ[0] < self.ttl_s:
                return self._occ[1]
            occ = Occupancy()
            try:
                resp = self.api.list_resource_claim_for_all_namespaces(_preload_content=False)
                for claim in json.loads(cast(Any, resp).data).get("items") or []:
                    occ.add_claim(claim)
            except (ApiException, OSError) as exc:
                if not self._warned:
                    log.warning("cannot list ResourceClaims (%s): scoring without occupancy", exc)
                    self._warned = True
            self._occ = (now, occ)
            return occ


# ------------------------------------------------------------------ HTTP


#: The extender's POST endpoints (kube-scheduler's filterVerb and prioritizeVerb).
VERBS = ("filter", "prioritize")


def make_server(ext: Extender, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = "toposlice-scorer"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/healthz", "/readyz"):
                self._send(200, {"status": "ok"})
            elif self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] in VERBS:
                data = json.dumps({"error": "use POST with ExtenderArgs"}).encode("utf-8")
                self.send_response(405)
                self.send_header("Allow", "POST")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                self._send(400, {"error": "missing or oversized body"})
                return
            try:
                args = json.loads(self.rfile.read(length))
                if not isinstance(args, dict):
                    raise ValueError("ExtenderArgs must be a JSON object")
            except ValueError as exc:
                self._send(400, {"error": f"bad ExtenderArgs: {exc}"})
                return
            verb = self.path.rstrip("/").rsplit("/", 1)[-1]
            try:
                if verb == "filter":
                    self._send(200, ext.filter(args))
                elif verb == "prioritize":
                    self._send(200, ext.prioritize(args))
                else:
                    self._send(404, {"error": f"unknown verb {verb!r}"})
            except Exception as exc:  # a bad pod or graph must not kill the server
                log.exception("extender %s failed", verb)
                body: Any = _filter_result([], {}, True, error=str(exc)) if verb == "filter" else []
                self._send(200 if verb == "filter" else 500, body)

    return ThreadingHTTPServer((host, port), Handler)
