"""A model of the upstream structured allocator (k8s.io/dynamic-resource-allocation
``structured/internal/stable``): which devices a ResourceClaim gets on one node, without a
cluster. The scorer checks its emitted claims with it; the example and scorer tests too.

Rules modelled (resource-api.md §2.5, §4.1, §5):

* pools = slices grouped by ``(driver, pool name)``, only the highest generation counts; a
  pool whose slice count at that generation (slices of every node counted) differs from
  ``resourceSliceCount`` is incomplete and not allocated from (a request for ``All``
  devices then fails); a pool with a duplicate device name is invalid and skipped;
* requests are satisfied in claim order, ``firstAvailable`` sub-requests in their order;
  results name ``<request>`` or ``<request>/<sub-request>``;
* devices are tried first-fit in pool, slice and device order, backtracking over earlier
  choices on a dead end (depth-first search);
* a device must match every selector of its DeviceClass, then of the request (CEL, run by
  :mod:`scorer.cel`); a selector error or a non-bool result aborts the claim;
* ``ExactCount`` takes ``count`` devices, ``All`` every matching device (at least one;
  fails when one of them is in use);
* ``matchAttribute``: every device of the constraint's requests (all when empty; ``req``
  covers its sub-requests) carries the attribute with one equal value (list values: the
  intersection stays non-empty); ``distinctAttribute``: values pairwise different (lists:
  disjoint); a device lacking the attribute is not chosen;
* a device is used once, never when already allocated, and never when tainted
  ``NoSchedule`` / ``NoExecute`` without a matching toleration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cel import CelDevice, CelError, device_env, evaluate

DeviceId = tuple[str, str, str]
"""``(driver, pool, device)``: a device's identity."""


class AllocationError(ValueError):
    """The claim cannot be evaluated (CEL error, unknown DeviceClass, bad request): upstream
    aborts the allocation."""


class Unsatisfiable(AllocationError):
    """The claim is valid but these slices cannot satisfy it."""


@dataclass(frozen=True)
class Result:
    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    cel: CelDevice
    taints: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    @property
    def attributes(self) -> dict[str, Any]:
        return self.cel.attributes


