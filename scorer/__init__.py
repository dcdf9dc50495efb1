"""The placement scorer: ranks device sets on nodes' topology graphs (``toposlice.graph/v1``),
emits the ResourceClaims that land them, and serves kube-scheduler as an extender."""
