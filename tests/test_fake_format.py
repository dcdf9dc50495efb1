"""Machine-file format: what used to fail a user describing real servers (issue #9).

Each case writes what a user would write and checks either that the generated machine
is discovered as meant, or the exact message they see (with the line to fix).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from discovery.fake import fake_host, list_machines, load_machine, load_yaml, parse_machine
from discovery.fake.spec import MachineSpec
from discovery.model import Inventory
from toposlice.discover import discover

BASE = """\
name: fmt
cpu: {model: Test CPU, sockets: 2, cores_per_socket: 4, threads_per_core: 2}
pci:
  - {bdf: "0000:00:01.0", class: 0x060400, vendor: 0x8086, device: 0x352a, numa_node: 0}
  - {bdf: "0000:80:01.0", class: 0x060400, vendor: 0x8086, device: 0x352a, numa_node: 1}
"""


def machine(extra: str = "", base: str = BASE, **replace: str) -> str:
    text = base
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    return text + extra


def discovered(text: str) -> Inventory:
    spec = load_yaml(text, source="fmt.yaml")
    with fake_host(spec) as host:
        return discover(str(host.root), nvml=host.nvml)


def refused(text: str) -> str:
    with pytest.raises(ValueError) as exc:
        load_yaml(text, source="bad.yaml")
    message = str(exc.value)
    assert message.startswith("bad.yaml")
    return message


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# --------------------------------------------------------------------------- class codes

_GPU = """\
  - bdf: "0000:01:00.0"
    parent: "0000:00:01.0"
    class: {cls}
    vendor: 0x10de
    device: 0x2330
    nvidia: {{name: NVIDIA H100 80GB HBM3, memory_mib: 81559}}
"""


@pytest.mark.parametrize("written", ["0302", "'0302'", "0x0302", "0x030200", "'030200'"])
def test_class_code_as_lspci_prints_it(written: str) -> None:
    inv = discovered(machine(_GPU.format(cls=written)))
    assert [g.bus_id for g in inv.gpus] == ["0000:01:00.0"]
    dev = inv.pci("0000:01:00.0")
    assert (dev.class_code, dev.prog_if) == ("0x0302", "0x00")


@pytest.mark.parametrize("written", ["0xc2", "'3D'", "0x1234567"])
def test_class_code_that_is_none_says_what_to_write(written: str) -> None:
    message = refused(machine(_GPU.format(cls=written)))
    assert "is not a PCI class code: write the 24-bit code in hex (class: 0x030200" in message
    assert "or the 16-bit form lspci prints (class: 0302 or 0x0302)" in message


# --------------------------------------------------------------------------- CPUs


def test_socket_interleaved_numbering() -> None:
    text = machine(
        **{"threads_per_core: 2}": "threads_per_core: 2, numbering: socket_interleaved}"}
    )
    inv = discovered(text)
    cpus = inv.cpus
    assert len(cpus) == 16
    assert all(c.package == c.id % 2 for c in cpus)
    nodes = {n.id: n.cpus for n in inv.numa_nodes}
    assert nodes == {0: list(range(0, 16, 2)), 1: list(range(1, 16, 2))}
    # SMT siblings: thread 1 of a core is 8 ids after thread 0 (thread-major, as Linux).
    assert next(c for c in cpus if c.id == 0).siblings == [0, 8]


def test_unknown_numbering_lists_the_choices() -> None:
    message = refused(machine(**{"threads_per_core: 2}": "threads_per_core: 2, numbering: rr}"}))
    assert "numbering must be one of linear, interleaved, socket_interleaved" in message
    assert "CPU n on socket n mod sockets" in message


# --------------------------------------------------------------------------- NICs


_EFA = """\
  - bdf: "0000:81:00.0"
    parent: "0000:80:01.0"
    class: 0x020000
    vendor: 0x1d0f
    device: 0xefa1
    rdma: [{{name: rdmap129s0, link_layer: {layer}, rate: "100 Gb/sec (4X EDR)"}}]
