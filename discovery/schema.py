"""JSON Schema of the inventory, derived from the dataclasses so it cannot drift.

``hack/gen_schemas.py`` writes it to ``docs/schema/inventory.schema.json``; a test
checks that the committed file equals this function's output and that every
``toposlice discover -o json`` validates against it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from discovery import model
from discovery.model import INVENTORY_SCHEMA, Inventory

SCHEMA_ID = "https://toposlice.dev/schema/inventory/v1.json"


def _doc(cls: type, name: str) -> str | None:
    """Attribute docstrings are not kept at runtime; read them from the source."""
    import ast
    import inspect

    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return None
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for i, node in enumerate(body):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == name and i + 1 < len(body):
            nxt = body[i + 1]
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                return " ".join(str(nxt.value.value).split())
    return None


def _type_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        schemas = [_type_schema(a, defs) for a in inner]
        if type(None) in args:
            schemas.append({"type": "null"})
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0], defs)}
    if origin is dict:
        key_pattern = "^-?[0-9]+$" if args[0] is int else None
        out: dict[str, Any] = {
            "type": "object",
            "additionalProperties": _type_schema(args[1], defs),
        }
        if key_pattern:
            out["propertyNames"] = {"pattern": key_pattern}
        return out
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # placeholder against recursion
            defs[name] = _class_schema(tp, defs)
        return {"$ref": f"#/$defs/{name}"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is typing.Any:
        return {}
    # ProbeState and other aliases resolve through get_type_hints; anything else is open.
    return {}


def _class_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, vars(model))
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        prop = dict(_type_schema(hints[f.name], defs))
        doc = _doc(cls, f.name)
        if doc:
            prop["description"] = doc
        props[f.name] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "properties": props}
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out


def inventory_json_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    root = _class_schema(Inventory, defs)
    root["properties"]["schema"] = {"const": INVENTORY_SCHEMA}
    root["required"] = ["schema"]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "toposlice node inventory",
        **root,
        "description": (
            "Output of `toposlice discover -o json`: facts about one node as discovery and"
            " the vendor probes found them. Fields are only ever added within a schema version."
        ),
        "$defs": dict(sorted(defs.items())),
    }
