"""Device health: the monitor that spreads conditions on graph vertices to the devices
they hit (``monitor``), its NVML XID event source (``nvml_events``) and the node's NVML
gap (``nvml_gap``). The kubelet plugin's health service, the publisher's taints and the
exporter read it through ``driver.interfaces``; ``toposlice serve`` runs a monitor for
its exporter too. It may import ``driver.plumbing``, ``driver.interfaces``, ``normalize``
and ``discovery``; never the kubelet plugin, the publisher, the exporter or the daemon.
"""
