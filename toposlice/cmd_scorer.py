"""``toposlice scorer serve``: the placement scorer as a kube-scheduler extender."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from driver.plumbing.logs import add_log_args, setup_from_args

log = logging.getLogger("toposlice.scorer")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from toposlice.cli import EXAMPLES, examples

    sub = p.add_subparsers(dest="scorer_command", required=True)
    s = sub.add_parser(
        "serve",
        help="serve filter/prioritize for kube-scheduler",
        description="Serve the placement scorer's filter and prioritize verbs as a "
        "kube-scheduler extender.",
        epilog=examples(*EXAMPLES["scorer"]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "--http-addr",
        default="0.0.0.0:8090",
        metavar="HOST:PORT",
        help="listen address (default %(default)s; port 0 picks a free one)",
    )
    s.add_argument(
        "--topology-url",
        default="http://{address}:8080/v1/topology",
        metavar="TEMPLATE",
        help="each node's graph URL; {node} = name, {address} = InternalIP (default %(default)s)",
    )
    s.add_argument(
        "--graph", action="append", default=[], metavar="FILE", help="fixed graphs (repeatable)"
    )
    s.add_argument(
        "--fake", action="append", default=[], metavar="NAME[:NODE]", help="fake-machine graphs"
    )
    s.add_argument(
        "--no-kube",
        action="store_true",
        help="do not read ResourceClaims from the API (workload from annotations only)",
    )
    s.add_argument("--driver", default="toposlice.dev", help="DRA driver name")
    s.add_argument(
        "--fetch-workers",
        type=int,
        default=8,
        metavar="N",
        help="graph fetches run at once, in the background (default %(default)s)",
    )
    s.add_argument("-v", "--verbose", action="store_true", help="same as --log-level debug")
    add_log_args(s)


def _api_client() -> Any:
    """In-cluster when running in a pod, else ``$KUBECONFIG`` or ``~/.kube/config``."""
    from driver.plumbing.kube import build_api_client

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return build_api_client(None)
    path = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not Path(path).is_file():
        raise ValueError(f"no kubeconfig at {path}")
    return build_api_client(path.split(os.pathsep)[0])


def run(args: argparse.Namespace) -> int:
    from driver.plumbing.checks import parse_http_addr

    host, port = parse_http_addr(args.http_addr)  # bad: exit 2 before any work
    if args.fetch_workers < 1:
        raise ValueError(f"--fetch-workers {args.fetch_workers}: must be at least 1")
    from scorer.cluster_cache import ClusterCache
    from scorer.extender import Extender
    from scorer.extender_server import ExtenderServer, serve
    from scorer.graph_source import GraphSource
    from scorer.topology import read_graph_file
    from toposlice.cmd_score import fake_node

    setup_from_args(args, verbose=args.verbose)
    static: dict[str, dict[str, Any]] = {}
    for f in args.graph:
        g = read_graph_file(f)
        static[str(g.get("node"))] = g
    for spec in args.fake:
        g, _ = fake_node(spec)
        static[str(g["node"])] = g
    graphs = GraphSource(static, url_template=args.topology_url or None, workers=args.fetch_workers)
    cache = ClusterCache(args.driver, graphs)
    client = None
    if not args.no_kube:
        try:
            client = _api_client()
        except (RuntimeError, OSError, TypeError, ValueError) as exc:
            msg = " ".join(str(exc).split())
            raise ValueError(
                f"cannot reach the cluster's ResourceClaims ({msg}): run in-cluster, set "
                "$KUBECONFIG, or give --no-kube"
            ) from exc
    server = ExtenderServer(
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        Extender(cache),
        ready=cache.synced,
    )
    # The informers exist (unsynced) before the first call can arrive: a cache with none
    # reads as synced, and a call answered from it would pass every node.
    if client is not None:
        cache.start_informers(client)
    try:
        server.start()
    except OSError as exc:  # in use, or not this host's address: a runtime failure
        cache.stop()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        print(
            f"toposlice: error: --http-addr {args.http_addr}: cannot listen on {where}: "
            f"{os.strerror(exc.errno) if exc.errno else exc}",
            file=sys.stderr,
        )
        return 1
    graphs.start()
    log.info("serving on %s:%d", host, server.address[1])
    try:
        serve(server)
    except KeyboardInterrupt:  # Ctrl-C: quiet, and 130 as a shell expects
        return 130
    finally:
        server.stop()
        cache.stop()
    return 0
