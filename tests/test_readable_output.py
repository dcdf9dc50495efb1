"""What a person reads, from the commands as processes: reasons next to states, link counts
that match the graph, counts in the right number, and the graph table on machines without
GPUs (a CPU server, a VM whose NIC has no NUMA node)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from discovery.fake import machine_path

REPO = Path(__file__).resolve().parent.parent
DRANET = REPO / "tests" / "data" / "foreign-slices" / "dranet.yaml"
#: "1 NICs", "1 sockets", "of 1 drivers", ...: a count of one with a plural noun.
ONE_PLURAL = re.compile(r"(?<![\d.,])1 (?:[A-Z]+s|[a-z]+s)\b|1 NUMA nodes")


def toposlice(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "toposlice", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def _vm_without_gpus(tmp_path: Path) -> Path:
    """cloud-vm-1gpu without its GPU, on one socket and one NUMA node: the NIC's sysfs
    numa_node is -1, the only node is 0 (the locality rule would say 0)."""
    text = machine_path("cloud-vm-1gpu").read_text(encoding="utf-8")
    text = text[: text.index('  - bdf: "0000:00:1e.0"')]
    text = text.replace("name: cloud-vm-1gpu", "name: vm-cpu").replace(
        "  sockets: 2\n", "  sockets: 1\n"
    )
    text = re.sub(
        r"numa:\n  nodes:\n.*?distances: \{local: 10, remote: 32\}\n",
        'numa:\n  nodes:\n    - {id: 0, cpus: "0-7", memory_mb: 32768}\n',
        text,
        flags=re.S,
    )
    path = tmp_path / "vm-cpu.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_discover_gives_the_reason_of_a_probe_that_found_nothing() -> None:
    table = toposlice("discover", "--fake", "cpu-2s")
    assert "0000:31:00.0" in table, "PCI NICs are listed"
    (probes,) = [line for line in table.splitlines() if line.startswith("probes: ")]
    assert "pci=unavailable (no PCI accelerators)" in probes
    assert "rdma=ok," in probes, "an ok probe needs no reason"


def test_discover_counts_xgmi_links_as_the_graph_draws_them() -> None:
    table = toposlice("discover", "--fake", "mi300x-8")
    graph = json.loads(toposlice("graph", "--fake", "mi300x-8", "-o", "json"))
    xgmi = [e for e in graph["edges"] if e["kind"] == "xgmi"]
    assert xgmi, "the graph has the xGMI mesh"
    header = next(line for line in table.splitlines() if line.startswith("GPU "))
    col = header.index("LINKS")
    rows = [line for line in table.splitlines() if re.match(r"^0000:\w\w:00\.0 +amd", line)]
    assert len(rows) == 8
    for row in rows:
        bus = row.split()[0]
        peers = {e["target"] for e in xgmi if e["source"] == f"gpu:{bus}"}
        peers |= {e["source"] for e in xgmi if e["target"] == f"gpu:{bus}"}
        assert row[col:].split()[0] == str(len(peers)) == "7", row


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    vm = str(_vm_without_gpus(tmp_path))
    texts = {
        "discover table": toposlice("discover", "--fake", vm),
        "discover json": toposlice("discover", "--fake", vm, "-o", "json"),
        "doctor": toposlice("doctor", "--fake", "dgx-h100", "--slices", str(DRANET)),
    }
    assert "in 1 package; 1 NUMA node;" in texts["discover table"]
    assert "1 socket," in texts["discover json"] and "1 NIC (" in texts["discover json"]
    assert " of 1 driver," in texts["doctor"]
    for name, text in texts.items():
        assert not ONE_PLURAL.search(text), (name, ONE_PLURAL.findall(text))


def test_graph_table_on_a_vm_without_gpus(tmp_path: Path) -> None:
    table = toposlice("graph", "--fake", str(_vm_without_gpus(tmp_path)))
    assert "(no GPUs or NICs)" not in table
    assert "(no relation matrix: no GPUs or RDMA NICs" in table
    slices = json.loads(
        toposlice(
            "slices", "--fake", str(_vm_without_gpus(tmp_path)), "--node-name", "n", "-o", "json"
        )
    )["items"]  # a v1 List
    nic = next(d for s in slices for d in s["spec"]["devices"] if d["name"].startswith("nic-"))
    assert "resource.kubernetes.io/numaNode" not in nic["attributes"], "sysfs says -1"
    rows = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
    header = next(line for line in table.splitlines() if line.startswith("LABEL"))
    numa = header.index("NUMA")
    assert rows["NIC"][numa:].split()[0] == "-", "unknown, as the slice has it"
    assert rows["CPU0"].endswith("AMD EPYC 7R32 (8 CPUs of one NUMA node)")


def test_graph_table_on_a_cpu_server_has_no_gpu_columns() -> None:
    table = toposlice("graph", "--fake", "cpu-2s")
    matrix_header = table.splitlines()[2]
    assert matrix_header.split("\t")[1:] == ["NIC0", "NIC1"]
    assert "Affinity" not in table and "GPU NUMA ID" not in table
    cpu_rows = [line for line in table.splitlines() if line.startswith("CPU")]
    assert [r.split()[0] for r in cpu_rows] == ["CPU0", "CPU1"]
    assert all("Xeon" in r and "64 CPUs of one NUMA node" in r for r in cpu_rows)
    # On a GPU machine the affinity columns stay.
    assert "CPU Affinity\tNUMA Affinity\tGPU NUMA ID" in toposlice("graph", "--fake", "dgx-h100")
