"""``toposlice scorer serve``: the placement scorer as a kube-scheduler extender."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


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
    s.add_argument("-v", "--verbose", action="store_true", help="log every request (debug)")


def run(args: argparse.Namespace) -> int:
    from driver.config import parse_http_addr

    host, port = parse_http_addr(args.http_addr)  # bad: exit 2 before any work
    from scorer.extender import Extender, KubeReader, NodeGraphs, make_server
    from scorer.topology import read_graph_file
    from toposlice.cmd_score import fake_node

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    static: dict[str, dict[str, Any]] = {}
    for f in args.graph:
        g = read_graph_file(f)
        static[str(g.get("node"))] = g
    for spec in args.fake:
        g, _ = fake_node(spec)
        static[str(g["node"])] = g
    graphs = NodeGraphs(static=static, url_template=args.topology_url or None)
    reader = None
    if not args.no_kube:
        from kubernetes.config import ConfigException

        try:
            reader = KubeReader()
        except (ConfigException, OSError, TypeError, ValueError) as exc:
            msg = " ".join(str(exc).split())
            raise ValueError(
                f"cannot reach the cluster's ResourceClaims ({msg}): run in-cluster, set "
                "$KUBECONFIG, or give --no-kube"
            ) from exc
    ext = Extender(
        graphs,
        reader=reader.read if reader else None,
        occupancy=reader.occupancy if reader else None,
        driver=args.driver,
    )
    try:
        server = make_server(ext, host, port)
    except OSError as exc:  # in use, or not this host's address: a runtime failure
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        print(
            f"toposlice: error: --http-addr {args.http_addr}: cannot listen on {where}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    print(f"toposlice scorer: serving on {host}:{server.server_address[1]}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C: quiet, and 130 as a shell expects
        return 130
    finally:
        server.server_close()
    return 0
