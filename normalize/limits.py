"""Every upstream resource.k8s.io/v1 limit the normalizer and the validator obey, in one place.

Values from the API's validation (``k8s.io/dynamic-resource-allocation`` and
``pkg/apis/resource/validation``); the builders stay inside them and
:mod:`normalize.validation` checks them.
"""

from __future__ import annotations

MAX_DEVICES_PER_SLICE = 128
"""Devices in one ResourceSlice."""
MAX_DEVICES_PER_SLICE_RESTRICTED = 64
"""Devices in a slice that holds taints, counters or list-typed attributes."""
MAX_ATTRS_AND_CAPACITY = 32
"""Attributes plus capacities of one device."""
MAX_ATTRIBUTE_VALUES = 48
"""Values over all attributes of one device (a list counts each element)."""
MAX_STRING = 64
"""Characters of a string or version attribute value."""
MAX_TAINTS = 16
MAX_CONSUMES_COUNTERS = 2
MAX_COUNTERS = 32
MAX_SHARED_COUNTERS = 8
MAX_BINDING_CONDITIONS = 4
MAX_ID_LENGTH = 32
"""The C-identifier part of a qualified attribute or capacity name."""
MAX_DOMAIN_LENGTH = 63
"""A driver name, and the domain of a qualified name."""
MAX_DNS_LABEL = 63
"""Device names (DNS-1123 labels)."""
MAX_POOL_NAME = 253
"""Pool names (DNS subdomains, ``/``-separated)."""
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
"""Range of an ``int`` attribute."""
