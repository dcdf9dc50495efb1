"""The HTTP exporter: the routes of ``run --http-addr`` and ``toposlice serve`` on the
plumbing's HTTP stack (``http_server``: probes, ``/v1/topology``, ``/metrics``, the page),
the Prometheus metrics (``metrics``), the HTML page (``page``) and PCIe link state
(``links``). It reads the driver through ``driver.interfaces.ExporterView`` and may import
``driver.plumbing``, ``driver.interfaces``, ``normalize`` and ``discovery``; never the
kubelet plugin, the publisher, ``driver.health`` or the daemon.
"""
