"""HTTP exporter throughput and latency: ``/v1/topology`` 200 and 304, and ``/metrics``.

Starts ``toposlice serve --fake MACHINE`` in its own process with its discovery loop running
(``--rediscover-interval``, default every second), then drives ``/v1/topology`` from other
processes, for 200 and for 304 (If-None-Match):

* throughput: ``wrk`` (Debian package) saturating the server; its p99 there is queueing;
* latency: ``hey`` (Debian package) offering the target rates (1,000 req/s of 200, 5,000
  req/s of 304) and reporting p99;
* ``/metrics``: 50 sequential scrapes.

A multi-process Python client stands in when wrk/hey are absent. Each round is printed and
the median of ``--repeat`` rounds is judged against the targets (2-core machine): 304 >= 5,000
req/s, 200 >= 1,000 req/s, p99 <= 10 ms, /metrics scrape <= 20 ms on dgx-h100.

    python3 bench/http.py [--machine dgx-h100] [--seconds 8] [--repeat 3] [--discover-in-process]
"""

from __future__ import annotations

import sys

# This file is named http.py: drop its own directory from the path so that ``http`` below
# is the standard library's package.
if sys.path and sys.path[0] == __import__("os").path.dirname(
    __import__("os").path.abspath(__file__)
):
    sys.path.pop(0)

import argparse
import http.client
import multiprocessing as mp
import os
import re
import shutil
import socket
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("serve did not become ready")


def get(
    port: int, path: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body, dict(resp.getheaders())


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def run_wrk(url: str, seconds: int, connections: int, header: str | None) -> tuple[float, float]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    if header:
        cmd[1:1] = ["-H", header]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"wrk saw {errors.group(1)} error responses:\n{out}")
    return rps, p99


def run_hey(
    url: str, seconds: int, rate: int, workers: int, header: str | None
) -> tuple[float, float, str]:
    """Constant offered load (``rate`` req/s over ``workers``): (achieved req/s, p99 ms,
    status histogram). hey asks for gzip unless told not to; the identity body is measured."""
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(workers), "-q", str(max(1, rate // workers))]
    cmd += ["-disable-compression"]
    if header:
        cmd += ["-H", header]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = float(re.search(r"99%+ in ([\d.]+) secs", out).group(1)) * 1000  # type: ignore[union-attr]
    codes = " ".join(re.findall(r"\[(\d+)\]\s+(\d+) responses", out).__iter__().__next__())
    return rps, p99, codes


def _client(port: int, path: str, headers: dict[str, str], seconds: float, q: mp.Queue) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        conn.request("GET", path, headers=headers)
        conn.getresponse().read()
        lat.append(time.perf_counter() - t)
    q.put(lat)


def run_python(
    port: int, path: str, headers: dict[str, str], seconds: int, procs: int
) -> tuple[float, float]:
    q: mp.Queue = mp.Queue()
    ps = [mp.Process(target=_client, args=(port, path, headers, seconds, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    lat = [x for _ in ps for x in q.get()]
    for p in ps:
        p.join()
    lat.sort()
    return len(lat) / seconds, lat[int(len(lat) * 0.99)] * 1000


def scrape_times(port: int, n: int = 50) -> tuple[float, float, float, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    times = []
    size = 0
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", "/metrics")
        size = len(conn.getresponse().read())
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.99)], times[-1], size


def measure(
    port: int, url: str, etag: str, args: argparse.Namespace, use_wrk: bool
) -> dict[str, float]:
    """One round: saturating throughput, p99 at the target rates, /metrics scrape times."""
    out: dict[str, float] = {}
    for name, hdr in (("200", None), ("304", f"If-None-Match: {etag}")):
        if use_wrk:
            rps, p99 = run_wrk(url, args.seconds, args.connections, hdr)
        else:
            h = {"If-None-Match": etag} if hdr else {}
            rps, p99 = run_python(port, "/v1/topology", h, args.seconds, args.connections)
        out[f"rps{name}"], out[f"sat{name}"] = rps, p99
        print(f"    saturating {name}: {rps:>9,.0f} req/s   p99 {p99:6.2f} ms (queueing)")
    for name, hdr, rate in (("200", None, 1000), ("304", f"If-None-Match: {etag}", 5000)):
        if shutil.which("hey") and not args.python_client:
            rps, p99, codes = run_hey(url, args.seconds, rate, 20, hdr)
            print(
                f"    {rate} req/s offered {name}: {rps:>7,.0f} req/s   "
                f"p99 {p99:6.2f} ms  ({codes})"
            )
        else:
            p99, codes = out[f"sat{name}"], "saturating"
        out[f"lat{name}"] = p99
    p50, p99, worst, size = scrape_times(port)
    out["scrape99"] = p99
    print(
        f"    /metrics: {size} bytes, scrape p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {worst:.2f} ms"
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="dgx-h100")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument(
        "--rediscover-interval",
        type=float,
        default=1.0,
        help="serve's discovery loop period during the run (default %(default)s s)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the median is judged")
    ap.add_argument("--python-client", action="store_true", help="do not use wrk or hey")
    ap.add_argument(
        "--discover-in-process",
        action="store_true",
        help="run serve's discovery in the server process (as a daemon thread would)",
    )
    args = ap.parse_args()

    port = free_port()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toposlice",
            "-q",
            "serve",
            "--fake",
            args.machine,
            "--http-addr",
            f"127.0.0.1:{port}",
            "--rediscover-interval",
            str(args.rediscover_interval),
            *(["--discover-in-process"] if args.discover_in_process else []),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_ready(port)
        status, body, headers = get(port, "/v1/topology")
        assert status == 200, status
        etag = headers["ETag"]
        status, _, _ = get(port, "/v1/topology", {"If-None-Match": etag})
        assert status == 304, status
        url = f"http://127.0.0.1:{port}/v1/topology"
        use_wrk = shutil.which("wrk") is not None and not args.python_client
        tool = f"wrk -t1 -c{args.connections}" if use_wrk else f"python x{args.connections} procs"
        print(
            f"machine {args.machine}: /v1/topology {len(body)} bytes, discovery every "
            f"{args.rediscover_interval} s "
            f"({'in the server process' if args.discover_in_process else 'helper process'}), "
            f"load: {tool}, {args.seconds} s, load average {os.getloadavg()[0]:.1f}"
        )
        rounds = []
        for i in range(args.repeat):
            print(f"  round {i + 1}/{args.repeat} (load average {os.getloadavg()[0]:.1f}):")
            rounds.append(measure(port, url, etag, args, use_wrk))
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        print(
            f"  median of {args.repeat}: 200 {med['rps200']:,.0f} req/s, 304 {med['rps304']:,.0f}"
            f" req/s; p99 at target rate 200 {med['lat200']:.2f} ms, 304 {med['lat304']:.2f} ms;"
            f" /metrics p99 {med['scrape99']:.2f} ms"
        )
        ok = (
            med["rps304"] >= 5000
            and med["rps200"] >= 1000
            and max(med["lat200"], med["lat304"]) <= 10
            and med["scrape99"] <= 20
        )
        print("targets met" if ok else "TARGETS MISSED")
        return 0 if ok else 1
    finally:
        serve.terminate()
        serve.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())