@dataclass
class _Alternative:
    """One way to satisfy a request: ``exactly`` or one ``firstAvailable`` sub-request."""

    result_name: str
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    tolerations: list[Mapping[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Constraint:
    refs: tuple[str, ...]
    attribute: str
    distinct: bool


def _devices(
    slices: Iterable[Mapping[str, Any]], node: str | None
) -> tuple[list[Device], list[str]]:
    """Devices of the usable pools for ``node`` in slice order, and why other pools are not
    usable (incomplete or invalid)."""
    by_pool: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in slices:
        spec = s["spec"]
        by_pool.setdefault((spec["driver"], spec["pool"]["name"]), []).append(s)
    out: list[Device] = []
    unusable: list[str] = []
    for (driver, pool), members in by_pool.items():
        newest = max(int(m["spec"]["pool"].get("generation", 0)) for m in members)
        current = [m for m in members if int(m["spec"]["pool"].get("generation", 0)) == newest]
        mine = [m for m in current if node is None or m["spec"].get("nodeName") in (None, node)]
        if not mine:
            continue  # the newest generation has nothing for this node
        if len(current) != int(current[0]["spec"]["pool"].get("resourceSliceCount", 1)):
            unusable.append(f"{driver}/{pool} is currently being updated")
            continue
        devs = [
            Device(driver, pool, d["name"], device_env(d, driver), tuple(d.get("taints") or ()))
            for m in mine
            for d in m["spec"].get("devices") or []
        ]
        if len({d.name for d in devs}) != len(devs):
            unusable.append(f"{driver}/{pool} is invalid (duplicate device names)")
            continue
        out += devs
    return out, unusable


class Allocator:
    """Allocates claims one at a time from a node's slices; CEL results are cached across
    calls, so checking several claims against the same slices is cheap."""

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        device_classes: Iterable[Mapping[str, Any]],
        node: str | None = None,
    ) -> None:
        self.devices, self.unusable_pools = _devices(slices, node)
        self.classes = {c["metadata"]["name"]: c for c in device_classes}
        self._matches: dict[tuple[str, DeviceId], bool] = {}

    def _selects(self, expression: str, dev: Device) -> bool:
        key = (expression, dev.key)
        hit = self._matches.get(key)
        if hit is None:
            try:
                hit = evaluate(expression, dev.cel)
            except CelError as exc:
                raise AllocationError(f"device {'/'.join(dev.key)}: {exc}") from exc
            self._matches[key] = hit
        return hit

    def _candidate(self, alt: _Alternative, dev: Device) -> bool:
        cls = self.classes.get(alt.class_name)
        if cls is None:
            raise AllocationError(f"device class {alt.class_name!r} not found")
        if not _tolerated(dev.taints, alt.tolerations):
            return False
        class_sel = [s["cel"]["expression"] for s in (cls.get("spec") or {}).get("selectors") or []]
        return all(self._selects(e, dev) for e in class_sel) and all(
            self._selects(e, dev) for e in alt.selectors
        )

    def _enough(self, requests: list[list[_Alternative]], in_use: set[DeviceId]) -> bool:
        """A sound shortcut, not a rule: when requests whose every alternative draws from
        one DeviceClass need more devices than that class has free, no search can succeed
        (the depth-first search would only find that out after trying every combination)."""
        demand: dict[str, int] = {}
        for alts in requests:
            classes = {a.class_name for a in alts}
            if len(classes) != 1 or any(a.mode != "ExactCount" for a in alts):
                continue
            demand[alts[0].class_name] = demand.get(alts[0].class_name, 0) + min(
                a.count for a in alts
            )
        for cls, need in demand.items():
            spec = self.classes.get(cls)
            if spec is None:
                return True  # let the search raise the unknown-class error
            sels = (spec.get("spec") or {}).get("selectors") or []
            exprs = [x["cel"]["expression"] for x in sels]
            free = 0
            try:
                for d in self.devices:
                    if d.key not in in_use and all(self._selects(e, d) for e in exprs):
                        free += 1
            except AllocationError:
                return True  # the search decides whether it meets that device
            if free < need:
                return False
        return True

    def allocate(
        self, claim_spec: Mapping[str, Any], allocated: Iterable[DeviceId] = ()
    ) -> list[Result] | None:
        """Results in request order (first-fit, as the scheduler would), or None when the
        slices cannot satisfy the claim. Raises ``AllocationError`` where upstream aborts."""
        spec = claim_spec.get("devices") or {}
        raw_requests = spec.get("requests") or []
        requests = [_alternatives(r) for r in raw_requests]
        names = tuple(r["name"] for r in raw_requests)
        constraints = [_constraint(c, names) for c in spec.get("constraints") or []]
        in_use = set(allocated)
        if not self._enough(requests, in_use):
            return None
        chosen: list[tuple[str, Device]] = []

        def fits(result_name: str, dev: Device) -> bool:
            for c in constraints:
                if not _covered(result_name, c.refs):
                    continue
                if c.attribute not in dev.attributes:
                    return False
                val = dev.attributes[c.attribute]
                for other_name, other in chosen:
                    if not _covered(other_name, c.refs):
                        continue
                    if c.distinct:
                        if _overlap(val, other.attributes[c.attribute]):
                            return False
                    elif not _equal(val, other.attributes[c.attribute]):
                        return False
            return True

        def common_value_left() -> bool:
            """List-valued matchAttribute: pairwise overlap is not enough, the intersection
            over all devices must stay non-empty."""
            for c in constraints:
                if c.distinct:
                    continue
                vals = [d.attributes[c.attribute] for n, d in chosen if _covered(n, c.refs)]
                if any(isinstance(v, list) for v in vals) and not _intersect(vals):
                    return False
            return True

        def take(name: str, dev: Device) -> bool:
            if not fits(name, dev):
                return False
            chosen.append((name, dev))
            in_use.add(dev.key)
            if common_value_left():
                return True
            drop(1)
            return False

        def drop(n: int) -> None:
            for _ in range(n):
                _, dev = chosen.pop()
                in_use.discard(dev.key)

        def place(i: int) -> bool:
            if i == len(requests):
                return True
            for alt in requests[i]:
                if alt.mode == "All":
                    if self.unusable_pools:
                        raise AllocationError(
                            f"request {alt.result_name} asks for all devices, but resource "
                            f"pool {self.unusable_pools[0]}"
                        )
                    matching = [d for d in self.devices if self._candidate(alt, d)]
                    if not matching or any(d.key in in_use for d in matching):
                        continue
                    n = 0
                    for d in matching:
                        if not take(alt.result_name, d):
                            break
                        n += 1
                    if n == len(matching) and place(i + 1):
                        return True
                    drop(n)
                    continue
                if pick(alt, alt.count, 0, i):
                    return True
            return False

        def pick(alt: _Alternative, left: int, start: int, i: int) -> bool:
            if left == 0:
                return place(i + 1)
            for j in range(start, len(self.devices)):
                d = self.devices[j]
                if d.key in in_use or not self._candidate(alt, d):
                    continue
                if not take(alt.result_name, d):
                    continue
                if pick(alt, left - 1, j + 1, i):
                    return True
                drop(1)
            return False

        if not place(0):
            return None
        return [Result(name, d.driver, d.pool, d.name) for name, d in chosen]


def allocate(
    claim_spec: Mapping[str, Any],
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    allocated: Iterable[DeviceId] = (),
    node: str | None = None,
) -> list[Result]:
    """One-shot :meth:`Allocator.allocate` that raises ``Unsatisfiable`` instead of
    returning None."""
    got = Allocator(slices, classes, node).allocate(claim_spec, allocated)
    if got is None:
        raise Unsatisfiable("cannot allocate the claim from these slices")
    return got


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
        raise AllocationError(f"request {result_name}: unknown allocationMode {mode!r}")
    return _Alternative(
        result_name=result_name,
        class_name=spec.get("deviceClassName", ""),
        selectors=[s["cel"]["expression"] for s in spec.get("selectors") or []],
        mode=mode,
        count=int(spec.get("count", 1)),
        tolerations=list(spec.get("tolerations") or []),
    )


def _constraint(c: Mapping[str, Any], names: tuple[str, ...]) -> _Constraint:
    refs = tuple(c.get("requests") or names)
    if ("matchAttribute" in c) == ("distinctAttribute" in c):
        raise AllocationError("a constraint sets exactly one of matchAttribute/distinctAttribute")
    if "matchAttribute" in c:
        return _Constraint(refs, c["matchAttribute"], distinct=False)
    return _Constraint(refs, c["distinctAttribute"], distinct=True)


def _covered(result_name: str, refs: Sequence[str]) -> bool:
    return result_name in refs or result_name.split("/", 1)[0] in refs


def _items(v: Any) -> set[Any]:
    return {(type(x), x) for x in v} if isinstance(v, list) else {(type(v), v)}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return bool(_items(a) & _items(b))
    return type(a) is type(b) and a == b


def _overlap(a: Any, b: Any) -> bool:
    return bool(_items(a) & _items(b))


def _intersect(values: Sequence[Any]) -> bool:
    common = _items(values[0])
    for v in values[1:]:
        common &= _items(v)
    return bool(common)


def _tolerated(
    taints: Sequence[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]]
) -> bool:
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue  # None and unknown effects do not keep a device away
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("operator", "Equal") == "Exists":
        return not tol.get("key") or tol["key"] == taint.get("key")
    return tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", "")
