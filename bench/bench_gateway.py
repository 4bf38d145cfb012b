"""The embedding gateway: POST /v1/embeddings with one sentence per request at concurrency 1, 32 and 256
(closed loop over HTTP, bench/http_load.py), beside the same sentences sent straight to `text_embedding`
over gRPC (bench/perf.py) in the same run. Per level: req/s, p50/p95, errors, the gateway/direct
throughput ratio, and the CPU share of the gateway process and of tritonserver + its stubs.
Goal (issue 10): gateway >= 0.8x direct gRPC at concurrency 32, no errors at 256.

    python -m bench.suite --only gateway [--url HOST:GRPC_PORT] [--window 8] [--quick]

bench/suite.py starts the tritonserver (or uses --url); `run(ctx)` starts a gateway in front of it.
"""
from __future__ import annotations

import itertools
import os
import tempfile
import time
from pathlib import Path

import psutil

from bench.bench_text_embedding import corpus
from bench.http_load import run_http_load
from bench.perf import LoadResult, format_report, run_load, text_inputs_factory
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from supervisor.processes import process_tree

MODELS = ["text_embedding"]
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"  # the gateway's name for text_embedding
LEVELS = (1, 32, 256)


class CpuShare:
    """CPU seconds used by some processes over a wall-clock span, as a share of one core."""

    def __init__(self, pids: list[int]):
        self.processes = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
        self.start_wall, self.start_cpu = time.monotonic(), self._cpu()

    def _cpu(self) -> float:
        total = 0.0
        for p in self.processes:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
        return total

    def share(self) -> float:
        return (self._cpu() - self.start_cpu) / max(time.monotonic() - self.start_wall, 1e-9)


def body_factory(texts: list[str]):
    items = itertools.cycle(texts)
    return lambda: {"model": MODEL_ID, "input": next(items)}


def compare(grpc_url: str, gateway: GatewayProcess, server_pid: int | None, window: float, warmup: float,
            levels=LEVELS) -> list[tuple[int, LoadResult, LoadResult]]:
    texts = corpus()
    rows = []
    for concurrency in levels:
        server_cpu = CpuShare(process_tree(server_pid)) if server_pid else None
        direct = run_load(grpc_url, "text_embedding", text_inputs_factory(texts), concurrency, window, warmup)
        direct_server = server_cpu.share() if server_cpu else float("nan")
        print(f"---- direct gRPC text_embedding, concurrency {concurrency} "
              f"(tritonserver+stubs CPU {direct_server:.0%} of a core)")
        print(format_report(direct), flush=True)
        gateway_cpu, client_cpu = CpuShare([gateway.process.pid]), CpuShare([os.getpid()])
        server_cpu = CpuShare(process_tree(server_pid)) if server_pid else None
        served = run_http_load(f"{gateway.url}/v1/embeddings", body_factory(texts), concurrency, window, warmup,
                               label="gateway /v1/embeddings")
        cpu, server_share = gateway_cpu.share(), server_cpu.share() if server_cpu else float("nan")
        print(f"---- gateway POST /v1/embeddings, concurrency {concurrency} (gateway CPU {cpu:.0%} of a core, "
              f"tritonserver+stubs {server_share:.0%}, this HTTP client {client_cpu.share():.0%})")
        print(format_report(served))
        ratio = served.throughput / direct.throughput if direct.throughput else float("nan")
        print(f"  gateway/direct throughput: {ratio:.2f}\n", flush=True)
        rows.append((concurrency, direct, served, cpu, ratio))
    print("summary: concurrency | direct req/s p50 p95 ms errors | gateway req/s p50 p95 ms errors | ratio | gateway CPU")
    for concurrency, direct, served, cpu, ratio in rows:
        print(f"  {concurrency:4d} | {direct.throughput:7.1f} {direct.percentile(50) * 1e3:7.1f} "
              f"{direct.percentile(95) * 1e3:7.1f} {direct.errors:4d} | {served.throughput:7.1f} "
              f"{served.percentile(50) * 1e3:7.1f} {served.percentile(95) * 1e3:7.1f} {served.errors:4d} | "
              f"{ratio:.2f} | {cpu:.0%}")
    print(flush=True)
    return rows


def start_gateway(grpc_url: str, data_dir: Path) -> GatewayProcess:
    """A gateway in front of `grpc_url` serving only the shipped model (nothing preloaded)."""
    gateway = GatewayProcess(grpc_url, port=free_port(), data_dir=data_dir, env={"PRELOAD_MODELS": ""},
                             log_file=data_dir / "gateway.log")
    return gateway.start(timeout=180)


def run(ctx) -> None:
    with tempfile.TemporaryDirectory() as data:
        gateway = start_gateway(ctx.grpc_url, Path(data))
        try:
            compare(ctx.grpc_url, gateway, ctx.server_pid, ctx.window, ctx.warmup,
                    (1, 32) if ctx.quick else LEVELS)
        finally:
            gateway.stop()
