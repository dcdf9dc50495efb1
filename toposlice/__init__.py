"""toposlice: describe accelerator-node topology to Kubernetes DRA."""

__version__ = "0.1.0"
