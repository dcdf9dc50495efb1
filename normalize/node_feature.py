"""The node's NFD ``NodeFeature`` (``nfd.k8s-sigs.io/v1alpha1``): topology as node labels.

NFD's master turns ``spec.labels`` of every NodeFeature that carries the label
``nfd.node.kubernetes.io/node-name: <node>`` into labels of that Node, so the driver needs
no permission on Nodes. The keys (all under ``toposlice.dev/``; docs/integrations.md maps
each to what Kueue, KAI, Volcano and topograph read):

- ``nvlink-domain``: the GPUs' scale-up domain. The fabric clique
  (``<clusterUUID>.<cliqueId>``, a valid label value as it is) when every GPU of the
  node is in the same ready clique, else the node
  itself (a label-safe form of the node name): the level a Kueue/KAI ``Topology`` or a
  Volcano ``HyperNode`` tier groups nodes by. Absent without GPUs.
- ``gpu.clique``: the fabric clique alone, only when ready (the value of
  ``nvidia.com/gpu.clique``).
- ``gpu.vendor``, ``gpu.model`` (label-safe), ``gpu.count``.
- ``gpus-per-numa``: the most GPUs on one NUMA node; ``gpu-numa-nodes``: how many NUMA
  nodes hold GPUs.
- ``gpu-nic-alignment``: for each GPU the closest RDMA NIC (physical functions, as
  ``nvidia-smi topo -m`` lists them), and the worst of those over the GPUs, lower case:
  ``pix`` < ``pxb`` < ``phb`` < ``node`` < ``sys``; ``none`` without RDMA NICs.
- ``rail-count``: the RDMA NICs that are the closest NIC of at least one GPU (rails of a
  rail-optimized fabric; storage NICs farther away do not count).
- ``gpus-per-nvlink-domain``: the most GPUs of the node that share one NVLink domain (the
  devices' ``nvlinkDomain`` attribute), ``0`` without NVLink: an integer for ``Gt``.
- ``nic.link-layers``: the link layers the node's network functions report (the NIC
  devices' ``linkLayer``), lower case, sorted and joined with ``_``
  (``ethernet_infiniband``); ``none`` when none reports one.

The last two exist so that a pod whose claim needs four GPUs of one NVLink domain, or an
InfiniBand NIC, can carry a node affinity that kube-scheduler's NodeAffinity filter checks
before DynamicResources: a node whose labels prove the claim cannot fit is refused without
the allocator's search (docs/performance.md#claims-at-cluster-size). Both are necessary
conditions computed from the same facts as the slice attributes, so such an affinity never
refuses a node the claim could fit. :func:`admits` is that filter's rule, for the benches
and tests.

``spec.features.attributes["toposlice.topology"]`` carries the same values without the
prefix, for NodeFeatureRules; ``flags`` and ``instances`` are present and empty, because
the older NodeFeature schema (NFD up to v0.12, and the fork some distributions still ship)
requires all three and refuses the object (HTTP 422) without them, while the current one
accepts them.

With NFD's hardening option ``restrictions.denyNodeFeatureLabels`` its master ignores
``spec.labels`` of NodeFeatures outside its own namespace, ours included; the features
still count. :func:`build_node_feature_rule` is the NodeFeatureRule (the chart's
``integrations.nodeFeature.rule``) that makes the same labels from the feature set in that
mode. Pure functions: no I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from discovery.model import Gpu, Inventory, Nic

from .cpugroups import device_numa
from .devices import nvlink_domain
from .names import short_hash
from .relations import matrix_nics, ordered_gpus, relation

API_VERSION = "nfd.k8s-sigs.io/v1alpha1"
KIND = "NodeFeature"
PLURAL = "nodefeatures"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
PREFIX = "toposlice.dev"
FEATURE_SET = "toposlice.topology"
MANAGED_BY = "toposlice"
RULE_NAME = "toposlice-topology-labels"

#: PCIe relation classes, closest first (``nvidia-smi topo -m`` legend).
ALIGNMENT_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")

MAX_LABEL_VALUE = 63
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def is_label_value(value: str) -> bool:
    return len(value) <= MAX_LABEL_VALUE and bool(_LABEL_VALUE.match(value))


def label_safe(text: str) -> str:
    """Any text as a label value: odd characters become ``-``, ends trimmed to
    alphanumerics, and a long value keeps its head plus a hash of the whole."""
    value = _BAD.sub("-", text.strip())
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    if len(value) > MAX_LABEL_VALUE:
        head = re.sub(r"[^A-Za-z0-9]+$", "", value[: MAX_LABEL_VALUE - 13])
        value = f"{head}-{short_hash(text, 12)}"
    return value


def object_name(node_name: str) -> str:
    """``toposlice-<node>``; a hash stands in for a node name too long for it."""
    name = f"toposlice-{node_name}"
    return name if len(name) <= 253 else f"toposlice-{short_hash(node_name, 32)}"


def _clique(gpus: list[Gpu]) -> str | None:
    cliques = {g.fabric.clique if g.fabric is not None else None for g in gpus}
    if len(cliques) == 1:
        (only,) = cliques
        return only
    return None


def _alignment(inv: Inventory, gpus: list[Gpu], nics: list[Nic]) -> tuple[str, int]:
    """(worst best-NIC class over the GPUs, number of distinct best NICs)."""
    if not gpus or not nics:
        return "none", 0
    rank = {cls: i for i, cls in enumerate(ALIGNMENT_ORDER)}
    worst = 0
    rails: set[str] = set()
    for gpu in gpus:
        classes = [(rank.get(relation(inv, gpu, nic), len(rank) - 1), nic.bus_id) for nic in nics]
        best = min(c for c, _ in classes)
        worst = max(worst, best)
        rails.update(bus for c, bus in classes if c == best)
    return ALIGNMENT_ORDER[worst].lower(), len(rails)


def topology_labels(inv: Inventory, node_name: str) -> dict[str, str]:
    """Label name (without prefix) -> value."""
    gpus = ordered_gpus(inv)
    nics = matrix_nics(inv)
    out: dict[str, str] = {}
    if gpus:
        clique = _clique(gpus)
        out["nvlink-domain"] = clique if clique is not None else label_safe(node_name)
        if clique is not None:
            out["gpu.clique"] = clique
        vendors = sorted({g.vendor for g in gpus})
        out["gpu.vendor"] = label_safe("_".join(vendors))
        models = Counter(g.model for g in gpus if g.model)
        if models:
            out["gpu.model"] = label_safe(models.most_common(1)[0][0] or "")
        out["gpu.count"] = str(len(gpus))
        per_numa: Counter[int] = Counter()
        for g in gpus:
            pci = inv.pci(g.bus_id)
            numa = None if pci is None else device_numa(pci)
            if numa is not None:
                per_numa[numa] += 1
        if per_numa:
            out["gpus-per-numa"] = str(max(per_numa.values()))
            out["gpu-numa-nodes"] = str(len(per_numa))
        alignment, rails = _alignment(inv, gpus, nics)
        out["gpu-nic-alignment"] = alignment
        out["rail-count"] = str(rails)
        domains = Counter(d for d in (nvlink_domain(inv, g) for g in gpus) if d is not None)
        out["gpus-per-nvlink-domain"] = str(max(domains.values(), default=0))
        layers = sorted({n.link_layer.lower() for n in inv.nics if n.link_layer})
        out["nic.link-layers"] = label_safe("_".join(layers)) or "none"
    return {k: v for k, v in out.items() if v}


def build_node_feature(inv: Inventory, node_name: str, namespace: str) -> dict[str, Any]:
    """The NodeFeature object for ``node_name`` in ``namespace`` (no ownerReferences: the
    writer adds the Node's UID)."""
    if not is_label_value(node_name):
        raise ValueError(
            f"node name {node_name!r} is longer than {MAX_LABEL_VALUE} characters: NFD "
            f"finds NodeFeatures by the label {NODE_NAME_LABEL}, whose value cannot hold it"
        )
    labels = topology_labels(inv, node_name)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object_name(node_name),
            "namespace": namespace,
            "labels": {NODE_NAME_LABEL: node_name, "app.kubernetes.io/managed-by": MANAGED_BY},
        },
        "spec": {
            "features": {
                "attributes": {FEATURE_SET: {"elements": dict(labels)}},
                "flags": {},
                "instances": {},
            },
            "labels": {f"{PREFIX}/{k}": v for k, v in labels.items()},
        },
    }


