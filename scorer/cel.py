"""DRA device selectors evaluated by a real CEL implementation (``common-expression-language``,
Python bindings of the Rust ``cel`` crate), with the ``device`` variable the scheduler builds.

The library does the language; this module only supplies what the Kubernetes DRA
environment adds on top (resource-api.md §5):

* ``device.driver``, ``device.attributes["<domain>"].<id>``, ``device.capacity["<domain>"].<id>``
  and ``device.allowMultipleAllocations``; unqualified names live in the driver's domain,
  and an unknown domain is an empty map (the domains an expression names are filled in, as
  the Rust map lookup would otherwise fail where upstream yields ``{}``);
* ``quantity()`` / ``isQuantity()`` and ``semver()`` / ``isSemver()`` with ``compareTo``,
  ``isGreaterThan``, ``isLessThan`` (plus ``asInteger``, ``sign``, ``major`` / ``minor`` /
  ``patch``), and the list-attribute ``includes()``. Quantities and versions travel as
  one-key maps (``{"quantity": bytes}``, ``{"semver": [major, minor, patch, pre]}``) because
  the bindings pass only CEL's own types; ``==`` between two of them compares values and
  ``<`` on them is, as upstream, no overload.

Programs are compiled once per expression and each device's CEL context is built once, so
re-checking a claim costs a few microseconds per (selector, device).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import cel

from .request import parse_quantity


class CelError(ValueError):
    """A selector that does not compile, fails at runtime or yields no bool: upstream aborts
    the claim's allocation on any of these."""


_QUANTITY = "quantity"
_SEMVER = "semver"
_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+.*)?$"
)
_DOMAIN_IN_CEL = re.compile(r"""device\.(?:attributes|capacity)\[\s*["']([^"']+)["']\s*\]""")
_VALUE_KEYS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")


def quantity(text: str) -> dict[str, int]:
    try:
        return {_QUANTITY: parse_quantity(text)}
    except ValueError as exc:
        raise CelError(str(exc)) from exc


def semver(text: str) -> dict[str, list[Any]]:
    m = _SEMVER_RE.match(str(text))
    if not m:
        raise CelError(f"not a semver: {text!r}")
    return {_SEMVER: [int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4) or ""]}


def _kind(v: Any) -> str | None:
    if isinstance(v, dict) and len(v) == 1:
        key = next(iter(v))
        if key in (_QUANTITY, _SEMVER):
            return str(key)
    return None


def _order_key(v: Any) -> tuple[Any, ...]:
    if _kind(v) == _QUANTITY:
        return (v[_QUANTITY],)
    major, minor, patch, pre = v[_SEMVER]
    # A release sorts after its pre-releases (semver 2.0.0 §11, simplified to text order).
    return (major, minor, patch, pre == "", pre)


def compare_to(a: Any, b: Any) -> int:
    kind = _kind(a)
    if kind is None or kind != _kind(b):
        raise CelError("no such overload: compareTo needs two quantities or two semvers")
    ka, kb = _order_key(a), _order_key(b)
    return (ka > kb) - (ka < kb)


def _semver_part(i: int) -> Callable[[Any], int]:
    def part(v: Any) -> int:
        if _kind(v) != _SEMVER:
            raise CelError("no such overload: not a semver")
        return int(v[_SEMVER][i])

    return part


def _as_integer(v: Any) -> int:
    if _kind(v) != _QUANTITY:
        raise CelError("no such overload: asInteger needs a quantity")
    return int(v[_QUANTITY])


def _includes(attr: Any, value: Any) -> bool:
    return value in attr if isinstance(attr, list) else attr == value


def _is(parse: Callable[[str], Any]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            parse(text)
        except CelError:
            return False
        return True

    return check


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": quantity,
    "isQuantity": _is(quantity),
    "semver": semver,
    "isSemver": _is(semver),
    "compareTo": compare_to,
    "isGreaterThan": lambda a, b: compare_to(a, b) > 0,
    "isLessThan": lambda a, b: compare_to(a, b) < 0,
    "asInteger": _as_integer,
    "sign": lambda q: (_as_integer(q) > 0) - (_as_integer(q) < 0),
    "major": _semver_part(0),
    "minor": _semver_part(1),
    "patch": _semver_part(2),
    "includes": _includes,
}


