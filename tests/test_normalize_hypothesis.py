"""Property: any inventory, however odd, yields slices that pass the upstream validation."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discovery.model import Cpu, Fabric, Gpu, Inventory, Nic, NumaNode, NvLink, PciDevice, PciLink
from normalize.graph import build_graph
from normalize.options import NormalizeOptions
from normalize.slices import build_slices
from normalize.validation import validate_pool, validate_slice
from tests.conftest import examples

hexd = "0123456789abcdef"
bus_ids = st.one_of(
    st.builds(
        lambda d, b, dv, f: f"{d:04x}:{b:02x}:{dv:02x}.{f:x}",
        st.integers(0, 0x1FFFF),
        st.integers(0, 255),
        st.integers(0, 31),
        st.integers(0, 7),
    ),
    st.text(alphabet=hexd + ":.ABCxyz_-", min_size=1, max_size=20),
)
texts = st.one_of(st.none(), st.text(max_size=90))
small = st.one_of(st.none(), st.integers(-3, 70))
options = st.builds(
    NormalizeOptions,
    numa_list=st.booleans(),
    cpu_grouping=st.sampled_from(["numa", "l3", "core"]),
    bridges=st.sampled_from([(), ("dra.net",), ("dra.cpu", "dra.net")]),
    max_devices_per_slice=st.integers(1, 200),
)


@st.composite
def inventories(draw: Any) -> Inventory:
    inv = Inventory(
        hostname=draw(st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9-]{0,70}", fullmatch=True)))
    )
    n_numa = draw(st.integers(0, 5))
    for i in range(n_numa):
        dist = {j: draw(st.integers(10, 255)) if j != i else 10 for j in range(n_numa)}
        inv.numa_nodes.append(
            NumaNode(
                id=i,
                distances=dist,
                package=draw(st.one_of(st.none(), st.integers(0, 2))),
                memory_bytes=draw(st.one_of(st.none(), st.integers(0, 2**50))),
                memory_only=draw(st.booleans()),
            )
        )
    for c in range(draw(st.integers(0, 40))):
        inv.cpus.append(
            Cpu(
                id=c,
                package=draw(small),
                core=draw(small),
                numa_node=draw(st.one_of(st.none(), st.integers(0, 6))),
                l3=draw(small),
            )
        )
    for bus in draw(st.lists(bus_ids, max_size=12)):
        inv.pci_devices.append(
            PciDevice(
                bus_id=bus,
                numa_node=draw(small),
                locality_numa_node=draw(small),
                pcie_root=draw(st.one_of(st.none(), st.text(max_size=80))),
                upstream_bridges=draw(st.lists(bus_ids, max_size=3)),
                link=PciLink(
                    current_speed_gts=draw(
                        st.sampled_from([None, 2.5, 8.0, 16.0, 32.0, 64.0, 7.0])
                    ),
                    current_width=draw(st.one_of(st.none(), st.integers(0, 32))),
                ),
                physfn=draw(st.one_of(st.none(), bus_ids)),
            )
        )
    known = [p.bus_id for p in inv.pci_devices]
    maybe_known = st.one_of(st.sampled_from(known), bus_ids) if known else bus_ids
    for _ in range(draw(st.integers(0, 10))):
        inv.gpus.append(
            Gpu(
                bus_id=draw(maybe_known),
                vendor=draw(st.sampled_from(["nvidia", "amd", "intel", "x" * 70])),
                probe="h",
                index=draw(small),
                uuid=draw(texts),
                model=draw(texts),
                memory_bytes=draw(st.one_of(st.none(), st.integers(0, 2**45))),
                memory_numa_node=draw(small),
                compute_capability=draw(st.one_of(st.none(), st.text(max_size=8))),
                driver_version=draw(texts),
                mig_mode=draw(st.one_of(st.none(), st.booleans())),
                nvlinks=[
                    NvLink(
                        link=k,
                        version=draw(st.one_of(st.none(), st.sampled_from(["4.0", "5.0", "x.y"]))),
                        remote_bus_id=draw(st.one_of(st.none(), maybe_known)),
                        remote_type=draw(st.sampled_from(["gpu", "switch", "unknown"])),
                    )
                    for k in range(draw(st.integers(0, 20)))
                ],
                xgmi_hive_id=draw(texts),
                xgmi_peers=draw(st.lists(maybe_known, max_size=3)),
                fabric=draw(
                    st.one_of(
                        st.none(),
                        st.builds(
                            Fabric,
                            cluster_uuid=texts,
                            clique_id=st.one_of(st.none(), st.integers(0, 2**32)),
                            state=st.sampled_from(["completed", "in_progress", None]),
                        ),
                    )
                ),
            )
        )
    n_nics = draw(st.sampled_from([0, 1, 5, 70, 130]))
    for i in range(n_nics):
        bus = draw(maybe_known) if i < 5 else f"0001:{i // 32:02x}:{i % 32:02x}.0"
        inv.nics.append(
            Nic(
                bus_id=bus,
                probe="h",
                vendor=draw(texts) if i < 5 else None,
                model=draw(texts) if i < 5 else None,
                netdevs=draw(st.lists(st.text(max_size=70), max_size=2)) if i < 5 else [],
                rdma_devices=draw(st.lists(st.text(max_size=70), max_size=2)) if i < 5 else [],
                speed_mbps=draw(st.one_of(st.none(), st.integers(-1, 2**40))) if i < 5 else None,
                rate_gbps=draw(st.one_of(st.none(), st.floats(0, 1e6))) if i < 5 else None,
                is_vf=draw(st.booleans()),
            )
        )
    return inv


@settings(
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    inv=inventories(),
    opts=options,
    node=st.from_regex(r"[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?", fullmatch=True),
)
def test_random_inventories_give_valid_slices(
    inv: Inventory, opts: NormalizeOptions, node: str
) -> None:
    slices = build_slices(inv, node, opts)
    assert len(slices) >= 1
    for s in slices:
        assert validate_slice(s) == []
        assert len(s["spec"]["devices"]) <= opts.max_devices_per_slice or not s["spec"]["devices"]
    assert validate_pool(slices) == []
    build_graph(inv, opts)  # never raises
