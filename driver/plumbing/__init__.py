"""The driver's plumbing floor: what every part of the driver, the scorer and the CLI
share. The Kubernetes API client helpers (``kube``), the list + watch cache
(``informer``) and the watch's view of a writer's own objects (``server_view``), the one
HTTP/1.1 server stack (``http_transport``), crash-safe file writes (``atomic``), log set-up
(``logs``), argparse types (``flag_types``), the flag checks every command shares
(``checks``), rediscovery triggers (``hotplug``) and the kubelet's gRPC stubs (``gen``,
generated from ``proto/``). It may import ``normalize`` and ``discovery`` but no other
part of ``driver/`` (tests/test_layers.py).
"""
