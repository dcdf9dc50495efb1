"""Text renderings for people: the nvidia-smi-style relation matrix, the graph summary
table and Graphviz DOT. The normalizer builds data; how it looks on a terminal lives here,
next to the CLI's other output (:mod:`toposlice.output`).
"""

from __future__ import annotations

from typing import Any

from discovery.readers import format_cpulist
from discovery.words import plural
from normalize.relations import LEGEND, RelationMatrix

__all__ = ["format_topo", "graph_table", "graph_to_dot", "plural"]


def _cell(value: str) -> str:
    return " X " if value == "X" else value


def format_topo(matrix: RelationMatrix, affinity: bool = True) -> str:
    """Tab-separated table like ``nvidia-smi topo -m`` (affinity columns on GPU rows, and
    only when there is a GPU row)."""
    affinity = affinity and any(label.startswith("GPU") for label in matrix.labels)
    lines = []
    header = ["", *matrix.labels]
    if affinity:
        header += ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    lines.append("\t".join(header))
    for i, label in enumerate(matrix.labels):
        row = [label, *(_cell(v) for v in matrix.matrix[i])]
        if affinity and label.startswith("GPU"):
            cpu = matrix.cpu_affinity[i] if i < len(matrix.cpu_affinity) else None
            numa = matrix.numa_affinity[i] if i < len(matrix.numa_affinity) else None
            nodes = matrix.numa_affinity_nodes[i] if i < len(matrix.numa_affinity_nodes) else []
            gnuma = matrix.gpu_numa_id[i] if i < len(matrix.gpu_numa_id) else None
            row += [
                cpu or "N/A",
                format_cpulist(nodes) if nodes else ("N/A" if numa is None else str(numa)),
                "N/A" if gnuma is None else str(gnuma),
            ]
        lines.append("\t".join(row))
    lines += ["", "Legend:", ""]
    width = max(len(k) for k in LEGEND)
    used = {("NV#" if v.startswith("NV") else v) for row in matrix.matrix for v in row}
    for key, text in LEGEND.items():
        if key == "XGMI" and key not in used:
            continue
        lines.append(f"  {key.ljust(width)} = {text}")
    if matrix.legend:
        lines += ["", "NIC Legend:", ""]
        lines += [f"  {label}: {name}" for label, name in matrix.legend.items()]
    return "\n".join(lines) + "\n"


def _matrix_from_graph(graph: dict[str, Any]) -> RelationMatrix:
    rel = graph.get("relations") or {}
    devices = graph.get("devices") or []
    return RelationMatrix(
        labels=list(rel.get("labels") or []),
        bus_ids=[d.get("bus_id", "") for d in devices],
        legend=dict(rel.get("legend") or {}),
        matrix=[list(r) for r in rel.get("matrix") or []],
        cpu_affinity=[d.get("cpu_affinity") for d in devices],
        numa_affinity=[d.get("numa_affinity") for d in devices],
        numa_affinity_nodes=[d.get("numa_affinity_nodes") or [] for d in devices],
        gpu_numa_id=[d.get("gpu_numa_id") for d in devices],
    )


