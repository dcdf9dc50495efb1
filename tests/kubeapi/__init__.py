"""A test Kubernetes API server (Nodes, ResourceSlices, ResourceClaims) with fault injection.

Used by the driver tests and by ``bench/driver.py`` (which puts the repository root on
``sys.path`` and imports ``tests.kubeapi``).
"""

from .faults import Fault, FaultPlan
from .kubeconfig import write_kubeconfig
from .server import KubeAPIServer, status_body
from .store import RESOURCES, ApiError, Store

__all__ = [
    "RESOURCES",
    "ApiError",
    "Fault",
    "FaultPlan",
    "KubeAPIServer",
    "Store",
    "status_body",
    "write_kubeconfig",
]
