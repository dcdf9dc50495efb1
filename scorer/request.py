"""The workload a placement is scored for, and the occupancy it is placed into.

A request file (YAML or JSON) is a small, strict document: unknown keys and bad values are
refused with the file and key named, because a silently ignored typo (``nicPerGPU``) would
yield a valid-looking but wrong placement.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

PATTERNS = (
    "tensor-parallel",
    "data-parallel",
    "pipeline-parallel",
    "inference-prefill",
    "inference-decode",
    "independent",
)
BOUNDS = ("compute", "memory", "communication")

_KEYS = {
    "apiVersion",
    "kind",
    "name",
    "gpus",
    "nicsPerGpu",
    "cpus",
    "minGpuMemory",
    "pattern",
    "bound",
    "constraints",
    "expectedRunSeconds",
}
_CONSTRAINT_KEYS = {"nodeLabels", "gpuAttributes"}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_FACTORS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def parse_quantity(text: str | int) -> int:
    """Kubernetes quantity (``80Gi``, ``40G``, ``1024``) in bytes/units."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"not a quantity: {text!r} (e.g. 80Gi, 40G)")
    return int(float(m.group(1)) * _FACTORS[m.group(2)])


@dataclass(frozen=True)
class Request:
    gpus: int
    nics_per_gpu: int = 0
    cpus: int = 0
    min_gpu_memory: int = 0
    """Bytes."""
    pattern: str = "independent"
    bound: str = "compute"
    node_labels: dict[str, str] = field(default_factory=dict)
    """Hard filter: a node must carry every label (a compliance boundary, a tenant)."""
    gpu_attributes: dict[str, str] = field(default_factory=dict)
    """Hard filter: graph GPU attributes that must equal these values (e.g. ``model``)."""
    name: str = "request"
    expected_run_s: float | None = None
    """Run-time hint (seconds at the best placement), when the workload states one: used by
    the expected-completion decision (scorer/completion.py), never by the score."""

    def with_gpus(self, n: int) -> Request:
        return Request(
            gpus=n,
            nics_per_gpu=self.nics_per_gpu,
            cpus=self.cpus,
            min_gpu_memory=self.min_gpu_memory,
            pattern=self.pattern,
            bound=self.bound,
            node_labels=self.node_labels,
            gpu_attributes=self.gpu_attributes,
            name=self.name,
            expected_run_s=self.expected_run_s,
        )

    def key(self) -> tuple[Any, ...]:
        """What a search result depends on (node labels are checked before any cache)."""
        return self._key

    @cached_property
    def _key(self) -> tuple[Any, ...]:
        # computed once: every cache of the search and the decision is looked up by it
        return (
            self.gpus,
            self.nics_per_gpu,
            self.cpus,
            self.min_gpu_memory,
            self.pattern,
            self.bound,
            tuple(sorted(self.gpu_attributes.items())),
        )


def _int(where: str, key: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {key} must be an integer, not {value!r}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{where}: {key} must be between {minimum} and {maximum}, not {value}")
    return value


def _str_map(where: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, (str, int, bool)) for k, v in value.items()
    ):
        raise ValueError(f"{where}: {key} must be a mapping of names to values")
    return {k: str(v) for k, v in value.items()}


def request_from_dict(data: Any, where: str = "request") -> Request:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a request is a mapping, not {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_KEYS))})"
        )
    if "gpus" not in data:
        raise ValueError(f"{where}: gpus is required")
    gpus = _int(where, "gpus", data["gpus"], 1, 4096)
    pattern = data.get("pattern", "independent" if gpus == 1 else "data-parallel")
    if pattern not in PATTERNS:
        raise ValueError(f"{where}: pattern {pattern!r} is not one of {', '.join(PATTERNS)}")
    bound = data.get("bound", "compute")
    if bound not in BOUNDS:
        raise ValueError(f"{where}: bound {bound!r} is not one of {', '.join(BOUNDS)}")
    mem = data.get("minGpuMemory", 0)
    try:
        min_mem = parse_quantity(mem)
    except ValueError as exc:
        raise ValueError(f"{where}: minGpuMemory: {exc}") from exc
    cons = data.get("constraints") or {}
    if not isinstance(cons, dict):
        raise ValueError(f"{where}: constraints must be a mapping")
    bad = sorted(set(cons) - _CONSTRAINT_KEYS)
    if bad:
        raise ValueError(
            f"{where}: constraints: unknown key {bad[0]!r} "
            f"(allowed: {', '.join(sorted(_CONSTRAINT_KEYS))})"
        )
    return Request(
        gpus=gpus,
        nics_per_gpu=_int(where, "nicsPerGpu", data.get("nicsPerGpu", 0), 0, 8),
        cpus=_int(where, "cpus", data.get("cpus", 0), 0, 1 << 20),
        min_gpu_memory=min_mem,
        pattern=pattern,
        bound=bound,
        node_labels=_str_map(where, "constraints.nodeLabels", cons.get("nodeLabels", {})),
        gpu_attributes=_str_map(where, "constraints.gpuAttributes", cons.get("gpuAttributes", {})),
        name=str(data.get("name") or "request"),
        expected_run_s=_seconds(where, "expectedRunSeconds", data.get("expectedRunSeconds")),
    )


