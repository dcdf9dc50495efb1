"""A small model of the scheduler's structured allocator, for checking claims against slices.

It follows the upstream rules (``k8s.io/dynamic-resource-allocation/structured``, the
stable variant) closely enough to say which devices a ResourceClaim gets on one node:

- pools are grouped by ``(driver, pool name)``; only the highest generation counts and a
  pool is usable only when all ``resourceSliceCount`` slices of it are present;
- devices are tried first-fit in slice order, with backtracking;
- a request's devices match every selector of its DeviceClass and of the request (CEL,
  with the ``device`` variable the scheduler provides); a selector that errors or does not
  return a bool aborts the allocation, as it does upstream;
- ``allocationMode: All`` takes every matching device (at least one, none in use);
- ``firstAvailable`` tries its sub-requests in order and backtracks into the next one when
  a later request or constraint fails; results name ``<request>/<sub-request>``;
- ``matchAttribute`` constraints hold across the requests they name (all when empty;
  ``req`` covers its sub-requests): every device has the attribute, all values equal
  (list values: the intersection stays non-empty); a device without it is not chosen;
- a device is used at most once, and never when in ``allocated`` or tainted ``NoSchedule``
  / ``NoExecute`` without a matching toleration.

CEL runs on ``common-expression-language`` (the Rust ``cel`` crate). Attribute values are
plain ints, bools, strings and lists; ``version`` attributes are strings here (no
``semver()`` type), capacities are their quantity strings (no ``quantity()``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cel


class AllocationError(Exception):
    """The claim cannot be evaluated (a CEL error, an unknown class): upstream aborts."""


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Any]
    """Fully-qualified attribute name -> value (int, bool, str or list)."""
    capacity: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


@dataclass(frozen=True)
class Result:
    request: str
    driver: str
    pool: str
    device: str


@dataclass
class _Alternative:
    """One way to satisfy a request: ``exactly`` or one ``firstAvailable`` sub-request."""

    result_name: str
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    tolerations: list[Mapping[str, Any]] = field(default_factory=list)


_VALUE_KEYS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
_DOMAIN_IN_CEL = re.compile(r"""device\.(?:attributes|capacity)\[\s*["']([^"']+)["']\s*\]""")


def attribute_value(attr: Mapping[str, Any]) -> Any:
    """The value of an API DeviceAttribute (exactly one key is set)."""
    keys = [k for k in _VALUE_KEYS if k in attr]
    if len(keys) != 1:
        raise AllocationError(f"device attribute {dict(attr)!r} must set exactly one value")
    return attr[keys[0]]


def qualify(name: str, driver: str) -> str:
    """Unqualified attribute names live in the driver's domain."""
    return name if "/" in name else f"{driver}/{name}"


def pool_devices(slices: Iterable[Mapping[str, Any]], node: str | None = None) -> list[Device]:
    """Devices of the complete pools (highest generation) in slice order, for ``node``."""
    by_pool: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in slices:
        spec = s["spec"]
        by_pool.setdefault((spec["driver"], spec["pool"]["name"]), []).append(s)
    out: list[Device] = []
    for (driver, pool), members in by_pool.items():
        newest = max(int(m["spec"]["pool"]["generation"]) for m in members)
        current = [m for m in members if int(m["spec"]["pool"]["generation"]) == newest]
        want = int(current[0]["spec"]["pool"]["resourceSliceCount"])
        if len(current) != want:
            continue  # incomplete pool: being updated, not allocatable
        for s in current:
            spec = s["spec"]
            if node is not None and spec.get("nodeName") not in (None, node):
                continue
            for d in spec.get("devices", []):
                attrs = {
                    qualify(k, driver): attribute_value(v)
                    for k, v in d.get("attributes", {}).items()
                }
                cap = {
                    qualify(k, driver): str(v["value"]) for k, v in d.get("capacity", {}).items()
                }
                out.append(Device(driver, pool, d["name"], attrs, cap, tuple(d.get("taints", []))))
    return out


def _cel_device(dev: Device, domains: Iterable[str]) -> dict[str, Any]:
    """The ``device`` variable: attributes and capacity by domain, then identifier.

    Unknown domains are empty maps upstream; the domains the expressions name are
    pre-filled so that looking one up is not an error here either.
    """
    attrs: dict[str, dict[str, Any]] = {d: {} for d in domains}
    caps: dict[str, dict[str, Any]] = {d: {} for d in domains}
    for name, value in dev.attributes.items():
        domain, ident = name.rsplit("/", 1)
        attrs.setdefault(domain, {})[ident] = value
    for name, value in dev.capacity.items():
        domain, ident = name.rsplit("/", 1)
        caps.setdefault(domain, {})[ident] = value
    return {"driver": dev.driver, "attributes": attrs, "capacity": caps}