"""


def test_efa_link_layer_unknown() -> None:
    inv = discovered(machine(_EFA.format(layer="Unknown")))
    (rdma,) = inv.rdma_devices
    assert rdma.ports[0].link_layer == "Unknown" and rdma.ports[0].netdev is None
    (nic,) = inv.nics
    assert (nic.model, nic.link_layer) == ("EFA", "Unknown")


def test_link_layer_must_be_a_word() -> None:
    message = refused(machine(_EFA.format(layer="'Infini Band!'")))
    assert "link_layer 'Infini Band!' must be a word such as InfiniBand, Ethernet or Unknown" in (
        message
    )


# --------------------------------------------------------------------------- IOMMU


def test_iommu_group_is_set() -> None:
    text = machine(
        _EFA.format(layer="Unknown").replace("    rdma:", "    iommu_group: 17\n    rdma:")
    )
    inv = discovered(text)
    assert inv.pci("0000:81:00.0").iommu_group == 17
    assert inv.pci("0000:80:01.0").iommu_group is None
    spec = load_yaml(text)
    with fake_host(spec) as host:
        link = host.root / "sys/kernel/iommu_groups/17/devices/0000:81:00.0"
        assert link.is_symlink() and (link.resolve() / "vendor").read_text() == "0x1d0f\n"


def test_iommu_group_must_be_a_group_number() -> None:
    text = machine(
        _EFA.format(layer="Unknown").replace("    rdma:", "    iommu_group: -1\n    rdma:")
    )
    assert "iommu_group must be a group number >= 0, got -1" in refused(text)


# --------------------------------------------------------------------------- AMD

_AMD = """\
  - bdf: "0000:02:00.0"
    parent: "0000:00:01.0"
    class: 0x120000
    vendor: 0x1002
    device: {device}
    amd: {amd}
"""


def test_amd_vram_in_fractional_gib_and_mib() -> None:
    inv = discovered(machine(_AMD.format(device="0x74a1", amd="{vram_gib: 191.98}")))
    (gpu,) = inv.gpus
    assert gpu.memory_bytes == round(191.98 * (1 << 30) / 4096) * 4096
    inv = discovered(machine(_AMD.format(device="0x74a1", amd="{vram_mib: 196592}")))
    assert inv.gpus[0].memory_bytes == 196592 << 20
    message = refused(machine(_AMD.format(device="0x74a1", amd="{vram_gib: 1, vram_mib: 1024}")))
    assert "give exactly one of vram_gib or vram_mib" in message


def test_mi308x_has_a_model_name() -> None:
    inv = discovered(machine(_AMD.format(device="0x74a2", amd="{vram_gib: 192}")))
    assert inv.gpus[0].model == "AMD Instinct MI308X"


def test_amd_name_is_the_model() -> None:
    text = machine(_AMD.format(device="0x7777", amd="{name: Custom Accelerator X, vram_gib: 64}"))
    inv = discovered(text)
    assert inv.gpus[0].model == "Custom Accelerator X"
    # Without a name the model falls back to the id table (here: none).
    inv = discovered(machine(_AMD.format(device="0x7777", amd="{vram_gib: 64}")))
    assert inv.gpus[0].model is None


# --------------------------------------------------------------------------- NVSwitch typos

_NVSWITCH = """\
  - {bdf: "0000:05:00.0", parent: "0000:00:01.0", class: 0x068000, vendor: 0x10de, device: 0x22a3}
  - bdf: "0000:06:00.0"
    parent: "0000:00:01.0"
    class: 0x030200
    vendor: 0x10de
    device: 0x2330
    nvidia:
      name: NVIDIA H100 80GB HBM3
      memory_mib: 81559
      nvlink_version: "4.0"
      nvlinks:
        - {remote: "0000:05:00.0", count: 9}
        - {remote: "0000:05:01.0", count: 9}
"""


def test_nvswitch_typo_is_refused_naming_the_line() -> None:
    text = machine(_NVSWITCH)
    message = refused(text)
    line = line_of(text, '{remote: "0000:05:01.0"')
    assert message.startswith(f"bad.yaml:{line}: ")
    assert (
        "NVLink remote 0000:05:01.0 of GPU 0000:06:00.0 is not one of this machine's "
        "NVSwitches (0000:05:00.0); fix the bus id, or write external: true" in message
    )


def test_external_switch_is_allowed() -> None:
    text = machine(
        _NVSWITCH.replace('count: 9}\n"""', "count: 9}\n").replace(
            '{remote: "0000:05:01.0", count: 9}',
            '{remote: "0000:05:01.0", count: 9, external: true}',
        )
    )
    spec = load_yaml(text)
    gpu = spec.device("0000:06:00.0")
    assert gpu is not None and gpu.nvidia is not None
    assert {link.remote for link in gpu.nvidia.nvlinks} == {"0000:05:00.0", "0000:05:01.0"}