def _seconds(where: str, key: str, value: Any) -> float | None:
    """A positive duration in seconds (int or float), or None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {key} must be a number of seconds, not {value!r}")
    if not 0 < value <= 366 * 86400 or value != value:
        raise ValueError(f"{where}: {key} must be between 0 and one year, not {value}")
    return float(value)


def load_document(path: str | Path) -> Any:
    """A JSON or YAML file's content (JSON parsed by the C parser: graphs are large), with
    the file named in any error."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not JSON/YAML: not UTF-8 text (byte {exc.start})") from exc
    try:
        return json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{p}: not JSON/YAML: {exc}") from exc


def load_request(path: str | Path) -> Request:
    return request_from_dict(load_document(path), str(path))


@dataclass
class Occupancy:
    """Devices already allocated, per pool (= node), and those running memory-bound work."""

    allocated: dict[str, set[str]] = field(default_factory=dict)
    memory_bound: dict[str, set[str]] = field(default_factory=dict)

    def used(self, pool: str) -> set[str]:
        return self.allocated.get(pool, set())

    def busy_memory(self, pool: str) -> set[str]:
        return self.memory_bound.get(pool, set())

    def add_claim(self, claim: dict[str, Any]) -> None:
        """Record a ResourceClaim's allocation result (API JSON form)."""
        results = (
            ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
        ) or []
        ann = (claim.get("metadata") or {}).get("annotations") or {}
        memory = ann.get(BOUND_ANNOTATION) == "memory"
        for r in results:
            pool, dev = r.get("pool"), r.get("device")
            if isinstance(pool, str) and isinstance(dev, str):
                self.allocated.setdefault(pool, set()).add(dev)
                if memory:
                    self.memory_bound.setdefault(pool, set()).add(dev)


#: Annotations a pod (or claim) carries for the scorer.
PROFILE_ANNOTATION = "toposlice.dev/workload"
BOUND_ANNOTATION = "toposlice.dev/bound"


def occupancy_from_dict(data: Any, where: str = "occupancy") -> Occupancy:
    """``{allocated: {node: [device]}, memoryBound: {node: [device]}}`` or a list of
    ResourceClaims (``kind: List``/``ResourceClaimList`` with ``items``, or a bare list)."""
    occ = Occupancy()
    if data is None:
        return occ
    items: list[Any] | None = None
    if isinstance(data, list):
        items = data
    elif isinstance(data, dict) and "items" in data:
        items = data["items"]
    elif isinstance(data, dict) and data.get("kind") == "ResourceClaim":
        items = [data]
    if items is not None:
        for i, claim in enumerate(items):
            if not isinstance(claim, dict):
                raise ValueError(f"{where}: items[{i}] is not a ResourceClaim object")
            occ.add_claim(claim)
        return occ
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping or a list of ResourceClaims")
    bad = sorted(set(data) - {"allocated", "memoryBound"})
    if bad:
        raise ValueError(f"{where}: unknown key {bad[0]!r} (allowed: allocated, memoryBound)")
    for key, target in (("allocated", occ.allocated), ("memoryBound", occ.memory_bound)):
        section = data.get(key) or {}
        if not isinstance(section, dict):
            raise ValueError(f"{where}: {key} must map node names to device lists")
        for node, devs in section.items():
            if not isinstance(devs, list) or not all(isinstance(d, str) for d in devs):
                raise ValueError(f"{where}: {key}.{node} must be a list of device names")
            target[str(node)] = set(devs)
    for node, devs in occ.memory_bound.items():
        occ.allocated.setdefault(node, set()).update(devs)
    return occ


def load_occupancy(path: str | Path) -> Occupancy:
    """Occupancy from a file: the mapping form, or ResourceClaims in every form kubectl
    reads or writes (one object, a List, a JSON array, a YAML stream of them)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return occupancy_from_dict(load_document(path), str(path))  # its one-line error
    if text.lstrip().startswith(("{", "[")):
        return occupancy_from_dict(load_document(path), str(path))
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: not JSON/YAML: {exc}") from exc
    if len(docs) == 1:
        return occupancy_from_dict(docs[0], str(path))
    return occupancy_from_dict(docs, str(path))
