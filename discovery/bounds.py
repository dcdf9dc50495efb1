"""The largest values the kernel (or the hardware) can give, for bounded parsing.

A corrupted or hostile tree can hold any bytes; discovery keeps every number within
what a real kernel could report and drops the rest (the caller warns once), so that
no value overflows a conversion, a loop never runs away and the JSON stays strict.
"""

from __future__ import annotations

MAX_CPUS = 8192
"""CPU ids are below the largest ``CONFIG_NR_CPUS`` a kernel accepts (x86-64 MAXSMP, ppc64)."""
MAX_NUMA_NODES = 1024
"""NUMA node ids are below ``1 << CONFIG_NODES_SHIFT`` (at most 10)."""
MAX_BYTES = 1 << 64
"""Memory and cache sizes are kernel ``u64`` byte counts."""
MAX_INT_DIGITS = 24
"""Decimal digits of the longest number worth parsing (a u64 has 20)."""
MAX_LINK_WIDTH = 32
"""PCIe lanes (x32 is the widest link the specification defines)."""
MAX_LINK_SPEED_GTS = 256.0
"""PCIe GT/s (Gen7 is 128; room for one more generation)."""
MAX_RDMA_RATE_GBPS = 100_000.0
"""RDMA port rate, Gb/s."""
MAX_NET_SPEED_MBPS = (1 << 31) - 1
"""``ethtool`` link speed is an ``int`` of Mb/s."""
MAX_PCI_DOMAIN = 0xFFFFFFFF
