"""The ``switch`` shorthand of machine files: one PCIe switch instead of a dozen bridges.

Writing "GPU and NIC behind one PCIe switch under root port X" by hand takes an upstream
port, one downstream port per device and a bus number for each -- about ten entries per
GPU complex, eighty per 8-GPU machine, each a chance for a typo. In the ``pci`` list::

    - switch:
        parent: "0000:15:01.0"           # the root port (or downstream port) above it
        ports:                           # one downstream port per entry
          - {bdf: "0000:18:00.0", type: cx7_ib, net: [ibp24s0], rdma: [mlx5_0]}
          - switch:                      # a switch below a downstream port
              ports: [{bdf: "0000:1b:00.0", type: h100}]

expands into ordinary device entries. Bus numbers follow Linux's depth-first
enumeration: the upstream port takes the first bus after its parent's (or ``bdf``), its
internal bus the next one, and downstream port ``k`` is device ``k`` on that internal
bus; an endpoint without ``bdf`` gets the next free bus. So endpoints copied from a real
``lspci`` usually get the very bridge numbers the real machine has.
"""

from __future__ import annotations

from typing import Any

from discovery.fake.yaml_lines import where_at

__all__ = ["DEFAULT_SWITCH_PORT", "expand_pci"]

#: Ports when the file names no ``up``/``down`` template: a Broadcom PEX switch port.
DEFAULT_SWITCH_PORT: dict[str, Any] = {
    "class": 0x060400,
    "vendor": 0x1000,
    "device": 0xC030,
    "driver": "pcieport",
}
_SWITCH_KEYS = {"parent", "bdf", "up", "down", "ports"}
_MAX_PORTS = 32


def expand_pci(raw: list[Any], source: str) -> list[tuple[Any, str]]:
    """(device entry, where it was written) for every ``pci`` entry, switches expanded."""
    out: list[tuple[Any, str]] = []
    for i, entry in enumerate(raw):
        where = f"{where_at(source, entry)}: pci[{i}]"
        if isinstance(entry, dict) and "switch" in entry:
            if len(entry) != 1:
                extra = sorted(str(k) for k in entry if k != "switch")
                raise ValueError(
                    f"{where}: a switch entry holds only 'switch:' (found {extra[0]!r})"
                )
            sw = entry["switch"]
            sw_where = f"{where_at(source, sw)}: pci[{i}].switch"
            parent = _require_map(sw, sw_where).get("parent")
            if not isinstance(parent, str):
                raise ValueError(f"{sw_where}: missing required key 'parent' (the bridge above it)")
            _expand(sw, sw_where, parent, _bus(parent, f"{sw_where}: parent") + 1, source, out)
        else:
            out.append((entry, where))
    return out


def _require_map(data: Any, where: str) -> dict[Any, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: want a mapping, got {type(data).__name__}")
    return data


def _split(bdf: str, where: str) -> tuple[str, int, int, int]:
    try:
        dom, bus, rest = bdf.strip().split(":")
        dev, fn = rest.split(".")
        return dom, int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        raise ValueError(f"{where}: bad PCI bus id {bdf!r} (want 'dddd:bb:dd.f', hex)") from None


def _bus(bdf: Any, where: str) -> int:
    if not isinstance(bdf, str):
        raise ValueError(f"{where}: bad PCI bus id {bdf!r} (want a string 'dddd:bb:dd.f')")
    return _split(bdf, where)[1]


def _port(fields: Any, bdf: str, parent: str, where: str) -> dict[str, Any]:
    """A switch port entry: the file's ``up``/``down`` fields, else the default port."""
    given = dict(_require_map(fields, where)) if fields is not None else {}
    for key in ("bdf", "parent", "physfn"):
        if key in given:
            raise ValueError(f"{where}: {key!r} is set by the switch, not in its port template")
    base = {} if "type" in given or "class" in given else dict(DEFAULT_SWITCH_PORT)
    return {**base, **given, "bdf": bdf, "parent": parent}


def _expand(
    sw: Any, where: str, parent: str, next_bus: int, source: str, out: list[tuple[Any, str]]
) -> int:
    """Append the switch's entries; the next free bus number after its subtree."""
    data = _require_map(sw, where)
    unknown = sorted(str(k) for k in data if k not in _SWITCH_KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_SWITCH_KEYS))})"
        )
    dom = parent.split(":")[0].lower().zfill(4)
    up_bus = _bus(data["bdf"], f"{where}: bdf") if "bdf" in data else next_bus
    up = f"{dom}:{up_bus:02x}:00.0"
    internal = up_bus + 1
    next_bus = internal + 1
    ports = data.get("ports")
    if not isinstance(ports, list) or not ports:
        raise ValueError(f"{where}: 'ports' must list what sits below each downstream port")
    if len(ports) > _MAX_PORTS:
        raise ValueError(f"{where}: {len(ports)} ports; a bus has at most {_MAX_PORTS} devices")
    if internal > 0xFF:
        raise ValueError(f"{where}: no bus numbers left below {parent} (bus {internal:#x} > 0xff)")
    out.append((_port(data.get("up"), up, parent, f"{where}: up"), f"{where} (upstream port)"))
    for k, port in enumerate(ports):
        pwhere = f"{where_at(source, port)}: {where.rsplit(': ', 1)[-1]}.ports[{k}]"
        down = f"{dom}:{internal:02x}:{k:02x}.0"
        out.append(
            (_port(data.get("down"), down, up, f"{where}: down"), f"{pwhere} (downstream port)")
        )
        if isinstance(port, dict) and "switch" in port:
            if len(port) != 1:
                raise ValueError(f"{pwhere}: a nested switch entry holds only 'switch:'")
            inner = _require_map(port["switch"], pwhere)
            if "parent" in inner:
                raise ValueError(f"{pwhere}: a nested switch's parent is its downstream port")
            next_bus = _expand(inner, f"{pwhere}.switch", down, next_bus, source, out)
            continue
        functions = port if isinstance(port, list) else [port]
        last = next_bus - 1
        for j, fn in enumerate(functions):
            fwhere = f"{pwhere}[{j}]" if isinstance(port, list) else pwhere
            item = dict(_require_map(fn, fwhere))
            if "parent" in item:
                raise ValueError(f"{fwhere}: 'parent' is implied by the switch port")
            if "bdf" not in item:
                item["bdf"] = f"{dom}:{next_bus:02x}:00.{j}"
            last = max(last, _bus(item["bdf"], f"{fwhere}: bdf"))
            item["parent"] = down
            out.append((item, fwhere))
        next_bus = last + 1
    return next_bus
