"""The subset of CEL that DRA device selectors use, evaluated against one device.

Enough for the DeviceClasses and the claims the scorer emits (and most hand-written
selectors): literals and lists, ``device.driver``, ``device.attributes["domain"].name``,
``device.capacity["domain"].name``, ``== != < <= > >= in``, ``&& || !``, ``? :``,
arithmetic on ints, ``has()``, ``quantity("40Gi")`` with ``compareTo`` /
``isGreaterThan`` / ``isLessThan``, ``semver("1.2.3")`` with the same, and string
``startsWith`` / ``endsWith`` / ``contains`` / ``matches``. Anything else is a
``CelError`` — as in the scheduler, an error aborts the claim's allocation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .request import parse_quantity


class CelError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class Quantity:
    value: float


@dataclass(frozen=True, order=True)
class Semver:
    parts: tuple[int, int, int]


def _cmp(a: Any, b: Any) -> int:
    if type(a) is not type(b):
        raise CelError(f"compareTo between {type(a).__name__} and {type(b).__name__}")
    return (a > b) - (a < b)


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<num>\d+(?:\.\d+)?)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>&&|\|\||==|!=|<=|>=|[<>!?:.,()\[\]+\-*/%])
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
)""",
    re.VERBOSE,
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise CelError(f"cannot parse CEL at {text[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    out.append(("end", ""))
    return out


# AST nodes are tuples: (op, ...).
Node = tuple[Any, ...]


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i]

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.toks[self.i]
        if value is not None and tok[1] != value:
            raise CelError(f"expected {value!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.ternary()
        if self.peek()[0] != "end":
            raise CelError(f"unexpected {self.peek()[1]!r}")
        return node

    def ternary(self) -> Node:
        cond = self.binary(0)
        if self.peek()[1] == "?":
            self.take("?")
            a = self.ternary()
            self.take(":")
            b = self.ternary()
            return ("?:", cond, a, b)
        return cond

    _LEVELS: tuple[tuple[str, ...], ...] = (
        ("||",),
        ("&&",),
        ("==", "!=", "<", "<=", ">", ">=", "in"),
        ("+", "-"),
        ("*", "/", "%"),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek()[1] in self._LEVELS[level] and self.peek()[0] in ("op", "id"):
            op = self.take()[1]
            right = self.binary(level + 1)
            left = (op, left, right)
        return left

    def unary(self) -> Node:
        if self.peek()[1] in ("!", "-") and self.peek()[0] == "op":
            op = self.take()[1]
            return ("neg" if op == "-" else "!", self.unary())
        return self.postfix(self.primary())

    def primary(self) -> Node:
        kind, val = self.take()
        if kind == "num":
            return ("lit", float(val) if "." in val else int(val))
        if kind == "str":
            body = val[1:-1]
            return ("lit", re.sub(r"\\(.)", r"\1", body))
        if kind == "id":
            if val in ("true", "false"):
                return ("lit", val == "true")
            if val == "null":
                return ("lit", None)
            if self.peek()[1] == "(":
                return ("call", val, self.args())
            return ("var", val)
        if val == "(":
            node = self.ternary()
            self.take(")")
            return node
        if val == "[":
            items: list[Node] = []
            while self.peek()[1] != "]":
                items.append(self.ternary())
                if self.peek()[1] == ",":
                    self.take(",")
            self.take("]")
            return ("list", items)
        raise CelError(f"unexpected {val!r}")

    def args(self) -> list[Node]:
        self.take("(")
        out: list[Node] = []
        while self.peek()[1] != ")":
            out.append(self.ternary())
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return out

    def postfix(self, node: Node) -> Node:
        while True:
            val = self.peek()[1]
            if val == ".":
                self.take(".")
                name = self.take()[1]
                if self.peek()[1] == "(":
                    node = ("method", node, name, self.args())
                else:
                    node = ("field", node, name)
            elif val == "[":
                self.take("[")
                idx = self.ternary()
                self.take("]")
                node = ("index", node, idx)
            else:
                return node


_COMPILED: dict[str, Node] = {}


def compile_cel(text: str) -> Node:
    node = _COMPILED.get(text)
    if node is None:
        node = _Parser(text).parse()
        _COMPILED[text] = node
    return node


def device_env(device: dict[str, Any], driver: str) -> dict[str, Any]:
    """The CEL ``device`` variable for a ResourceSlice device (API JSON form)."""
    attrs: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, _, ident = name.rpartition("/")
        v: Any = None
        for key in ("int", "bool", "string"):
            if key in value:
                v = value[key]
        if "version" in value:
            v = _semver(value["version"])
        attrs.setdefault(domain or driver, {})[ident] = v
    caps: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, _, ident = name.rpartition("/")
        caps.setdefault(domain or driver, {})[ident] = Quantity(parse_quantity(value["value"]))
    return {"driver": driver, "attributes": attrs, "capacity": caps}


def _semver(text: str) -> Semver:
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)", str(text))
    if not m:
        raise CelError(f"not a semver: {text!r}")
    return Semver((int(m.group(1)), int(m.group(2)), int(m.group(3))))


def evaluate(text: str, device: dict[str, Any]) -> bool:
    """``device`` is :func:`device_env`'s output. Non-bool results are errors."""
    result = _eval(compile_cel(text), {"device": device})
    if not isinstance(result, bool):
        raise CelError(f"expression does not yield a bool: {text!r}")
    return result


def _eval(node: Node, env: dict[str, Any]) -> Any:
    op = node[0]
    if op == "lit":
        return node[1]
    if op == "list":
        return [_eval(x, env) for x in node[1]]
    if op == "var":
        if node[1] not in env:
            raise CelError(f"undeclared reference {node[1]!r}")
        return env[node[1]]
    if op == "field":
        base = _eval(node[1], env)
        if not isinstance(base, dict) or node[2] not in base:
            raise CelError(f"no such key: {node[2]}")
        return base[node[2]]
    if op == "index":
        base, idx = _eval(node[1], env), _eval(node[2], env)
        if isinstance(base, dict):
            # Unknown domains are empty maps (CEL env of DRA).
            return base.get(idx, {}) if isinstance(idx, str) else base[idx]
        if isinstance(base, list) and isinstance(idx, int):
            return base[idx]
        raise CelError("bad index")
    if op == "&&":
        return bool(_eval(node[1], env)) and bool(_eval(node[2], env))
    if op == "||":
        return bool(_eval(node[1], env)) or bool(_eval(node[2], env))
    if op == "!":
        return not _eval(node[1], env)
    if op == "neg":
        return -_eval(node[1], env)
    if op == "?:":
        return _eval(node[2], env) if _eval(node[1], env) else _eval(node[3], env)
    if op == "call":
        if node[1] == "has":
            return _call("has", [], node[2], env)
        return _call(node[1], [_eval(a, env) for a in node[2]], node[2], env)
    if op == "method":
        return _method(_eval(node[1], env), node[2], [_eval(a, env) for a in node[3]])
    a, b = _eval(node[1], env), _eval(node[2], env)
    if op == "in":
        return a in b
    if op in ("==", "!="):
        return (a == b) == (op == "==")
    if op in ("<", "<=", ">", ">="):
        if type(a) is not type(b) and not (
            isinstance(a, (int, float)) and isinstance(b, (int, float))
        ):
            raise CelError(f"no such overload: {type(a).__name__} {op} {type(b).__name__}")
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a // b if isinstance(a, int) and isinstance(b, int) else a / b
    if op == "%":
        return a % b
    raise CelError(f"unsupported operator {op!r}")


def _call(name: str, args: list[Any], raw: list[Node], env: dict[str, Any]) -> Any:
    if name == "quantity":
        return Quantity(parse_quantity(args[0]))
    if name == "semver":
        return _semver(args[0])
    if name == "has":
        node = raw[0]
        if node[0] != "field":
            raise CelError("has() needs a field selection")
        base = _eval(node[1], env)
        return isinstance(base, dict) and node[2] in base
    if name == "size":
        return len(args[0])
    raise CelError(f"unsupported function {name!r}")


def _method(base: Any, name: str, args: list[Any]) -> Any:
    if name == "compareTo":
        return _cmp(base, args[0])
    if name == "isGreaterThan":
        return _cmp(base, args[0]) > 0
    if name == "isLessThan":
        return _cmp(base, args[0]) < 0
    if isinstance(base, str):
        if name == "startsWith":
            return base.startswith(args[0])
        if name == "endsWith":
            return base.endswith(args[0])
        if name == "contains":
            return args[0] in base
        if name == "matches":
            return re.search(args[0], base) is not None
    raise CelError(f"unsupported method {name!r}")