# --------------------------------------------------------------------------- PCI tree


def test_root_port_without_numa_node_names_the_line() -> None:
    text = machine(
        '  - {bdf: "0000:40:01.0", class: 0x060400, vendor: 0x8086, device: 0x352a}\n'
        '  - {bdf: "0000:41:00.0", parent: "0000:40:01.0", class: 0x020000, vendor: 0x8086,'
        " device: 0x1592}\n"
    )
    message = refused(text)
    assert message.startswith(f"bad.yaml:{line_of(text, '0000:40:01.0')}: ")
    assert (
        "root port 0000:40:01.0 has no numa_node, so every device below it would report "
        "numa_node -1 on this 2-node machine; write numa_node: <node id> (or numa_node: -1"
    ) in message
    # Saying -1 is a choice, and loads.
    load_yaml(
        text.replace(
            'device: 0x352a}\n  - {bdf: "0000:41',
            'device: 0x352a, numa_node: -1}\n  - {bdf: "0000:41',
        )
    )


_BRIDGE = "class: 0x060400, vendor: 0x1000, device: 0xc030"
_NIC = "class: 0x020000, vendor: 0x8086, device: 0x1592"


def test_overlapping_bus_ranges_are_refused_naming_the_line() -> None:
    text = machine(
        f'  - {{bdf: "0000:00:02.0", {_BRIDGE}}}\n'
        f'  - {{bdf: "0000:01:00.0", parent: "0000:00:01.0", {_BRIDGE}}}\n'
        f'  - {{bdf: "0000:03:00.0", parent: "0000:01:00.0", {_NIC}}}\n'
        f'  - {{bdf: "0000:02:00.0", parent: "0000:00:02.0", {_NIC}}}\n'
    )
    message = refused(text)
    assert message.startswith(f"bad.yaml:{line_of(text, '0000:00:02.0')}: ")
    assert (
        "the buses below 0000:00:02.0 (02-02) overlap those below its sibling 0000:00:01.0 "
        "(01-03, bad.yaml:4: pci[0] (0000:00:01.0)): each bridge owns its own range" in message
    )


def test_one_bus_under_two_bridges_is_refused() -> None:
    text = machine(
        f'  - {{bdf: "0000:81:00.0", parent: "0000:80:01.0", {_NIC}}}\n'
        f'  - {{bdf: "0000:81:00.1", parent: "0000:00:01.0", {_NIC}}}\n'
    )
    message = refused(text)
    assert message.startswith(f"bad.yaml:{line_of(text, '0000:81:00.1')}: ")
    assert "bus 81 of domain 0000 is already the bus of 0000:81:00.0" in message
    assert "a bus has one bridge above it" in message


def test_repeated_key_is_refused() -> None:
    message = refused(machine(**{"numa_node: 1}": "numa_node: 1, numa_node: 0}"}))
    assert "key 'numa_node' repeated" in message and "line 5" in message


# --------------------------------------------------------------------------- switch shorthand

_LONG = """\
  - {bdf: "0000:16:00.0", type: up, parent: "0000:15:01.0"}
  - {bdf: "0000:17:00.0", type: down, parent: "0000:16:00.0"}
  - {bdf: "0000:17:01.0", type: down, parent: "0000:16:00.0"}
  - {bdf: "0000:18:00.0", type: nic, parent: "0000:17:00.0", net: [ibp24s0]}
  - {bdf: "0000:19:00.0", type: up, parent: "0000:17:01.0"}
  - {bdf: "0000:1a:00.0", type: down, parent: "0000:19:00.0"}
  - {bdf: "0000:1b:00.0", type: gpu, parent: "0000:1a:00.0"}
"""

_SHORT = """\
  - switch:
      parent: "0000:15:01.0"
      up: {type: up}
      down: {type: down}
      ports:
        - {bdf: "0000:18:00.0", type: nic, net: [ibp24s0]}
        - switch:
            up: {type: up}
            down: {type: down}
            ports: [{bdf: "0000:1b:00.0", type: gpu}]
"""

