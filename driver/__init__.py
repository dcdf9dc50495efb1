"""The DRA driver behind ``toposlice run``, in floors (docs/architecture.md):

``plumbing/`` (API client, informer, HTTP transport, files, logging, flag checks, gRPC
stubs) at the bottom; on it, side by side, ``kubelet/`` (the kubelet plugin),
``publisher/`` (ResourceSlices, NRT, NodeFeature), ``exporter/`` (HTTP routes, metrics,
page) and ``health/`` (device health), which meet only through ``interfaces.py``; on top,
``daemon.py`` wires them and ``config.py`` holds ``run``'s flags. It consumes
``normalize`` output and ``discovery`` values and never imports ``scorer/`` or
``toposlice/`` (tests/test_layers.py).
"""
