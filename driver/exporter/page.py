"""The node as an HTML page for people: an inline SVG of sockets, NUMA nodes, PCIe roots and
switches, GPUs, NICs, NVSwitches and NVLink/xGMI, the relation matrix as a table, and which
devices are allocated or tainted.

Pure rendering from the ``/v1/topology`` document (the graph plus DRA identities) and a map of
per-vertex marks; no scripts, no external assets, so the page works air-gapped and behind any
proxy. Every drawn device carries ``data-kind``, ``data-vertex`` and ``data-label`` so tests
(and people with devtools) can find it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from discovery.words import plural

DEV_W = 118
DEV_H = 50
GAP = 10
ROOT_H = 26
SWITCH_H = 22
PAD = 14


@dataclass(frozen=True)
class Mark:
    """What the page says about one device vertex beyond the hardware."""

    allocated: str | None = None
    """Claim UID when prepared on this node."""
    health: str = "Unknown"
    tainted: str | None = None
    """Taint effect (``NoSchedule``/``NoExecute``) when unhealthy."""
    reason: str = ""


def _a(value: Any) -> str:
    return escape(str(value), quote=True)


def _short_model(model: str | None) -> str:
    if not model:
        return ""
    for word in ("NVIDIA ", "AMD ", "Instinct ", "Mellanox Technologies ", "Intel Corporation "):
        model = model.replace(word, "")
    return model[:18]


@dataclass
class _Box:
    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h


class _Layout:
    def __init__(self, doc: dict[str, Any], marks: Mapping[str, Mark]) -> None:
        self.doc = doc
        self.marks = marks
        self.v = {v["id"]: v for v in doc.get("vertices", [])}
        # z-order = document order: containers and PCIe lines, then the fabric links, then
        # the devices on top (so links pass behind boxes but over sockets).
        self.parts: list[str] = []
        self.links: list[str] = []
        self.top: list[str] = []
        self.dev_boxes: dict[str, _Box] = {}
        parent: dict[str, str] = {}
        for e in doc.get("edges", []):
            if e["kind"] == "pcie":
                parent[e["target"]] = e["source"]
        self.parent = parent

    def chain(self, vid: str) -> list[str]:
        """Vertices from the PCIe root down to ``vid`` (root first)."""
        out = [vid]
        seen = {vid}
        while out[-1] in self.parent and self.parent[out[-1]] not in seen:
            out.append(self.parent[out[-1]])
            seen.add(out[-1])
        return list(reversed(out))

    def render(self) -> str:
        endpoints = [v for v in self.v.values() if v["kind"] in ("gpu", "nic")]
        # Endpoints grouped: NUMA node -> PCIe root -> first bridge below the root.
        by_numa: dict[str, dict[str, dict[str, list[str]]]] = {}
        for ep in sorted(endpoints, key=lambda v: _label_key(v)):
            chain = self.chain(ep["id"])
            root = chain[0] if chain[0].startswith("pcie_root:") else "pcie_root:?"
            group = chain[1] if len(chain) > 2 else ep["id"]
            numa = self.v.get(root, {}).get("attrs", {}).get("numa_node")
            if numa is None:
                numa = ep["attrs"].get("numa_node")
            key = f"numa:{numa}" if numa is not None else "numa:?"
            by_numa.setdefault(key, {}).setdefault(root, {}).setdefault(group, []).append(ep["id"])
        packages: dict[str, list[str]] = {}
        for v in self.v.values():
            if v["kind"] != "numa":
                continue
            a = v["attrs"]
            if not a.get("cpus") and v["id"] not in by_numa:
                continue  # placeholder and GPU-memory nodes carry nothing to draw
            pkg = f"package:{a['package']}" if a.get("package") is not None else "package:?"
            packages.setdefault(pkg, []).append(v["id"])
        for numa in by_numa:
            if numa not in self.v:
                packages.setdefault("package:?", []).append(numa)
        x: float = PAD
        top: float = PAD
        height = 0.0
        for pkg in sorted(packages, key=_natural):
            w, h = self.package(pkg, sorted(set(packages[pkg]), key=_natural), by_numa, x, top)
            x += w + GAP * 2
            height = max(height, h)
        width = max(x, 300)
        y = top + height + GAP * 3
        y = self.fabric(y, width)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" id="topology" role="img" '
            f'aria-label="topology of {_a(self.doc.get("node") or "node")}" '
            f'viewBox="0 0 {width:.0f} {y + PAD:.0f}" width="{width:.0f}" '
            f'style="max-width:100%;height:auto">'
            + "".join(self.parts + self.links + self.top)
            + "</svg>"
        )

    def package(
        self,
        pkg: str,
        numas: list[str],
        by_numa: dict[str, dict[str, dict[str, list[str]]]],
        x0: float,
        y0: float,
    ) -> tuple[float, float]:
        start = len(self.parts)
        x = x0 + PAD
        inner_h = 0.0
        for numa in numas:
            w, h = self.numa(numa, by_numa.get(numa, {}), x, y0 + 28)
            x += w + GAP
            inner_h = max(inner_h, h)
        w = max(x - x0 + PAD - GAP, 160)
        h = inner_h + 28 + PAD
        pv = self.v.get(pkg, {"attrs": {}})
        title = f"Socket {pkg.split(':')[1]}" if pkg != "package:?" else "Host"
        cpus = pv["attrs"].get("cpus", "")
        self.parts.insert(
            start,
            f'<g data-kind="socket" data-vertex="{_a(pkg)}">'
            f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" rx="10" class="socket"/>'
            f'<text x="{x0 + 10}" y="{y0 + 19}" class="title">{_a(title)}'
            f'<tspan class="muted"> CPUs {_a(cpus)}</tspan></text></g>',
        )
        return w, h

    def numa(
        self, numa: str, roots: dict[str, dict[str, list[str]]], x0: float, y0: float
    ) -> tuple[float, float]:
        start = len(self.parts)
        x = x0 + PAD
        y = y0 + 44
        inner_h = 0.0
        for root in sorted(roots, key=lambda r: min(self._first(m) for m in roots[r].values())):
            w, h = self.root(root, roots[root], x, y)
            x += w + GAP
            inner_h = max(inner_h, h)
        w = max(x - x0 + PAD - GAP, 190)
        h = inner_h + 44 + PAD
        a = self.v.get(numa, {"attrs": {}})["attrs"]
        mem = a.get("memory_bytes")
        mem_text = f" · {mem / 2**30:.0f} GiB" if mem else ""
        name = numa.split(":")[1]
        self.parts.insert(
            start,
            f'<g data-kind="numa" data-vertex="{_a(numa)}">'
            f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" rx="8" class="numa"/>'
            f'<text x="{x0 + 10}" y="{y0 + 18}" class="title">NUMA {_a(name)}</text>'
            f'<text x="{x0 + 10}" y="{y0 + 34}" class="muted">CPUs {_a(a.get("cpus", "-"))}'
            f"{_a(mem_text)}</text></g>",
        )
        return w, h

    def root(
        self, root: str, groups: dict[str, list[str]], x0: float, y0: float
    ) -> tuple[float, float]:
        ncols = max(1, len(groups))
        w = ncols * DEV_W + (ncols - 1) * GAP
        rb = _Box(x0, y0, w, ROOT_H)
        label = root.split(":", 1)[1]
        self.parts.append(
            f'<g data-kind="pcie-root" data-vertex="{_a(root)}">'
            f'<rect x="{rb.x}" y="{rb.y}" width="{rb.w}" height="{rb.h}" rx="4" class="root"/>'
            f'<text x="{rb.cx}" y="{rb.y + 17}" class="center small">root {_a(label)}</text></g>'
        )
        x = x0
        bottom = rb.bottom
        for group in sorted(groups, key=lambda g: self._first(groups[g])):
            members = groups[group]
            y = rb.bottom + 16
            top_anchor = rb
            if group.startswith("bridge:"):
                is_switch = any(len(self.chain(m)) > 3 for m in members)
                sb = _Box(x, y, DEV_W, SWITCH_H)
                kind = "pcie-switch" if is_switch else "root-port"
                text = "PCIe switch" if is_switch else "root port"
                self.line(rb.cx if ncols == 1 else sb.cx, rb.bottom, sb.cx, sb.y, "pcie")
                self.parts.append(
                    f'<g data-kind="{kind}" data-vertex="{_a(group)}">'
                    f'<rect x="{sb.x}" y="{sb.y}" width="{sb.w}" height="{sb.h}" rx="4" '
                    f'class="switch"/><text x="{sb.cx}" y="{sb.y + 15}" class="center small">'
                    f"{text}</text></g>"
                )
                top_anchor = sb
                y = sb.bottom + 14
            for member in members:
                db = _Box(x, y, DEV_W, DEV_H)
                self.line(top_anchor.cx, top_anchor.bottom, db.cx, db.y, "pcie")
                self.device(member, db)
                top_anchor = db
                y = db.bottom + 14
            bottom = max(bottom, y - 14)
            x += DEV_W + GAP
        return w, bottom - y0

    def _first(self, members: list[str]) -> tuple[Any, ...]:
        return min(_label_key(self.v[m]) for m in members)

    def device(self, vid: str, b: _Box) -> None:
        v = self.v[vid]
        a = v["attrs"]
        kind = v["kind"]
        mark = self.marks.get(vid, Mark())
        classes = [kind]
        badges = []
        if mark.allocated:
            classes.append("allocated")
            badges.append("ALLOC")
        if mark.tainted:
            classes.append("tainted")
            badges.append("TAINT")
        sub = _short_model(a.get("model")) if kind == "gpu" else (a.get("rdma_devices") or [""])[0]
        if kind == "nic" and not sub:
            sub = (a.get("netdevs") or [""])[0]
        tip = [vid, a.get("dra_device", "")]
        tip += [f"{d['driver']}/{d['device']}" for d in a.get("dra", [])]
        if mark.allocated:
            tip.append(f"allocated to claim {mark.allocated}")
        if mark.tainted:
            tip.append(f"tainted {mark.tainted}: {mark.reason}")
        self.dev_boxes[vid] = b
        label = v.get("label", vid)
        self.top.append(
            f'<g data-kind="{kind}" data-vertex="{_a(vid)}" data-label="{_a(label)}" '
            f'data-allocated="{"true" if mark.allocated else "false"}" '
            f'data-tainted="{"true" if mark.tainted else "false"}" class="{" ".join(classes)}">'
            f"<title>{_a(' · '.join(t for t in tip if t))}</title>"
            f'<rect x="{b.x}" y="{b.y}" width="{b.w}" height="{b.h}" rx="6"/>'
            f'<text x="{b.x + 8}" y="{b.y + 18}" class="devlabel">{_a(label)}</text>'
            f'<text x="{b.x + 8}" y="{b.y + 33}" class="small">{_a(sub)}</text>'
            f'<text x="{b.x + 8}" y="{b.y + 45}" class="tiny">{_a(a.get("bus_id", ""))}</text>'
            + (
                f'<text x="{b.x + b.w - 6}" y="{b.y + 45}" class="badge">'
                f"{_a(' '.join(badges))}</text>"
                if badges
                else ""
            )
            + "</g>"
        )

    def fabric(self, y: float, width: float) -> float:
        """NVSwitches in a band under the sockets; NVLink/xGMI lines to the GPUs."""
        switches = sorted(
            (v for v in self.v.values() if v["kind"] == "nvswitch"), key=lambda v: v["id"]
        )
        links = [e for e in self.doc.get("edges", []) if e["kind"] in ("nvlink", "xgmi")]
        if not links and not switches:
            return y
        boxes: dict[str, _Box] = {}
        if switches:
            n = len(switches)
            sw_w = 130.0
            total = n * sw_w + (n - 1) * GAP * 3
            x = max(PAD, (width - total) / 2)
            for sw in switches:
                b = _Box(x, y + 40, sw_w, 34)
                boxes[sw["id"]] = b
                x += sw_w + GAP * 3
        direct_y = y + 20
        for e in links:
            src = self.dev_boxes.get(e["source"]) or boxes.get(e["source"])
            dst = self.dev_boxes.get(e["target"]) or boxes.get(e["target"])
            if src is None or dst is None:
                continue
            cls = "xgmi" if e["kind"] == "xgmi" else "nvlink"
            title = (
                f"NV{e['attrs'].get('links', '?')}" if e["kind"] == "nvlink" else "xGMI"
            ) + f" {e['source']} ↔ {e['target']}"
            if e["target"] in boxes:
                path = f"M{src.cx},{src.bottom} L{dst.cx},{dst.y}"
            else:
                path = (
                    f"M{src.cx},{src.bottom} C{src.cx},{direct_y + 30} "
                    f"{dst.cx},{direct_y + 30} {dst.cx},{dst.bottom}"
                )
            self.links.append(
                f'<path d="{path}" class="{cls}" data-kind="{cls}-link">'
                f"<title>{_a(title)}</title></path>",
            )
        for sw in switches:
            b = boxes[sw["id"]]
            self.top.append(
                f'<g data-kind="nvswitch" data-vertex="{_a(sw["id"])}" class="nvswitch">'
                f'<rect x="{b.x}" y="{b.y}" width="{b.w}" height="{b.h}" rx="6"/>'
                f'<text x="{b.cx}" y="{b.y + 15}" class="center devlabel">NVSwitch</text>'
                f'<text x="{b.cx}" y="{b.y + 28}" class="center tiny">'
                f"{_a(sw['attrs'].get('bus_id') or 'fabric')}</text></g>"
            )
        return y + (90 if switches else 50)

    def line(self, x1: float, y1: float, x2: float, y2: float, cls: str) -> None:
        self.parts.append(f'<path d="M{x1},{y1} L{x2},{y2}" class="{cls}"/>')


def _natural(text: str) -> tuple[Any, ...]:
    from normalize.relations import natural_key

    return natural_key(text)


def _label_key(v: dict[str, Any]) -> tuple[Any, ...]:
    label = v.get("label") or v["id"]
    return (0 if label.startswith("GPU") else 1, _natural(label))


_REL_CLASS = {"PIX": "pix", "PXB": "pxb", "PHB": "phb", "NODE": "node", "SYS": "sys", "X": "self"}


def _matrix(doc: dict[str, Any]) -> str:
    rel = doc.get("relations") or {}
    labels = rel.get("labels") or []
    if not labels:
        return "<p class='muted'>No GPUs or NICs on this node.</p>"
    head = "".join(f"<th scope='col'>{_a(lbl)}</th>" for lbl in labels)
    rows = []
    for i, row_label in enumerate(labels):
        cells = []
        for j, value in enumerate(rel["matrix"][i]):
            cls = _REL_CLASS.get(value, "nv" if value.startswith("NV") else "xgmi")
            cells.append(
                f"<td class='{cls}' data-row='{_a(row_label)}' data-col='{_a(labels[j])}'>"
                f"{_a(value)}</td>"
            )
        rows.append(f"<tr><th scope='row'>{_a(row_label)}</th>{''.join(cells)}</tr>")
    legend = rel.get("legend") or {}
    nic_legend = ", ".join(f"{_a(k)} = {_a(v)}" for k, v in legend.items())
    return (
        f"<table id='relations' class='matrix'><thead><tr><th></th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        f"<p class='muted small'>{nic_legend}</p>"
        "<p class='muted small'>X self · NV# bonded NVLinks · XGMI AMD Infinity Fabric · "
        "PIX ≤ 1 PCIe bridge · PXB several bridges · PHB through the host bridge · "
        "NODE across host bridges in one NUMA node · SYS across sockets</p>"
    )


def _device_table(doc: dict[str, Any], marks: Mapping[str, Mark]) -> str:
    rows = []
    dra = doc.get("dra") or {}
    for v in doc.get("vertices", []):
        if v["kind"] not in ("gpu", "nic", "cpu_group"):
            continue
        a = v["attrs"]
        mark = marks.get(v["id"], Mark())
        idents = [_a(f"{d['driver']}/{d['pool']}/{d['device']}") for d in a.get("dra", [])]
        if not idents and a.get("dra_device"):
            # Not published by toposlice (`serve`, or a kind left out with --publish): the
            # name it has in the node's pool all the same, marked as such.
            name = f"{dra.get('driver', '')}/{dra.get('pool') or ''}/{a['dra_device']}"
            idents.append(f"{_a(name)} <span class='muted small'>(not published)</span>")
        state = []
        if mark.allocated:
            state.append(f"<span class='pill alloc'>allocated {_a(mark.allocated[:8])}</span>")
        if mark.tainted:
            state.append(f"<span class='pill taint'>{_a(mark.tainted)}</span> {_a(mark.reason)}")
        label = v.get("label") or a.get("dra_device") or v["id"]
        where = a.get("bus_id") or a.get("cpus") or ""
        numa = a.get("numa_node", "")
        root = a.get("pcie_root") or ",".join(a.get("pcie_roots", []))
        rows.append(
            f"<tr data-vertex='{_a(v['id'])}'><td>{_a(label)}</td><td>{_a(v['kind'])}</td>"
            f"<td>{_a(where)}</td><td>{_a(numa)}</td><td>{_a(root)}</td>"
            f"<td>{'<br>'.join(idents) or '-'}</td>"
            f"<td>{' '.join(state) or _a(mark.health)}</td></tr>"
        )
    return (
        "<table class='devices'><thead><tr><th>device</th><th>kind</th><th>bus id / CPUs</th>"
        "<th>NUMA</th><th>PCIe root</th><th>DRA identity (driver/pool/device)</th>"
        f"<th>state</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _findings(report: dict[str, Any] | None) -> str:
    if not report or not report.get("findings"):
        return ""
    rows = "".join(
        f"<tr class='{_a(f.get('severity', ''))}'><td>{_a(f.get('severity', ''))}</td>"
        f"<td>{_a(f.get('driver', ''))}</td><td>{_a(f.get('device', '-'))}</td>"
        f"<td>{_a(f.get('check', ''))}</td><td>{_a(f.get('message', ''))}</td></tr>"
        for f in report["findings"]
    )
    return (
        "<h2>Cross-driver findings</h2><table class='findings'><thead><tr><th>severity</th>"
        "<th>driver</th><th>device</th><th>check</th><th>finding</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1f2933;
background:#f7f9fb}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 10px}
.muted{color:#66788a}.small{font-size:11px}.tiny{font-size:9px;fill:#52606d}
header p{margin:0 0 16px}
.card{background:#fff;border:1px solid #d9e2ec;border-radius:10px;padding:16px;overflow-x:auto}
svg text{font-family:system-ui,sans-serif;font-size:11px;fill:#1f2933}
svg .title{font-weight:600;font-size:13px}svg .center{text-anchor:middle}
svg .devlabel{font-weight:700;font-size:12px}
svg .badge{text-anchor:end;font-size:9px;font-weight:700;fill:#b44d12}
.socket{fill:#eef2f7;stroke:#9fb3c8}.numa{fill:#fff;stroke:#bcccdc;stroke-dasharray:4 3}
.root{fill:#e4e7eb;stroke:#9aa5b1}.switch{fill:#f0f4f8;stroke:#9aa5b1}
g.gpu rect{fill:#e3f9e5;stroke:#3f9142;stroke-width:1.5}
g.nic rect{fill:#e6f6ff;stroke:#2680c2;stroke-width:1.5}
g.nvswitch rect{fill:#fffbea;stroke:#cb6e17;stroke-width:1.5}
g.allocated rect{stroke:#f0b429;stroke-width:3}
g.tainted rect{fill:#ffe3e3;stroke:#cf1124;stroke-width:3}
path.pcie{stroke:#7b8794;stroke-width:1.4;fill:none}
path.nvlink{stroke:#57ae5b;stroke-width:1.4;fill:none;opacity:.45}
path.xgmi{stroke:#d64545;stroke-width:1.6;fill:none;opacity:.5}
table{border-collapse:collapse;font-size:12px;background:#fff}
th,td{border:1px solid #d9e2ec;padding:3px 7px;text-align:center}
table.devices td,table.findings td{text-align:left}
.matrix td{font-family:ui-monospace,monospace;font-weight:600}
td.self{background:#f0f4f8;color:#9aa5b1}td.nv{background:#c6f7c9}td.xgmi{background:#ffd6d6}
td.pix{background:#d1eefc}td.pxb{background:#e0e8f9}td.phb{background:#fff3c4}
td.node{background:#fcefc7}td.sys{background:#ffe0e0}
.pill{border-radius:8px;padding:1px 6px;font-size:11px;font-weight:600}
.alloc{background:#fff3c4;color:#8d2b0b}.taint{background:#ffe3e3;color:#a61b1b}
tr.error td:first-child{color:#cf1124;font-weight:700}
tr.warning td:first-child{color:#b44d12}
.legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;border-radius:3px;vertical-align:-2px;
margin-right:4px;border:1.5px solid}
"""