_TYPES = """\
name: sw
cpu: {model: Test CPU, sockets: 1, cores_per_socket: 4}
device_types:
  up: {class: 0x060400, vendor: 0x1000, device: 0xc030, driver: pcieport}
  down: {class: 0x060400, vendor: 0x1000, device: 0xc030, driver: pcieport}
  nic: {class: 0x020700, vendor: 0x15b3, device: 0x1021}
  gpu: {class: 0x030200, vendor: 0x10de, device: 0x2330, nvidia: {name: H100, memory_mib: 1024}}
pci:
  - {bdf: "0000:15:01.0", class: 0x060400, vendor: 0x8086, device: 0x352a, numa_node: 0}
"""


def _devices(spec: MachineSpec) -> list[tuple[str, str | None, int, int]]:
    return sorted((d.bdf, d.parent, d.class_code, d.device) for d in spec.pci)


def test_switch_shorthand_expands_to_the_bridges() -> None:
    long_form = load_yaml(_TYPES + _LONG)
    short = load_yaml(_TYPES + _SHORT)
    # The DGX H100 GPU0 complex: the same bridges and bus numbers as written out by hand.
    assert _devices(short) == _devices(long_form)
    assert [d.bdf for d in short.ancestors("0000:1b:00.0")] == [
        "0000:15:01.0",
        "0000:16:00.0",
        "0000:17:01.0",
        "0000:19:00.0",
        "0000:1a:00.0",
    ]


def test_switch_shorthand_defaults_and_auto_bus_numbers() -> None:
    text = _TYPES + (
        "  - switch:\n"
        '      parent: "0000:15:01.0"\n'
        "      ports:\n"
        "        - {type: nic}\n"
        "        - [{type: gpu}, {type: gpu}]\n"
    )
    spec = load_yaml(text)
    up = spec.device("0000:16:00.0")
    assert up is not None and (up.vendor, up.device, up.class_code) == (0x1000, 0xC030, 0x060400)
    assert spec.device("0000:18:00.0") is not None  # first port's endpoint: next free bus
    gpus = [d.bdf for d in spec.pci if d.nvidia is not None]
    assert gpus == ["0000:19:00.0", "0000:19:00.1"]
    assert {spec.device(g).parent for g in gpus} == {"0000:17:01.0"}  # type: ignore[union-attr]


def test_switch_shorthand_errors_name_the_line() -> None:
    text = _TYPES + "  - switch:\n      ports: [{type: nic}]\n"
    message = refused(text)
    assert "bad.yaml:" in message
    assert "missing required key 'parent' (the bridge above it)" in message
    text = _TYPES + '  - switch: {parent: "0000:15:01.0", ports: [{type: nic, parent: "x"}]}\n'
    assert "'parent' is implied by the switch port" in refused(text)
    text = _TYPES + '  - switch: {parent: "0000:15:01.0", colour: red, ports: [{type: nic}]}\n'
    assert "unknown key 'colour'" in refused(text)


# --------------------------------------------------------------------------- shipped files


@pytest.mark.parametrize("name", list_machines())
def test_shipped_machines_still_load(name: str) -> None:
    spec = load_machine(name)
    assert spec.pci and re.match(r"^[a-z0-9-]+$", spec.name)


def test_docs_switch_example_loads() -> None:
    """The `switch:` example of docs/fake-hardware.md, with dgx-h100's device types."""
    import yaml

    from discovery.fake import machine_path

    docs = (Path(__file__).resolve().parent.parent / "docs" / "fake-hardware.md").read_text()
    section = docs.split("### `switch`", 1)[1]
    example = yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])
    dgx = yaml.safe_load(machine_path("dgx-h100").read_text())
    doc = {k: dgx[k] for k in ("cpu", "numa", "nvml", "device_types")} | example
    spec = parse_machine(doc, source="docs", default_name="docs-example")
    assert [d.bdf for d in spec.ancestors("0000:1b:00.0")] == [
        "0000:15:01.0",
        "0000:16:00.0",
        "0000:17:01.0",
        "0000:19:00.0",
        "0000:1a:00.0",
    ]
    assert [d.parent for d in spec.pci if d.bdf.startswith("0000:1c:")] == ["0000:17:02.0"] * 2