def build_node_feature_rule(name: str = RULE_NAME) -> dict[str, Any]:
    """The NodeFeatureRule that turns every element of the ``toposlice.topology`` feature
    set into the ``toposlice.dev/<element>`` label, for NFD masters that drop NodeFeature
    labels (``denyNodeFeatureLabels``). One rule for the whole cluster: NFD evaluates it per
    node against that node's features. The template writes only what the node's NodeFeature
    says, so the labels are the same as in the default mode."""
    domain, feature = FEATURE_SET.split(".", 1)
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeFeatureRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
        "spec": {
            "rules": [
                {
                    "name": "toposlice topology labels",
                    "matchFeatures": [
                        {"feature": FEATURE_SET, "matchName": {"op": "InRegexp", "value": ["."]}}
                    ],
                    "labelsTemplate": (
                        f"{{{{ range .{domain}.{feature} }}}}{PREFIX}/{{{{ .Name }}}}"
                        "={{ .Value }}\n{{ end }}"
                    ),
                }
            ]
        },
    }


def admits(affinity: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a pod's ``affinity`` lets it onto a node with ``labels``: the rule of
    kube-scheduler's NodeAffinity filter for ``requiredDuringSchedulingIgnoredDuringExecution``
    (terms ORed, the expressions of a term ANDed; ``Gt``/``Lt`` compare the label's value
    as an integer and fail when it is not one). ``matchFields`` name fields, not labels: a
    term with them is refused (ValueError) rather than guessed."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    for term in required.get("nodeSelectorTerms") or []:
        if term.get("matchFields"):
            raise ValueError("matchFields is not a label rule")
        exprs = term.get("matchExpressions") or []
        if exprs and all(_expression_holds(e, labels) for e in exprs):
            return True
    return False


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    op, key, values = expr["operator"], expr["key"], list(expr.get("values") or [])
    value = labels.get(key)
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    raise ValueError(f"unknown node selector operator {op!r}")
