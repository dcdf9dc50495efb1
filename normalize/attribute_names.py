"""The names of every device attribute toposlice publishes: the standard
``resource.kubernetes.io`` ones, the driver-domain ones and the legacy aliases.

docs/attributes.md documents exactly these (``tests/test_attribute_names.py`` holds it).
Unqualified names live in the driver's domain
(``device.attributes["toposlice.dev"].<name>``).
"""

from __future__ import annotations

STANDARD_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"
STANDARD_ATTRIBUTES = (PCI_BUS_ID, PCIE_ROOT, NUMA_NODE)

BRIDGE_NUMA = "dra.net/numaNode"
"""The kernel NUMA node under the name dranet's NICs and dra-driver-cpu's CPU groups both
carry (neither publishes the standard ``numaNode``): with a bridge on (``--bridge``, or a
neighbour seen on the node), on every toposlice device with one NUMA node, so
``matchAttribute: dra.net/numaNode`` ties a toposlice GPU to their devices
(normalize/dialects.py)."""
LEGACY_CPU_NUMA = "dra.cpu/numaNodeID"
"""dra-driver-cpu's own name for a CPU group's NUMA node: on toposlice's CPU devices with
the ``dra.cpu`` bridge."""
LEGACY_ATTRIBUTES = (BRIDGE_NUMA, LEGACY_CPU_NUMA)

# Every device
TYPE = "type"
VENDOR = "vendor"
MODEL = "model"
# GPUs
UUID = "uuid"
INDEX = "index"
MINOR = "minor"
ARCHITECTURE = "architecture"
COMPUTE_CAPABILITY = "computeCapability"
DRIVER_VERSION = "driverVersion"
MIG_MODE = "migMode"
MEMORY_NUMA_NODE = "memoryNumaNode"
NVLINK_VERSION = "nvlinkVersion"
NVLINK_LINKS = "nvlinkLinks"
NVLINK_DOMAIN = "nvlinkDomain"
NVLINK_CLIQUE = "nvlinkClique"
XGMI_HIVE = "xgmiHive"
# GPUs and NICs
PCIE_GEN = "pcieGen"
PCIE_WIDTH = "pcieWidth"
PCIE_BANDWIDTH_MBPS = "pcieBandwidthMBps"
PCIE_SWITCH = "pcieSwitch"
NIC_AFFINITY = "nicAffinity"
RAIL = "rail"
# GPUs and NICs: the device's position among the node's devices of its type, in the order
# the slices list them (from 0), and how many of that type the node has. Claims with one
# request per GPU give request i a window of positions (ordinal >= i and at least N - i
# of its type from it on), so that the allocator tries each set of devices once, not in
# every order, and a node with fewer than N fails at the first device (scorer/ladder.py).
ORDINAL = "ordinal"
TYPE_COUNT = "typeCount"
# NICs
NETDEV = "netdev"
RDMA_DEVICE = "rdmaDevice"
LINK_LAYER = "linkLayer"
SPEED_MBPS = "speedMbps"
SRIOV_VF = "sriovVF"
SRIOV_PF = "sriovPF"
NODE_GUID = "nodeGuid"
# CPU groups
GROUPING = "grouping"
PACKAGE = "package"
L3_CACHE = "l3Cache"
CORE = "core"
CPU_LIST = "cpuList"
PCIE_ROOTS = "pcieRoots"
PCIE_ROOTS_TRUNCATED = "pcieRootsTruncated"
PCIE_ROOTS_MORE = ("pcieRoots2", "pcieRoots3", "pcieRoots4")
"""Where the roots that do not fit in ``pcieRoots``' 64 characters go, in order."""

DRIVER_ATTRIBUTES = (
    TYPE,
    VENDOR,
    MODEL,
    UUID,
    INDEX,
    MINOR,
    ARCHITECTURE,
    COMPUTE_CAPABILITY,
    DRIVER_VERSION,
    MIG_MODE,
    MEMORY_NUMA_NODE,
    NVLINK_VERSION,
    NVLINK_LINKS,
    NVLINK_DOMAIN,
    NVLINK_CLIQUE,
    XGMI_HIVE,
    PCIE_GEN,
    PCIE_WIDTH,
    PCIE_BANDWIDTH_MBPS,
    PCIE_SWITCH,
    NIC_AFFINITY,
    RAIL,
    ORDINAL,
    TYPE_COUNT,
    NETDEV,
    RDMA_DEVICE,
    LINK_LAYER,
    SPEED_MBPS,
    SRIOV_VF,
    SRIOV_PF,
    NODE_GUID,
    GROUPING,
    PACKAGE,
    L3_CACHE,
    CORE,
    CPU_LIST,
    PCIE_ROOTS,
    PCIE_ROOTS_TRUNCATED,
    *PCIE_ROOTS_MORE,
)
"""Driver-domain attribute names (unqualified)."""

CAPACITY_MEMORY = "memory"
CAPACITY_CPUS = "cpus"
CAPACITIES = (CAPACITY_MEMORY, CAPACITY_CPUS)
