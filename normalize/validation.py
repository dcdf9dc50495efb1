"""Upstream resource.k8s.io/v1 ResourceSlice validation limits, as a pure checker.

``validate_slice`` returns a list of human-readable error strings (empty = valid) for the rules
the API server applies to one ResourceSlice; ``validate_pool`` adds the pool-level checks the
Go slice controller performs before publishing. See docs/attributes.md and the resource API
reference.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeGuard

from .attributes import LIST_KEYS, SEMVER_RE
from .limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_ATTRIBUTE_VALUES,
    MAX_ATTRS_AND_CAPACITY,
    MAX_BINDING_CONDITIONS,
    MAX_CONSUMES_COUNTERS,
    MAX_COUNTERS,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_RESTRICTED,
    MAX_DNS_LABEL,
    MAX_DOMAIN_LENGTH,
    MAX_ID_LENGTH,
    MAX_POOL_NAME,
    MAX_SHARED_COUNTERS,
    MAX_STRING,
    MAX_TAINTS,
)

TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
VALUE_KEYS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")

_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY_RE = re.compile(
    r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_CONDITION_TYPE_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_INT64 = (INT64_MIN, INT64_MAX)


def is_dns_label(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= MAX_DNS_LABEL and bool(_LABEL_RE.match(value))


def is_dns_subdomain(value: Any) -> TypeGuard[str]:
    return (
        isinstance(value, str) and len(value) <= MAX_POOL_NAME and bool(_SUBDOMAIN_RE.match(value))
    )


def is_quantity(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(_QUANTITY_RE.match(value))


def driver_name_errors(driver: Any, path: str = "spec.driver") -> list[str]:
    """CSI driver name rules: required, <= 63 chars, DNS subdomain after lower-casing."""
    if not isinstance(driver, str) or not driver:
        return [f"{path}: required"]
    errs = []
    if len(driver) > MAX_DOMAIN_LENGTH:
        errs.append(f"{path}: must be no more than 63 characters")
    if not _SUBDOMAIN_RE.match(driver.lower()):
        errs.append(f"{path}: {driver!r} is not a DNS-1123 subdomain")
    return errs


def qualified_name_errors(name: Any, path: str) -> list[str]:
    """QualifiedName: C identifier <= 32 chars, or ``<domain>/<C identifier>``."""
    if not isinstance(name, str) or not name:
        return [f"{path}: name required"]
    domain, sep, ident = name.rpartition("/")
    errs = []
    if sep:
        if not domain:
            errs.append(f"{path}: {name!r}: empty domain")
        else:
            for e in driver_name_errors(domain, path):
                errs.append(f"{e} (domain of {name!r})")
    if not _C_IDENT_RE.match(ident):
        errs.append(f"{path}: {name!r}: {ident!r} is not a C identifier")
    if len(ident) > MAX_ID_LENGTH:
        errs.append(f"{path}: {name!r}: identifier longer than 32 characters")
    return errs


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v <= _INT64[1]


def _scalar_errors(kind: str, value: Any, path: str) -> list[str]:
    if kind == "int":
        return [] if _is_int(value) else [f"{path}: not an int64"]
    if kind == "bool":
        return [] if isinstance(value, bool) else [f"{path}: not a bool"]
    if not isinstance(value, str):
        return [f"{path}: not a string"]
    errs = []
    if len(value) > MAX_STRING:
        errs.append(f"{path}: must be no more than 64 characters")
    if kind == "version" and not SEMVER_RE.match(value):
        errs.append(f"{path}: {value!r} is not a semantic version")
    return errs


def attribute_errors(attr: Any, path: str) -> list[str]:
    """Exactly one value type, with the per-type rules."""
    if not isinstance(attr, dict):
        return [f"{path}: must be an object"]
    unknown = [k for k in attr if k not in VALUE_KEYS]
    if unknown:
        return [f"{path}: unknown value types {unknown}"]
    present = [k for k in VALUE_KEYS if attr.get(k) is not None]
    if len(present) != 1:
        return [f"{path}: exactly one value must be specified (got {len(present)})"]
    kind = present[0]
    value = attr[kind]
    if kind in LIST_KEYS:
        if not isinstance(value, list) or not value:
            return [f"{path}.{kind}: must be a non-empty list"]
        errs = []
        for i, v in enumerate(value):
            errs += _scalar_errors(kind[:-1], v, f"{path}.{kind}[{i}]")
        return errs
    return _scalar_errors(kind, value, f"{path}.{kind}")


def _value_count(attr: Any) -> int:
    if isinstance(attr, dict):
        for k in LIST_KEYS:
            if isinstance(attr.get(k), list):
                return len(attr[k])
    return 1


def device_is_restricted(dev: dict[str, Any]) -> bool:
    """Taints, counter consumption or list attributes lower the slice limit to 64."""
    if dev.get("taints") or dev.get("consumesCounters"):
        return True
    attrs = dev.get("attributes") or {}
    return isinstance(attrs, dict) and any(
        isinstance(a, dict) and any(a.get(k) is not None for k in LIST_KEYS) for a in attrs.values()
    )


def device_errors(dev: Any, path: str, per_device_nodes: bool) -> list[str]:
    if not isinstance(dev, dict):
        return [f"{path}: must be an object"]
    errs: list[str] = []
    name = dev.get("name")
    if not is_dns_label(name):
        errs.append(f"{path}.name: {name!r} is not a DNS-1123 label")
    attrs = dev.get("attributes") or {}
    capacity = dev.get("capacity") or {}
    if not isinstance(attrs, dict) or not isinstance(capacity, dict):
        return [*errs, f"{path}: attributes and capacity must be maps"]
    for key, attr in attrs.items():
        errs += qualified_name_errors(key, f"{path}.attributes[{key!r}]")
        errs += attribute_errors(attr, f"{path}.attributes[{key!r}]")
    for key, cap in capacity.items():
        cpath = f"{path}.capacity[{key!r}]"
        errs += qualified_name_errors(key, cpath)
        if not isinstance(cap, dict) or cap.get("value") is None:
            errs.append(f"{cpath}.value: required")
        elif not is_quantity(cap["value"]):
            errs.append(f"{cpath}.value: {cap['value']!r} is not a quantity")
        elif cap.get("requestPolicy") is not None and not dev.get("allowMultipleAllocations"):
            errs.append(f"{cpath}.requestPolicy: only allowed with allowMultipleAllocations")
    if len(attrs) + len(capacity) > MAX_ATTRS_AND_CAPACITY:
        errs.append(
            f"{path}: {len(attrs)} attributes + {len(capacity)} capacities exceed the limit of 32"
        )
    total = sum(_value_count(a) for a in attrs.values())
    if total > MAX_ATTRIBUTE_VALUES:
        errs.append(f"{path}.attributes: {total} attribute values exceed the limit of 48")
    taints = dev.get("taints") or []
    if len(taints) > MAX_TAINTS:
        errs.append(f"{path}.taints: more than 16")
    for i, taint in enumerate(taints):
        if not isinstance(taint, dict) or not taint.get("key"):
            errs.append(f"{path}.taints[{i}].key: required")
        elif taint.get("effect") not in TAINT_EFFECTS:
            errs.append(f"{path}.taints[{i}].effect: must be one of {TAINT_EFFECTS}")
    errs += _counter_consumption_errors(dev.get("consumesCounters") or [], path)
    for field_name in ("bindingConditions", "bindingFailureConditions"):
        conds = dev.get(field_name) or []
        if len(conds) > MAX_BINDING_CONDITIONS:
            errs.append(f"{path}.{field_name}: more than 4")
        for c in conds:
            if not isinstance(c, str) or len(c) > 316 or not _CONDITION_TYPE_RE.match(c):
                errs.append(f"{path}.{field_name}: {c!r} is not a condition type")
    selection = [k for k in ("nodeName", "nodeSelector", "allNodes") if dev.get(k) is not None]
    if per_device_nodes and len(selection) != 1:
        errs.append(f"{path}: exactly one of nodeName, nodeSelector, allNodes is required")
    if not per_device_nodes and selection:
        errs.append(f"{path}: {selection} only allowed with spec.perDeviceNodeSelection")
    return errs


def _counter_consumption_errors(items: list[Any], path: str) -> list[str]:
    errs = []
    if len(items) > MAX_CONSUMES_COUNTERS:
        errs.append(f"{path}.consumesCounters: more than 2")
    seen: set[str] = set()
    for i, item in enumerate(items):
        ipath = f"{path}.consumesCounters[{i}]"
        cs = item.get("counterSet") if isinstance(item, dict) else None
        if not is_dns_label(cs):
            errs.append(f"{ipath}.counterSet: {cs!r} is not a DNS-1123 label")
        elif cs in seen:
            errs.append(f"{ipath}.counterSet: duplicate {cs!r}")
        else:
            seen.add(cs)
        errs += _counters_errors(item.get("counters") if isinstance(item, dict) else None, ipath)
    return errs


def _counters_errors(counters: Any, path: str) -> list[str]:
    if not isinstance(counters, dict) or not counters:
        return [f"{path}.counters: 1 to 32 entries required"]
    errs = []
    if len(counters) > MAX_COUNTERS:
        errs.append(f"{path}.counters: more than 32")
    for name, counter in counters.items():
        if not is_dns_label(name):
            errs.append(f"{path}.counters: {name!r} is not a DNS-1123 label")
        value = counter.get("value") if isinstance(counter, dict) else None
        if not is_quantity(value):
            errs.append(f"{path}.counters[{name!r}].value: {value!r} is not a quantity")
    return errs


def pool_name_errors(name: Any, path: str = "spec.pool.name") -> list[str]:
    if not isinstance(name, str) or not name:
        return [f"{path}: required"]
    errs = []
    if len(name) > MAX_POOL_NAME:
        errs.append(f"{path}: must be no more than 253 characters")
    for part in name.split("/"):
        if not is_dns_subdomain(part):
            errs.append(f"{path}: segment {part!r} is not a DNS-1123 subdomain")
    return errs


def validate_slice(obj: dict[str, Any]) -> list[str]:
    """All upstream limits for one ResourceSlice (dict in API JSON form); [] when valid."""
    errs: list[str] = []
    if obj.get("apiVersion") != "resource.k8s.io/v1":
        errs.append(f"apiVersion: want resource.k8s.io/v1, got {obj.get('apiVersion')!r}")
    if obj.get("kind") != "ResourceSlice":
        errs.append(f"kind: want ResourceSlice, got {obj.get('kind')!r}")
    meta = obj.get("metadata") or {}
    name, gen_name = meta.get("name"), meta.get("generateName")
    if not name and not gen_name:
        errs.append("metadata: name or generateName is required")
    if name and not is_dns_subdomain(name):
        errs.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    if gen_name and not is_dns_subdomain(str(gen_name).rstrip("-") or "x"):
        errs.append(f"metadata.generateName: {gen_name!r} does not give a DNS-1123 subdomain")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*errs, "spec: required"]
    errs += driver_name_errors(spec.get("driver"))
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        errs.append("spec.pool: required")
    else:
        errs += pool_name_errors(pool.get("name"))
        gen = pool.get("generation")
        if not _is_int(gen) or gen < 0:
            errs.append(f"spec.pool.generation: must be an integer >= 0, got {gen!r}")
        count = pool.get("resourceSliceCount")
        if not _is_int(count) or count <= 0:
            errs.append(f"spec.pool.resourceSliceCount: must be an integer > 0, got {count!r}")
    errs += _node_selection_errors(spec)
    devices = spec.get("devices") or []
    shared = spec.get("sharedCounters") or []
    if devices and shared:
        errs.append("spec: devices and sharedCounters are mutually exclusive")
    if len(shared) > MAX_SHARED_COUNTERS:
        errs.append("spec.sharedCounters: more than 8")
    shared_names: set[str] = set()
    for i, cs in enumerate(shared):
        cs_name = cs.get("name") if isinstance(cs, dict) else None
        if not is_dns_label(cs_name):
            errs.append(f"spec.sharedCounters[{i}].name: {cs_name!r} is not a DNS-1123 label")
        elif cs_name in shared_names:
            errs.append(f"spec.sharedCounters[{i}].name: duplicate {cs_name!r}")
        else:
            shared_names.add(cs_name)
        errs += _counters_errors(
            cs.get("counters") if isinstance(cs, dict) else None, f"spec.sharedCounters[{i}]"
        )
    if not isinstance(devices, list):
        return [*errs, "spec.devices: must be a list"]
    restricted = any(isinstance(d, dict) and device_is_restricted(d) for d in devices)
    limit = MAX_DEVICES_PER_SLICE_RESTRICTED if restricted else MAX_DEVICES_PER_SLICE
    if len(devices) > limit:
        why = " (taints, counters or list attributes present)" if restricted else ""
        errs.append(f"spec.devices: {len(devices)} devices exceed the limit of {limit}{why}")
    per_device = spec.get("perDeviceNodeSelection") is True
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        errs += device_errors(dev, f"spec.devices[{i}]", per_device)
        dname = dev.get("name") if isinstance(dev, dict) else None
        if isinstance(dname, str):
            if dname in seen:
                errs.append(f"spec.devices[{i}].name: duplicate {dname!r}")
            seen.add(dname)
    return errs


def _node_selection_errors(spec: dict[str, Any]) -> list[str]:
    keys = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
    present = [k for k in keys if spec.get(k) is not None]
    errs = []
    if len(present) != 1:
        errs.append(f"spec: exactly one of {', '.join(keys)} is required (got {present})")
    if "nodeName" in present and not (isinstance(spec["nodeName"], str) and spec["nodeName"]):
        errs.append("spec.nodeName: must not be empty")
    if "nodeSelector" in present:
        terms = (spec["nodeSelector"] or {}).get("nodeSelectorTerms") or []
        if len(terms) != 1:
            errs.append("spec.nodeSelector: exactly one nodeSelectorTerms entry is required")
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if flag in present and spec[flag] is not True:
            errs.append(f"spec.{flag}: must be true when set")
    return errs


def validate_pool(slices: Sequence[dict[str, Any]]) -> list[str]:
    """Pool-level checks: one pool and driver, equal generation, count == resourceSliceCount,
    device names unique across the pool, counter references resolvable; plus per-slice rules."""
    if not slices:
        return ["pool: at least one slice is required"]
    errs: list[str] = []
    for i, s in enumerate(slices):
        errs += [f"slice[{i}]: {e}" for e in validate_slice(s)]
    specs = [s.get("spec") or {} for s in slices]
    pools = {(sp.get("pool") or {}).get("name") for sp in specs}
    drivers = {sp.get("driver") for sp in specs}
    if len(pools) != 1:
        errs.append(f"pool: slices name different pools {sorted(map(str, pools))}")
    if len(drivers) != 1:
        errs.append(f"pool: slices name different drivers {sorted(map(str, drivers))}")
    gens = {(sp.get("pool") or {}).get("generation") for sp in specs}
    if len(gens) != 1:
        errs.append(f"pool: slices have different generations {sorted(map(str, gens))}")
    counts = {(sp.get("pool") or {}).get("resourceSliceCount") for sp in specs}
    if counts != {len(slices)}:
        errs.append(f"pool: resourceSliceCount {sorted(map(str, counts))} != {len(slices)} slices")
    seen: dict[str, int] = {}
    counter_sets: dict[str, set[str]] = {}
    for i, sp in enumerate(specs):
        for dev in sp.get("devices") or []:
            name = dev.get("name") if isinstance(dev, dict) else None
            if not isinstance(name, str):
                continue
            if name in seen:
                errs.append(f"pool: device {name!r} in slice {i} duplicates slice {seen[name]}")
            else:
                seen[name] = i
        for cs in sp.get("sharedCounters") or []:
            if not isinstance(cs, dict):
                continue
            cs_name = str(cs.get("name"))
            if cs_name in counter_sets:
                errs.append(f"pool: duplicate counter set {cs_name!r}")
            counter_sets[cs_name] = set((cs.get("counters") or {}).keys())
    for sp in specs:
        for dev in sp.get("devices") or []:
            for use in (dev.get("consumesCounters") or []) if isinstance(dev, dict) else []:
                cs_name = use.get("counterSet")
                if cs_name not in counter_sets:
                    errs.append(f"pool: device {dev.get('name')!r} uses unknown set {cs_name!r}")
                    continue
                for counter in use.get("counters") or {}:
                    if counter not in counter_sets[cs_name]:
                        errs.append(
                            f"pool: device {dev.get('name')!r} uses unknown counter "
                            f"{cs_name}/{counter}"
                        )
    return errs
