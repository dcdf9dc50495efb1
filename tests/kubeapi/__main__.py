"""Run the test API server on its own (benches put it in its own process, so its GIL is
not the client's): ``python3 -m tests.kubeapi --port-file F [--nodes N]``.

Counters of the running server: ``GET /debug/counts``; zero them: ``GET /debug/reset``.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from .server import KubeAPIServer


def main() -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.kubeapi")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--nodes", type=int, default=0, help="create Nodes node-00000, ...")
    p.add_argument("--node", action="append", default=[], help="create this Node")
    args = p.parse_args()
    api = KubeAPIServer(args.host, args.port).start()
    for name in args.node:
        api.add_node(name)
    for i in range(args.nodes):
        api.add_node(f"node-{i:05d}")
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(str(api.port))
        os.replace(tmp, args.port_file)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