class Allocator:
    """Allocates one claim at a time from the devices of the given slices."""

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        device_classes: Iterable[Mapping[str, Any]],
        node: str | None = None,
    ) -> None:
        self.devices = pool_devices(slices, node)
        self.classes = {c["metadata"]["name"]: c for c in device_classes}
        self._programs: dict[str, Any] = {}
        self._matches: dict[tuple[str, tuple[str, str, str]], bool] = {}

    # -- selectors --------------------------------------------------------------------

    def _program(self, expression: str) -> Any:
        prog = self._programs.get(expression)
        if prog is None:
            try:
                prog = cel.compile(expression)
            except Exception as exc:
                raise AllocationError(
                    f"CEL selector does not compile: {expression!r}: {exc}"
                ) from exc
            self._programs[expression] = prog
        return prog

    def selects(self, expression: str, dev: Device) -> bool:
        key = (expression, dev.key)
        hit = self._matches.get(key)
        if hit is not None:
            return hit
        domains = set(_DOMAIN_IN_CEL.findall(expression))
        try:
            value = self._program(expression).execute({"device": _cel_device(dev, domains)})
        except Exception as exc:
            raise AllocationError(
                f"CEL selector {expression!r} failed on device {dev.name}: {exc}"
            ) from exc
        if not isinstance(value, bool):
            raise AllocationError(f"CEL selector {expression!r} returned {value!r}, not a bool")
        self._matches[key] = value
        return value

    def _candidates(self, alt: _Alternative, dev: Device) -> bool:
        cls = self.classes.get(alt.class_name)
        if cls is None:
            raise AllocationError(f"DeviceClass {alt.class_name!r} does not exist")
        exprs = [s["cel"]["expression"] for s in cls.get("spec", {}).get("selectors", [])]
        exprs += alt.selectors
        if not _tolerated(dev.taints, alt.tolerations):
            return False
        return all(self.selects(e, dev) for e in exprs)

    # -- the search -------------------------------------------------------------------

    def allocate(
        self,
        claim_spec: Mapping[str, Any],
        allocated: Iterable[tuple[str, str, str]] = (),
    ) -> list[Result] | None:
        """Results in request order (first-fit, as the scheduler would), or None."""
        devices_spec = claim_spec.get("devices", {})
        requests = [_alternatives(r) for r in devices_spec.get("requests", [])]
        names = [r["name"] for r in devices_spec.get("requests", [])]
        constraints = [
            (list(c.get("requests") or names), c["matchAttribute"])
            for c in devices_spec.get("constraints", [])
            if "matchAttribute" in c
        ]
        if any("distinctAttribute" in c for c in devices_spec.get("constraints", [])):
            raise AllocationError("distinctAttribute is not modelled")
        in_use = set(allocated)
        chosen: list[tuple[str, Device]] = []

        def constraints_hold() -> bool:
            for refs, attr in constraints:
                values: list[Any] = []
                for result_name, dev in chosen:
                    if not _covered(result_name, refs):
                        continue
                    if attr not in dev.attributes:
                        return False
                    values.append(dev.attributes[attr])
                if not _all_match(values):
                    return False
            return True

        def place(i: int) -> bool:
            if i == len(requests):
                return True
            for alt in requests[i]:
                if alt.mode == "All":
                    matching = [d for d in self.devices if self._candidates(alt, d)]
                    if not matching or any(d.key in in_use for d in matching):
                        continue
                    for d in matching:
                        chosen.append((alt.result_name, d))
                        in_use.add(d.key)
                    if constraints_hold() and place(i + 1):
                        return True
                    for d in matching:
                        chosen.pop()
                        in_use.discard(d.key)
                    continue
                if pick(alt, alt.count, 0, i):
                    return True
            return False

        def pick(alt: _Alternative, left: int, start: int, i: int) -> bool:
            if left == 0:
                return place(i + 1)
            for j in range(start, len(self.devices)):
                d = self.devices[j]
                if d.key in in_use or not self._candidates(alt, d):
                    continue
                chosen.append((alt.result_name, d))
                in_use.add(d.key)
                if constraints_hold() and pick(alt, left - 1, j + 1, i):
                    return True
                chosen.pop()
                in_use.discard(d.key)
            return False

        if not place(0):
            return None
        return [Result(name, d.driver, d.pool, d.name) for name, d in chosen]


def _alternatives(request: Mapping[str, Any]) -> list[_Alternative]:
    name = request["name"]
    if ("exactly" in request) == ("firstAvailable" in request):
        raise AllocationError(f"request {name!r} must set exactly one of exactly/firstAvailable")
    if "exactly" in request:
        return [_alternative(name, request["exactly"])]
    return [_alternative(f"{name}/{sub['name']}", sub) for sub in request["firstAvailable"]]


def _alternative(result_name: str, spec: Mapping[str, Any]) -> _Alternative:
    mode = spec.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise AllocationError(f"unknown allocationMode {mode!r}")
    return _Alternative(
        result_name=result_name,
        class_name=spec["deviceClassName"],
        selectors=[s["cel"]["expression"] for s in spec.get("selectors", [])],
        mode=mode,
        count=int(spec.get("count", 1)),
        tolerations=list(spec.get("tolerations", [])),
    )


def _covered(result_name: str, refs: Sequence[str]) -> bool:
    return result_name in refs or result_name.split("/", 1)[0] in refs


def _all_match(values: Sequence[Any]) -> bool:
    if not values:
        return True
    if any(isinstance(v, list) for v in values):
        common: set[Any] | None = None
        for v in values:
            items = set(v) if isinstance(v, list) else {v}
            common = items if common is None else common & items
        return bool(common)
    first = values[0]
    return all(type(v) is type(first) and v == first for v in values)


def _tolerated(
    taints: Sequence[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]]
) -> bool:
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("operator", "Equal") == "Exists":
        return not tol.get("key") or tol["key"] == taint.get("key")
    return tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", "")
