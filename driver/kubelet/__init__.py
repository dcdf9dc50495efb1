"""The DRA kubelet plugin: registration with the kubelet and the DRA node and health
services on their Unix sockets (``registration``, ``dra_server``, ``node_service``,
``health_service``, ``sockets``, ``grpc_logging``), and what prepare and unprepare do on
the node (``state``, ``claims``, ``checkpoint``, CDI specs in ``cdi`` and
``container_edits``, the vendor's CDI devices in ``vendor_cdi``, KEP-5304
``device_metadata``, the claim's NCCL topology file). It may import ``driver.plumbing``,
``driver.interfaces``, ``normalize`` and ``discovery``; never the publisher, the exporter,
``driver.health`` or the daemon, and neither ``scorer/`` nor ``toposlice/`` imports it.
"""
