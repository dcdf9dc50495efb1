"""Kubelet DRA plugin plumbing: registration, node service, slice publishing, CDI, exporter.

Empty until the kubelet-plugin work; it will consume ``normalize`` output and never read
the host itself (discovery -> normalize -> driver).
"""
