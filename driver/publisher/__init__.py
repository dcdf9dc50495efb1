"""The publisher: what ``toposlice run`` keeps in the API server for its node. The
ResourceSlices (``slices``), the NodeResourceTopology and NodeFeature (``topology_objects``)
with the node's pods fingerprint (``node_pods``), the resync loop they share
(``resync_loop``), and what the node's other DRA drivers publish (``neighbours`` for the
daemon, ``observe`` for ``serve --observe`` and ``doctor``). It may import
``driver.plumbing``, ``driver.interfaces``, ``normalize`` and ``discovery``; never the
kubelet plugin, the exporter, ``driver.health`` or the daemon.
"""
