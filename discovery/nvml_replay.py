"""NVML answers as JSON: record what the nvidia probe asked a ``pynvml`` module, replay it.

A gathered archive (``toposlice gather``) must replay the nvidia probe on a machine
without the GPUs or the driver. :class:`RecordingNvml` stands in front of the real
module (or any pynvml-compatible object, such as the fake NVML) and logs every call
the probe makes with its result or its NVML error; :class:`ReplayNvml` is a
pynvml-compatible object that answers the same calls from that log. The probe makes
the same calls in the same order on replay, so it reports the same GPUs, links,
fabric state and warnings.

Format (``nvml.json`` in an archive)::

    {"format": "toposlice.nvml-replay/v1", "unavailable": null,
     "attributes": ["NVMLError", "c_nvmlGpuFabricInfo_v3_t", "nvmlInit", ...],
     "calls": [{"fn": "nvmlDeviceGetName", "args": [{"h": 0}], "result": "NVIDIA H100"},
               {"fn": "nvmlDeviceGetMigMode", "args": [{"h": 0}],
                "error": 3, "text": "Not Supported"}, ...]}

Values: JSON scalars and lists as they are; ``{"b": hex}`` bytes; ``{"t": [...]}``
tuples; ``{"o": {attr: value}}`` structs (what ``nvmlDeviceGetPciInfo`` returns, and
the fabric-info struct the caller passed, under ``"out"``); ``{"h": n}`` device handles.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = [
    "NVML_REPLAY_FORMAT",
    "RecordingNvml",
    "ReplayNVMLError",
    "ReplayNvml",
    "decode_value",
    "encode_value",
]

NVML_REPLAY_FORMAT = "toposlice.nvml-replay/v1"
_OUT_FIELDS = ("version", "clusterUuid", "status", "cliqueId", "state", "healthMask")
_OUT_FIELDS_V3 = (*_OUT_FIELDS, "healthSummary")


class ReplayNVMLError(Exception):
    """An NVML error as recorded: the return code in ``.value`` and the original text."""

    def __init__(self, value: int | None, text: str) -> None:
        super().__init__(text)
        self.value = value
        self.text = text

    def __str__(self) -> str:
        return self.text


class _Handle:
    """A replayed device handle (opaque to the probe, like pynvml's pointers)."""

    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token


class _Struct:
    """A replayed struct (``c_nvmlPciInfo_t``, memory info, fabric info): plain attributes."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def encode_value(value: Any, handles: dict[int, int] | None = None) -> Any:
    """A pynvml result as JSON (see the module docstring)."""
    if handles is not None and id(value) in handles:
        return {"h": handles[id(value)]}
    if isinstance(value, _Handle):
        return {"h": value.token}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray):
        return {"b": bytes(value).hex()}
    if isinstance(value, tuple):
        return {"t": [encode_value(v, handles) for v in value]}
    if isinstance(value, list):
        return [encode_value(v, handles) for v in value]
    if isinstance(value, ctypes.Array):
        return [encode_value(v, handles) for v in value]
    fields = getattr(type(value), "_fields_", None)
    if isinstance(fields, list | tuple):
        return {"o": {f[0]: encode_value(getattr(value, f[0]), handles) for f in fields}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            "o": {
                f.name: encode_value(getattr(value, f.name), handles)
                for f in dataclasses.fields(value)
            }
        }
    if isinstance(value, _Struct):
        return {"o": {k: encode_value(v, handles) for k, v in vars(value).items()}}
    return str(value)


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if "b" in value:
            return bytes.fromhex(value["b"])
        if "t" in value:
            return tuple(decode_value(v) for v in value["t"])
        if "h" in value:
            return _Handle(int(value["h"]))
        if "o" in value:
            return _Struct(**{k: decode_value(v) for k, v in value["o"].items()})
    return value


def _out_struct(arg: Any) -> Any | None:
    """The struct behind a ``ctypes.byref`` argument (or a plain output object)."""
    target = getattr(arg, "_obj", None)
    if target is not None:
        return target
    if isinstance(arg, ctypes.Structure | _Struct) or hasattr(arg, "clusterUuid"):
        return arg
    return None


class RecordingNvml:
    """Proxy for a pynvml module that logs each ``nvml*`` call the probe makes.

    ``load`` returns the module; it is called on first use, so a host whose sysfs shows
    no NVIDIA GPU never imports pynvml. When it raises, the message becomes
    :attr:`toposlice_unavailable` and replays report the probe unavailable the same way.
    """

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._module: Any = None
        self._loaded = False
        self.unavailable: str | None = None
        self.attributes: set[str] = set()
        self.calls: list[dict[str, Any]] = []
        self._handles: dict[int, int] = {}
        self._keep: list[Any] = []

    def _real(self) -> Any:
        if not self._loaded:
            self._loaded = True
            try:
                self._module = self._load()
            except Exception as exc:
                self.unavailable = str(exc)
        return self._module

    @property
    def toposlice_unavailable(self) -> str | None:
        self._real()
        return self.unavailable

    @property
    def used(self) -> bool:
        """Whether the probe got as far as NVML (else there is nothing to archive)."""
        return self._loaded

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        module = self._real()
        if module is None or not hasattr(module, name):
            raise AttributeError(name)
        value = getattr(module, name)
        self.attributes.add(name)
        if name.startswith("nvml") and callable(value):
            return self._wrap(name, value)
        return value

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            entry: dict[str, Any] = {
                "fn": name,
                "args": [
                    {"out": True} if _out_struct(a) is not None else encode_value(a, self._handles)
                    for a in args
                ],
            }
            self.calls.append(entry)
            try:
                result = fn(*args)
            except Exception as exc:
                code = getattr(exc, "value", None)
                entry["error"] = code if isinstance(code, int) else None
                entry["text"] = str(exc)
                raise
            if name.startswith("nvmlDeviceGetHandle"):
                self._keep.append(result)
                self._handles[id(result)] = len(self._handles)
            entry["result"] = encode_value(result, self._handles)
            for arg in args:
                out = _out_struct(arg)
                if out is not None:
                    entry["out"] = {
                        f: encode_value(getattr(out, f), self._handles)
                        for f in _OUT_FIELDS_V3
                        if hasattr(out, f)
                    }
            return result

        return call

    def to_json(self) -> dict[str, Any]:
        return {
            "format": NVML_REPLAY_FORMAT,
            "unavailable": self.unavailable,
            "attributes": sorted(self.attributes),
            "calls": self.calls,
        }


class ReplayNvml:
    """A pynvml-compatible object answering from a :class:`RecordingNvml` log."""

    NVMLError = ReplayNVMLError

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("format") != NVML_REPLAY_FORMAT:
            raise ValueError(
                f"unsupported NVML replay format {data.get('format')!r} (want {NVML_REPLAY_FORMAT})"
            )
        self.toposlice_unavailable: str | None = data.get("unavailable")
        self._attributes = set(data.get("attributes") or [])
        self._answers: dict[str, list[dict[str, Any]]] = {}
        for entry in data.get("calls") or []:
            key = self._key(entry["fn"], entry.get("args") or [])
            self._answers.setdefault(key, []).append(entry)
        self._used: dict[str, int] = {}

    @staticmethod
    def _key(fn: str, args: list[Any]) -> str:
        import json

        return json.dumps([fn, args], sort_keys=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._attributes:
            raise AttributeError(name)
        if name.startswith("nvml"):
            return lambda *args: self._answer(name, args)
        # Struct types the real module had: the probe only instantiates them.
        return _Struct

    def _answer(self, fn: str, args: tuple[Any, ...]) -> Any:
        encoded = [{"out": True} if _out_struct(a) is not None else encode_value(a) for a in args]
        key = self._key(fn, encoded)
        answers = self._answers.get(key)
        if not answers:
            raise ReplayNVMLError(999, f"{fn}: not in the gathered NVML answers")
        n = self._used.get(key, 0)
        self._used[key] = n + 1
        entry = answers[min(n, len(answers) - 1)]
        if "text" in entry:
            raise ReplayNVMLError(entry.get("error"), entry["text"])
        for arg in args:
            out = _out_struct(arg)
            if out is not None:
                for attr, value in (entry.get("out") or {}).items():
                    setattr(out, attr, decode_value(value))
        return decode_value(entry.get("result"))
