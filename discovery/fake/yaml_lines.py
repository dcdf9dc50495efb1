"""YAML for machine files: mappings that know their line, integers that know their spelling.

Error messages must point at the line a user has to fix (``dgx.yaml:57: pci[12] ...``),
and a class code written the way ``lspci`` prints it (``0302``) must not be read the way
YAML 1.1 reads a leading zero (octal 194). PyYAML's safe loader with two constructors
changed gives both; repeated keys, which YAML silently lets the last one win, are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

__all__ = ["LineMap", "SpelledInt", "line_of", "load", "where_at"]


class LineMap(dict[Any, Any]):
    """A YAML mapping and the (1-based) line it starts on."""

    line: int = 0


class SpelledInt(int):
    """A YAML integer and its text as written (``0302``, ``0x030200``)."""

    text: str = ""


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[LineMap]:
    data = LineMap()
    data.line = node.start_mark.line + 1
    yield data
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "unhashable key",
                key_node.start_mark,
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                f"in the mapping starting on line {data.line}",
                node.start_mark,
                f"key {key!r} repeated (first on line {seen[key]}); YAML would keep only the last",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
        data[key] = loader.construct_object(value_node, deep=True)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    value: int = loader.construct_yaml_int(node)
    text = str(node.value)
    if len(text) > 1 and text[0] == "0":
        # Only hex/octal-looking spellings carry their text (``0302``, ``0x0302``); the
        # loader turns every integer it hands on into a plain int.
        spelled = SpelledInt(value)
        spelled.text = text
        return spelled
    return value


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load(text: str) -> Any:
    """Like ``yaml.safe_load``; mappings are :class:`LineMap`, integers :class:`SpelledInt`."""
    return yaml.load(text, Loader=_Loader)


def line_of(data: Any) -> int | None:
    """The line a mapping came from, when it was read by :func:`load`."""
    line = getattr(data, "line", 0)
    return line if isinstance(line, int) and line > 0 else None


def where_at(source: str, data: Any) -> str:
    """``file:LINE`` for a mapping read from ``file``, else just ``file``."""
    line = line_of(data)
    return f"{source}:{line}" if line is not None else source