@dataclass(frozen=True)
class Selector:
    expression: str
    program: Any
    domains: frozenset[str]
    """Domains the expression indexes by literal: present (maybe empty) in every device."""


@lru_cache(maxsize=4096)
def compile_selector(expression: str) -> Selector:
    try:
        program = cel.compile(expression)
    except Exception as exc:
        raise CelError(f"CEL selector does not compile: {expression!r}: {exc}") from exc
    return Selector(expression, program, frozenset(_DOMAIN_IN_CEL.findall(expression)))


def attribute_value(attr: Mapping[str, Any]) -> Any:
    """The value of an API DeviceAttribute (exactly one key is set), as constraints compare it."""
    keys = [k for k in _VALUE_KEYS if k in attr]
    if len(keys) != 1:
        raise CelError(f"device attribute {dict(attr)!r} must set exactly one value")
    return attr[keys[0]]


def qualify(name: str, driver: str) -> str:
    """Unqualified attribute names live in the driver's domain."""
    return name if "/" in name else f"{driver}/{name}"


@dataclass
class CelDevice:
    """One ResourceSlice device as selectors and constraints see it. Its CEL contexts are
    built lazily and, like the library's ``Context``, are not for sharing across threads."""

    driver: str
    attributes: dict[str, Any]
    """Fully-qualified name -> plain value (int, bool, str or list; versions as text)."""
    variable: dict[str, Any]
    """The CEL ``device`` variable."""
    _contexts: dict[frozenset[str], Any] = field(default_factory=dict, repr=False)

    def context(self, domains: frozenset[str]) -> Any:
        missing = frozenset(d for d in domains if d not in self.variable["attributes"]) | frozenset(
            d for d in domains if d not in self.variable["capacity"]
        )
        ctx = self._contexts.get(missing)
        if ctx is None:
            var = self.variable
            if missing:
                var = {
                    **var,
                    "attributes": {**{d: {} for d in missing}, **var["attributes"]},
                    "capacity": {**{d: {} for d in missing}, **var["capacity"]},
                }
            ctx = self._contexts[missing] = cel.Context(
                variables={"device": var}, functions=FUNCTIONS
            )
        return ctx


def device_env(device: Mapping[str, Any], driver: str) -> CelDevice:
    """The CEL view of a ResourceSlice device (API JSON form) published by ``driver``."""
    plain: dict[str, Any] = {}
    attrs: dict[str, dict[str, Any]] = {}
    for name, raw in (device.get("attributes") or {}).items():
        full = qualify(name, driver)
        value = attribute_value(raw)
        plain[full] = value
        if "version" in raw:
            value = semver(value)
        elif "versions" in raw:
            value = [semver(v) for v in value]
        domain, ident = full.rsplit("/", 1)
        attrs.setdefault(domain, {})[ident] = value
    caps: dict[str, dict[str, Any]] = {}
    for name, raw in (device.get("capacity") or {}).items():
        domain, ident = qualify(name, driver).rsplit("/", 1)
        caps.setdefault(domain, {})[ident] = quantity(str(raw["value"]))
    variable = {
        "driver": driver,
        "attributes": attrs,
        "capacity": caps,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }
    return CelDevice(driver, plain, variable)


def evaluate(expression: str, device: CelDevice) -> bool:
    """Run one selector on one device; anything but a bool result is a ``CelError``."""
    sel = compile_selector(expression)
    try:
        result = sel.program.execute(device.context(sel.domains))
    except Exception as exc:
        raise CelError(f"CEL selector {expression!r} failed on a device: {exc}") from exc
    if not isinstance(result, bool):
        raise CelError(f"CEL selector {expression!r} returned {result!r}, not a bool")
    return result
