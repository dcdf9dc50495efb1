#!/usr/bin/env python3
"""What the gRPC server model costs a NodePrepareResources call (issue #21 item 7).

The driver serves the kubelet with grpcio's synchronous server: a poll thread takes each
call off the completion queue and hands it to a thread-pool worker, which runs the handler
and sends the answer. ``grpc.aio`` runs handlers on the event loop's own thread instead.
This measures, with nothing else changed, one unary DRA call over a unix socket from a
Python gRPC client (as bench/kube_api.py's kubelet), for three servers, each in a process
of its own, taking turns call by call under the same load:

  sync-pool    grpc.server + ThreadPoolExecutor(16) (driver/kubelet/sockets.py)
  aio-inline   grpc.aio.server, the (blocking) handler run on the loop thread
  aio-thread   grpc.aio.server, the handler run in a thread through run_in_executor
               (what an aio server needs to keep serving while a prepare blocks)

The handler burns ``--work-ms`` of CPU in Python and sleeps ``--io-ms`` (stand-ins for a
prepare's own work and its GET/fsync waits). Prints p50 / p99 per server.

Usage: python3 bench/grpc_hops.py [--calls 2000] [--work-ms 0.3] [--io-ms 1.5]
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # bench/http.py would shadow the standard library's http package

import argparse
import multiprocessing
import tempfile
import time
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.stats import pct  # noqa: E402

METHOD = "/v1.DRAPlugin/NodePrepareResources"
MODES = ("sync-pool", "aio-inline", "aio-thread")


def _handler(work_s: float, io_s: float) -> Any:
    from driver.plumbing.gen import dra_v1_pb2

    def prepare(request: Any) -> Any:
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:
            pass
        if io_s:
            time.sleep(io_s)
        resp = dra_v1_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            resp.claims[c.uid].devices.add(pool_name="p", device_name="d", cdi_device_ids=["a"])
        return resp

    return prepare


def serve(mode: str, path: str, work_s: float, io_s: float, ready: Any) -> None:
    import grpc

    from driver.plumbing.gen import dra_v1_pb2

    prepare = _handler(work_s, io_s)
    kwargs = {
        "request_deserializer": dra_v1_pb2.NodePrepareResourcesRequest.FromString,
        "response_serializer": dra_v1_pb2.NodePrepareResourcesResponse.SerializeToString,
    }
    if mode == "sync-pool":
        from concurrent import futures

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: prepare(req), **kwargs)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "v1.DRAPlugin", {"NodePrepareResources": handler}
                ),
            )
        )
        server.add_insecure_port(f"unix://{path}")
        server.start()
        ready.set()
        server.wait_for_termination()
        return
    import asyncio
    from concurrent import futures

    async def main() -> None:
        pool = futures.ThreadPoolExecutor(max_workers=16)
        loop = asyncio.get_running_loop()

        async def inline(req: Any, ctx: Any) -> Any:
            return prepare(req)

        async def threaded(req: Any, ctx: Any) -> Any:
            return await loop.run_in_executor(pool, prepare, req)

        server = grpc.aio.server()
        fn = inline if mode == "aio-inline" else threaded
        handler = grpc.unary_unary_rpc_method_handler(fn, **kwargs)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "v1.DRAPlugin", {"NodePrepareResources": handler}
                ),
            )
        )
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--work-ms", type=float, default=0.3)
    ap.add_argument("--io-ms", type=float, default=1.5)
    args = ap.parse_args()
    import grpc

    from driver.plumbing.gen import dra_v1_pb2

    ctx = multiprocessing.get_context("spawn")
    procs = []
    stubs = {}
    with tempfile.TemporaryDirectory(prefix="tsb-grpc-") as d:
        try:
            for mode in MODES:
                path = f"{d}/{mode}.sock"
                ready = ctx.Event()
                p = ctx.Process(
                    target=serve,
                    args=(mode, path, args.work_ms / 1e3, args.io_ms / 1e3, ready),
                    daemon=True,
                )
                p.start()
                procs.append(p)
                if not ready.wait(30):
                    raise RuntimeError(f"{mode} server did not start")
                channel = grpc.insecure_channel(f"unix://{path}")
                stubs[mode] = channel.unary_unary(
                    METHOD,
                    request_serializer=dra_v1_pb2.NodePrepareResourcesRequest.SerializeToString,
                    response_deserializer=dra_v1_pb2.NodePrepareResourcesResponse.FromString,
                )
            req = dra_v1_pb2.NodePrepareResourcesRequest()
            req.claims.add(namespace="ns", name="c", uid="u")
            times: dict[str, list[float]] = {m: [] for m in MODES}
            for k in range(args.calls + args.warmup):
                order = MODES if k % 2 else tuple(reversed(MODES))
                for mode in order:
                    t = time.perf_counter()
                    stubs[mode](req, timeout=10)
                    if k >= args.warmup:
                        times[mode].append(time.perf_counter() - t)
        finally:
            for p in procs:
                p.kill()
    print(
        f"unary DRA call over a unix socket, handler {args.work_ms} ms CPU + "
        f"{args.io_ms} ms sleep, {args.calls} calls each, taking turns"
    )
    base = pct(times["sync-pool"], 50)
    for mode in MODES:
        t = times[mode]
        over = pct(t, 50) * 1e3 - args.work_ms - args.io_ms
        print(
            f"{mode:12} p50 {pct(t, 50) * 1e3:6.3f} ms  p99 {pct(t, 99) * 1e3:6.3f} ms  "
            f"(p50 above the handler's own time: {over:.3f} ms; "
            f"x{pct(t, 50) / base:.2f} of sync-pool)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