def render_page(
    doc: dict[str, Any],
    marks: Mapping[str, Mark] | None = None,
    report: dict[str, Any] | None = None,
    status_line: str = "",
) -> str:
    """The whole HTML page for the ``/v1/topology`` document ``doc``."""
    marks = marks or {}
    node = doc.get("node") or "node"
    svg = _Layout(doc, marks).render()
    n_gpu = sum(1 for v in doc.get("vertices", []) if v["kind"] == "gpu")
    n_nic = sum(1 for v in doc.get("vertices", []) if v["kind"] == "nic")
    allocated = sum(1 for m in marks.values() if m.allocated)
    tainted = sum(1 for m in marks.values() if m.tainted)
    legend = (
        "<p class='legend small'>"
        "<span><i class='sw' style='background:#e3f9e5;border-color:#3f9142'></i>GPU</span>"
        "<span><i class='sw' style='background:#e6f6ff;border-color:#2680c2'></i>NIC</span>"
        "<span><i class='sw' style='background:#fffbea;border-color:#cb6e17'></i>NVSwitch</span>"
        "<span><i class='sw' style='background:#fff;border-color:#f0b429'></i>allocated</span>"
        "<span><i class='sw' style='background:#ffe3e3;border-color:#cf1124'></i>tainted</span>"
        "<span style='color:#57ae5b'>── NVLink</span><span style='color:#d64545'>── xGMI</span>"
        "<span style='color:#7b8794'>── PCIe</span></p>"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_a(node)} · toposlice</title>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<style>{_CSS}</style></head><body>"
        f"<header><h1>{_a(node)}</h1><p class='muted'>"
        f"{plural(n_gpu, 'GPU')} · {plural(n_nic, 'NIC')} · "
        f"{allocated} allocated · {tainted} tainted"
        f"{' · ' + _a(status_line) if status_line else ''} · "
        "<a href='/v1/topology'>topology JSON</a> · <a href='/v1/topology?format=dot'>dot</a>"
        " · <a href='/v1/inventory'>inventory</a> · <a href='/v1/normalization'>normalization"
        "</a> · <a href='/metrics'>metrics</a></p></header>"
        f"<section class='card'>{svg}{legend}</section>"
        f"<h2>Relations</h2><section class='card'>{_matrix(doc)}</section>"
        f"<h2>Devices</h2><section class='card'>{_device_table(doc, marks)}</section>"
        f"{_findings(report)}</body></html>"
    )