def graph_table(graph: dict[str, Any]) -> str:
    """Readable summary: the relation matrix (nvidia-smi style) plus a short device list."""
    out = [f"node: {graph.get('node') or '-'}", ""]
    matrix = _matrix_from_graph(graph)
    if matrix.labels:
        out.append(format_topo(matrix))
    else:
        # NICs may still be listed below: the matrix holds GPUs and RDMA NICs only.
        out.append("(no relation matrix: no GPUs or RDMA NICs; --matrix-nics all adds any NIC)\n")
    verts = {v["id"]: v for v in graph.get("vertices", [])}
    rows = [("LABEL", "BUS ID", "DRA DEVICE", "NUMA", "PCIE ROOT", "MODEL")]
    for d in graph.get("devices", []):
        attrs = verts.get(d["id"], {}).get("attrs", {})
        numa = d.get("numa_affinity")
        rows.append(
            (
                d["label"],
                d.get("bus_id", "-"),
                d.get("dra_device", "-"),
                "-" if numa is None else str(numa),
                attrs.get("pcie_root", "-"),
                attrs.get("model") or d.get("name") or "-",
            )
        )
    listed = {d["id"] for d in graph.get("devices", [])}
    for v in graph.get("vertices", []):
        if v["kind"] == "nic" and v["id"] not in listed:
            # Network functions outside the matrix (no RDMA, SR-IOV VFs): still devices.
            a = v["attrs"]
            # The kernel's numa_node only: -1 (a VM) is unknown here as in the slice, not
            # the node the locality rule would guess.
            numa = a.get("numa_node")
            rows.append(
                (
                    "VF" if a.get("is_vf") else "NIC",
                    a.get("bus_id", "-"),
                    a.get("dra_device", "-"),
                    "-" if numa is None else str(numa),
                    a.get("pcie_root", "-"),
                    a.get("model") or "-",
                )
            )
    cpu_model = _machine_attrs(graph).get("cpu_model") or "CPUs"
    groups = [v for v in graph.get("vertices", []) if v["kind"] == "cpu_group"]
    for i, v in enumerate(groups):
        a = v["attrs"]
        numa = a.get("numa_node")
        rows.append(
            (
                f"CPU{i}",
                a.get("cpus", "-"),
                a.get("dra_device", "-"),
                "-" if numa is None else str(numa),
                ",".join(a.get("pcie_roots", [])) or "-",
                f"{cpu_model} ({_group_words(a)})",
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        cells = [str(c).ljust(w) for c, w in zip(r[:-1], widths, strict=True)]
        out.append("  ".join([*cells, str(r[-1])]).rstrip())
    return "\n".join(out) + "\n"


_GROUPS = {"numa": "of one NUMA node", "l3": "sharing an L3 cache", "core": "of one core"}


def _group_words(attrs: dict[str, Any]) -> str:
    """``64 CPUs of one NUMA node``: what a CPU-group device holds."""
    count = attrs.get("cpu_count")
    what = plural(count, "CPU") if isinstance(count, int) else "CPUs"
    grouping = str(attrs.get("grouping") or "")
    return f"{what} {_GROUPS.get(grouping, grouping)}".rstrip()


def _machine_attrs(graph: dict[str, Any]) -> dict[str, Any]:
    for v in graph.get("vertices", []):
        if v["kind"] == "machine":
            attrs: dict[str, Any] = v.get("attrs") or {}
            return attrs
    return {}


_DOT_SHAPES = {
    "machine": "house",
    "package": "box3d",
    "numa": "box",
    "pcie_root": "invhouse",
    "bridge": "diamond",
    "gpu": "box",
    "nic": "ellipse",
    "nvswitch": "octagon",
    "cpu_group": "component",
}
_DOT_EDGE = {
    "contains": "style=dotted, arrowhead=none",
    "pcie": "",
    "nvlink": 'color="green", penwidth=2, dir=both',
    "xgmi": 'color="red", penwidth=2, dir=both',
    "numa_distance": 'style=dashed, arrowhead=none, color="gray"',
    "attach": 'style=dotted, color="blue"',
    "memory": 'style=dashed, color="purple"',
}


def _q(text: str) -> str:
    """A DOT quoted string; a line break in ``text`` becomes DOT's ``\\n`` (one escape:
    Graphviz draws two lines, not a backslash and an n)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def graph_to_dot(graph: dict[str, Any]) -> str:
    """Graphviz DOT rendering of the graph."""
    lines = [f"digraph {_q(str(graph.get('node') or 'node'))} {{"]
    lines.append("  rankdir=TB;")
    lines.append('  node [fontname="Helvetica", fontsize=10];')
    for v in graph.get("vertices", []):
        attrs = v.get("attrs", {})
        text = v.get("label") or v["id"]
        extra = attrs.get("model") or attrs.get("dra_device")
        if extra and extra != text:
            text = f"{text}\n{extra}"
        shape = _DOT_SHAPES.get(v["kind"], "box")
        lines.append(f"  {_q(v['id'])} [label={_q(text)}, shape={shape}];")
    for e in graph.get("edges", []):
        style = _DOT_EDGE.get(e["kind"], "")
        a = e.get("attrs", {})
        label = ""
        if e["kind"] == "nvlink":
            label = f"NV{a.get('links', '?')}"
        elif e["kind"] == "pcie" and a.get("gen"):
            label = f"Gen{a['gen']} x{a.get('width', '?')}"
        elif e["kind"] == "numa_distance":
            label = str(a.get("distance", ""))
        opts = [o for o in (style, f"label={_q(label)}" if label else "") if o]
        suffix = f" [{', '.join(opts)}]" if opts else ""
        lines.append(f"  {_q(e['source'])} -> {_q(e['target'])}{suffix};")
    lines.append("}")
    return "\n".join(lines) + "\n"
