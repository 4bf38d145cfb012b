"""What request bodies without Content-Length can pin (issue 25): 8 concurrent chunked 400 MB bodies to
POST /v1/embeddings (cap 16 MiB at the defaults), against a gateway per BODY_BUFFER_BYTES value, each
in front of the same Triton. Prints each body's status, the MiB it sent before the answer and the seconds
to it, and the gateway's RSS: idle, peak while the bodies arrive (sampled every 5 ms), and after.

    .venv/bin/python -m bench.bench_body_memory [--budgets 1073741824,46137344] [--bodies 8]
"""
from __future__ import annotations

import argparse
import select
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from gateway.middleware.body_budget import DEFAULT_BUDGET
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer

KEY = "gk-bench-body-0123456789"
BIG = 400_000_000
CHUNK = b"x" * (1 << 20)


def status_of(sock: socket.socket) -> int:
    line = b""
    while not line.endswith(b"\r\n"):
        piece = sock.recv(1)
        if not piece:
            return 0  # closed without an answer
        line += piece
    return int(line.split()[1])


def chunked_body(url: str) -> tuple[int, int, float]:
    """(status, bytes sent before the answer, seconds)"""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Authorization: Bearer {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        sent, piece = 0, b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n"
        while sent < BIG and not select.select([sock], [], [], 0)[0]:
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(CHUNK)
        return status_of(sock), sent, time.monotonic() - started


def warm_up(url: str) -> None:
    """Every code path of the measured requests once (auth, quotas, a refused body), so that lazy imports
    and first-use allocations are in the idle figure."""
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    httpx.get(f"{url}/v1/models", headers=headers, timeout=30).raise_for_status()
    for size in (1 << 20, 20 << 20):  # a body within the cap (404: no model) and one over it (413)
        httpx.post(f"{url}/v1/embeddings", headers={**headers, "Content-Type": "application/json"},
                   content=iter([b"x" * (64 << 10)] * (size >> 16)), timeout=60)


def measure(gateway: GatewayProcess, bodies: int) -> dict:
    warm_up(gateway.url)
    process = psutil.Process(gateway.process.pid)
    idle = process.memory_info().rss
    peak, done = idle, threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(bodies) as pool:
            results = list(pool.map(lambda _: chunked_body(gateway.url), range(bodies)))
    finally:
        done.set()
        sampler.join()
    time.sleep(0.5)
    return {"results": results, "idle": idle, "peak": peak, "after": process.memory_info().rss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default=f"{1 << 30},{DEFAULT_BUDGET}",
                        help="BODY_BUFFER_BYTES values, comma-separated (1 GiB: in effect no budget)")
    parser.add_argument("--bodies", type=int, default=8)
    args = parser.parse_args()
    from gateway.keys import key_line

    mib = 1 << 20
    with tempfile.TemporaryDirectory(prefix="bench-body-memory-") as tmp:
        tmp = Path(tmp)
        keys = tmp / "keys"
        keys.write_text(key_line(KEY, "bench", "inference"))
        with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          explicit_models=[], log_file=tmp / "tritonserver.log") as server:
            for budget in (int(b) for b in args.budgets.split(",")):
                gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=tmp / f"data-{budget}",
                                         log_file=tmp / f"gateway-{budget}.log",
                                         env={"GATEWAY_API_KEYS_FILE": str(keys), "BODY_BUFFER_BYTES": str(budget)})
                try:
                    gateway.start(timeout=180)
                    out = measure(gateway, args.bodies)
                finally:
                    gateway.stop()
                print(f"BODY_BUFFER_BYTES={budget} ({budget / mib:.0f} MiB), {args.bodies} chunked bodies:")
                print("  (status, MiB sent, s): " + ", ".join(f"({s}, {n // mib}, {t:.2f})" for s, n, t in out["results"]))
                print(f"  gateway RSS: idle {out['idle'] / mib:.1f} MiB, peak +{(out['peak'] - out['idle']) / mib:.1f} MiB, "
                      f"after +{(out['after'] - out['idle']) / mib:.1f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
