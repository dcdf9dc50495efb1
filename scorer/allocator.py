"""A model of the upstream structured allocator (k8s.io/dynamic-resource-allocation
``structured/internal/stable``), for checking that an emitted claim lands where the scorer
meant it to — without a cluster.

Rules modelled (resource-api.md §2.5, §4.1, §5):

* pools = slices grouped by (driver, pool name); only the highest generation counts; a pool
  whose slice count at that generation differs from ``resourceSliceCount`` is incomplete and
  not allocated from;
* devices are tried first-fit in pool order, slice order, device order;
* requests are satisfied in claim order; ``firstAvailable`` sub-requests in their order;
  ``ExactCount`` takes ``count`` devices, ``All`` every matching device (and fails when one
  of them is in use);
* a device must match its DeviceClass's selectors and the request's selectors (CEL); an
  evaluation error aborts the claim;
* ``matchAttribute`` constraints: every device of the constraint's requests (all requests
  when empty) must carry the attribute, with one equal value; ``distinctAttribute``: values
  pairwise different;
* a device already allocated (to another claim, or earlier in this one) is never reused;
* on a dead end, backtrack over earlier choices (depth-first search).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .cel import device_env, evaluate

STANDARD = "resource.kubernetes.io"


class AllocationError(ValueError):
    pass


@dataclass(frozen=True)
class Result:
    request: str
    driver: str
    pool: str
    device: str


@dataclass
class _Dev:
    driver: str
    pool: str
    name: str
    raw: dict[str, Any]
    env: dict[str, Any]

    def attr(self, qualified: str) -> Any:
        domain, _, ident = qualified.rpartition("/")
        return self.env["attributes"].get(domain or self.driver, {}).get(ident, _MISSING)


_MISSING = object()


def pool_devices(slices: Iterable[dict[str, Any]], node: str | None = None) -> list[_Dev]:
    """Usable devices in allocation order (complete pools, newest generation)."""
    pools: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if node is not None and spec.get("nodeName") not in (None, node):
            continue
        key = (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
        pools.setdefault(key, []).append(s)
    out: list[_Dev] = []
    for (driver, pool), members in pools.items():
        gen = max(int(m["spec"]["pool"].get("generation", 0)) for m in members)
        current = [m for m in members if int(m["spec"]["pool"].get("generation", 0)) == gen]
        want = int(current[0]["spec"]["pool"].get("resourceSliceCount", 1))
        if len(current) != want:
            continue
        names: set[str] = set()
        for m in current:
            for d in m["spec"].get("devices") or []:
                if d["name"] in names:
                    raise AllocationError(f"pool {pool}: duplicate device {d['name']}")
                names.add(d["name"])
                out.append(_Dev(driver, pool, d["name"], d, device_env(d, driver)))
    return out


@dataclass
class _Slot:
    request: str
    """Name as it appears in results (``req`` or ``req/sub``)."""
    group: str
    """The top-level request name (constraints refer to it)."""
    selectors: list[str]
    index: int
    """Position within the request (ExactCount slots take increasing device indexes)."""


def _selectors(spec: dict[str, Any], classes: dict[str, dict[str, Any]]) -> list[str]:
    cls_name = spec.get("deviceClassName")
    cls = classes.get(cls_name or "")
    if cls is None:
        raise AllocationError(f"device class {cls_name!r} not found")
    out = [s["cel"]["expression"] for s in (cls.get("spec") or {}).get("selectors") or []]
    out += [s["cel"]["expression"] for s in spec.get("selectors") or []]
    return out


def allocate(
    claim_spec: dict[str, Any],
    slices: Iterable[dict[str, Any]],
    classes: Iterable[dict[str, Any]],
    allocated: Iterable[str] = (),
    node: str | None = None,
) -> list[Result]:
    """Allocate ``claim_spec`` (a ResourceClaimSpec: ``{devices: {requests, constraints}}``)
    from the node's slices; ``allocated`` holds ``driver/pool/device`` ids already in use.
    Raises ``AllocationError`` when the claim cannot be satisfied."""
    devices = pool_devices(slices, node)
    cls_by_name = {c["metadata"]["name"]: c for c in classes}
    in_use = set(allocated)
    spec = claim_spec.get("devices") or {}
    requests = spec.get("requests") or []
    constraints = spec.get("constraints") or []
    # Each top-level request becomes a list of alternatives; each alternative a slot list.
    alternatives: list[list[list[_Slot]]] = []
    for r in requests:
        name = r["name"]
        subs = (
            [(f"{name}/{s['name']}", s) for s in r["firstAvailable"]]
            if r.get("firstAvailable")
            else [(name, r.get("exactly") or {})]
        )
        alts: list[list[_Slot]] = []
        for rname, sub in subs:
            sels = _selectors(sub, cls_by_name)
            mode = sub.get("allocationMode", "ExactCount")
            if mode == "All":
                matching = [d for d in devices if _matches(d, sels)]
                if not matching or any(_id(d) in in_use for d in matching):
                    continue
                alts.append([_Slot(rname, name, sels, i) for i in range(len(matching))])
            elif mode == "ExactCount":
                count = int(sub.get("count", 1))
                alts.append([_Slot(rname, name, sels, i) for i in range(count)])
            else:
                raise AllocationError(f"request {rname}: unknown allocationMode {mode!r}")
        alternatives.append(alts)

    chosen: list[tuple[_Slot, _Dev]] = []
    used = set(in_use)
    memo: dict[tuple[int, tuple[str, ...]], bool] = {}

    def matches(idx: int, selectors: list[str]) -> bool:
        key = (idx, tuple(selectors))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _matches(devices[idx], selectors)
        return hit

    def fits(slot: _Slot, dev: _Dev) -> bool:
        for c in constraints:
            reqs = c.get("requests") or []
            if reqs and slot.group not in reqs and slot.request not in reqs:
                continue
            others = [d for s, d in chosen if not reqs or s.group in reqs or s.request in reqs]
            if "matchAttribute" in c:
                val = dev.attr(c["matchAttribute"])
                if val is _MISSING:
                    return False
                if any(o.attr(c["matchAttribute"]) != val for o in others):
                    return False
            if "distinctAttribute" in c:
                val = dev.attr(c["distinctAttribute"])
                if val is _MISSING or any(o.attr(c["distinctAttribute"]) == val for o in others):
                    return False
        return True

    def solve_request(ri: int) -> bool:
        if ri == len(alternatives):
            return True
        for slots in alternatives[ri]:
            if solve_slots(ri, slots, 0, -1):
                return True
        return False

    def solve_slots(ri: int, slots: list[_Slot], si: int, last: int) -> bool:
        if si == len(slots):
            return solve_request(ri + 1)
        slot = slots[si]
        for idx in range(last + 1, len(devices)):
            dev = devices[idx]
            if _id(dev) in used or not matches(idx, slot.selectors) or not fits(slot, dev):
                continue
            used.add(_id(dev))
            chosen.append((slot, dev))
            if solve_slots(ri, slots, si + 1, idx):
                return True
            chosen.pop()
            used.discard(_id(dev))
        return False

    if not solve_request(0):
        raise AllocationError("cannot allocate all claims")
    return [Result(s.request, d.driver, d.pool, d.name) for s, d in chosen]


def _id(d: _Dev) -> str:
    return f"{d.driver}/{d.pool}/{d.name}"


def _matches(d: _Dev, selectors: list[str]) -> bool:
    return all(evaluate(expr, d.env) for expr in selectors)
