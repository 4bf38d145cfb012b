"""Completions through the gateway (POST /v1/completions, stream=true) beside the same load sent
straight to `codegen_stream` over gRPC, in the same run: output lengths 8/32/128/512 at concurrency 1
and 16 (the seed's lengths), closed loop. Per row: requests/s, tokens/s, time to first token p50/p95,
inter-token latency p50 (per request: (last piece - first piece) / (tokens - 1)). Goal: the gateway
costs <= 5% of tokens/s and <= 2 ms of TTFT p50.

    python -m bench.suite --only completions [--url HOST:GRPC_PORT] [--window 8] [--quick]

bench/suite.py starts the tritonserver (or uses --url); `run(ctx)` starts a gateway in front of it.
"""
from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp

from bench import load, stats
from bench.load import LoadResult
from gateway.completions.tensors import STREAM_MODEL, sequence_inputs
from gateway.triton.engine import TritonEngine
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port

MODELS = ["codegen_generator", "codegen", "codegen_stream"]
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n\ndef main(argv):\n",
           "class LRUCache:\n    def __init__(self, capacity):\n", "# parse a CSV file\nwith open(path) as f:\n"]
LENGTHS = (8, 32, 128, 512)
CONCURRENCY = (1, 16)
STEP_SECONDS = 0.004  # one decode step of the demo GPT-J, one row (bench/bench_codegen.py)


@dataclass
class Timing:
    """One streamed request: seconds from send to the first piece, from the first to the last piece,
    and tokens generated."""
    ttft: float
    span: float
    tokens: int
    total: float
    t0: float = 0.0  # perf_counter() when it was sent

    def tokens_between(self, start: float, end: float) -> float:
        """Tokens that arrived in [start, end]: the first at the first piece, the rest spread evenly
        to the last piece (a request's tokens count for the part of it inside the window, so a long
        request ending just after the window is not lost, nor one ending inside it counted whole)."""
        first = self.t0 + self.ttft
        last = first + self.span
        count = float(start <= first <= end)
        if self.tokens > 1:
            if self.span > 0:
                overlap = max(0.0, min(end, last) - max(start, first))
                count += (self.tokens - 1) * overlap / self.span
            else:
                count += (self.tokens - 1) * float(start <= last <= end)
        return count


@dataclass
class StreamLoad(LoadResult):
    timings: list[Timing] = field(default_factory=list)  # requests that ended inside the window
    every: list[Timing] = field(default_factory=list)  # every request sent, for tokens inside the window
    window_from: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        end = self.window_from + self.seconds
        return sum(t.tokens_between(self.window_from, end) for t in self.every) / self.seconds

    def ttft_ms(self, p: float) -> float:
        return stats.percentile([t.ttft for t in self.timings], p) * 1e3

    @property
    def itl_ms(self) -> float:
        return stats.median([t.span / (t.tokens - 1) for t in self.timings if t.tokens > 1]) * 1e3


OneRequest = Callable[[str, int], Awaitable[Timing]]


async def _closed_loop(one: OneRequest, max_tokens: int, concurrency: int, warmup: float, window: float) -> load.Run:
    """bench/load.py's closed loop: every request that ends inside the window counts (requests/s, latency);
    tokens/s counts the tokens that arrived inside it, from every request (Timing.tokens_between)."""
    async def request(call: load.Call) -> Timing:
        return await one(PROMPTS[call.index % len(PROMPTS)], max_tokens)

    return await load.run_async(request, concurrency, duration=window, warmup=warmup)


def grpc_request(engine: TritonEngine) -> OneRequest:
    """Straight to codegen_stream: the gateway's own gRPC streaming call, without the gateway."""
    async def one(prompt: str, max_tokens: int) -> Timing:
        t0 = time.perf_counter()
        first = last = None
        tokens = pieces = 0
        async for response in engine.stream_infer(
                STREAM_MODEL, sequence_inputs(prompt, max_tokens, 0.0, 1.0, 0, [])):
            text = response.outputs.get("text_output")
            if text is not None and text.reshape(-1)[0]:
                last = time.perf_counter()
                first, pieces = first or last, pieces + 1
            counted = response.outputs.get("completion_tokens")
            tokens = int(counted.reshape(-1)[0]) if counted is not None else tokens
        end = time.perf_counter()
        first, last = first or end, last or end
        return Timing(first - t0, last - first, tokens or pieces, end - t0, t0)
    return one


def http_request(session: aiohttp.ClientSession, url: str) -> OneRequest:
    """POST /v1/completions with stream=true and include_usage, read as server-sent events (aiohttp:
    the lighter client, as bench/http_load.py; httpx measured 1.5-3 ms more time to first token here)."""
    async def one(prompt: str, max_tokens: int) -> Timing:
        body = {"model": "codegen", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        first = last = None
        tokens = pieces = 0
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {(await response.read())[:200]!r}")
            async for raw in response.content:  # one SSE line at a time
                line = raw.decode().rstrip("\n")
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(event["error"]["message"])
                if event["choices"] and event["choices"][0]["text"]:
                    last = time.perf_counter()
                    first, pieces = first or last, pieces + 1
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
        end = time.perf_counter()
        first, last = first or end, last or end
        return Timing(first - t0, last - first, tokens or pieces, end - t0, t0)
    return one


async def _measure(label: str, grpc_url: str, gateway_url: str | None, max_tokens: int, concurrency: int,
                   warmup: float, window: float) -> StreamLoad:
    if gateway_url is None:
        engine = TritonEngine(grpc_url)
        try:
            run = await _closed_loop(grpc_request(engine), max_tokens, concurrency, warmup, window)
        finally:
            await engine.close()
    else:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            run = await _closed_loop(http_request(session, gateway_url), max_tokens, concurrency, warmup, window)
    timings = [r.value for r in run.records if r.ok]
    return StreamLoad(label, concurrency, run.seconds, [t.total for t in timings], run.errors, 1, run.first_error, {},
                      timings, [r.value for r in run.every if r.ok], run.window_from)


def window_for(max_tokens: int, concurrency: int, window: float) -> float:
    """Long enough for several whole requests (requests/s and latency count those that end inside it)."""
    return max(window, 5 * STEP_SECONDS * max_tokens * (1 + concurrency / 8))


def row(result: StreamLoad, max_tokens: int) -> str:
    return (f"{result.model:>7} {max_tokens:4d} {result.concurrency:3d} {result.throughput:8.2f} "
            f"{result.tokens_per_s:9.1f} {result.ttft_ms(50):8.1f} {result.ttft_ms(95):8.1f} {result.itl_ms:7.2f}"
            f" {len(result.timings):5d}" + (f"  errors {result.errors}: {result.first_error[:120]}" if result.errors else ""))


def compare(grpc_url: str, gateway_url: str, window: float, warmup: float, quick: bool = False) -> list[dict]:
    lengths = (8, 128) if quick else LENGTHS
    print("   path  out   c    req/s  tokens/s  TTFT p50  TTFT p95  ITL p50  reqs   (ms)", flush=True)
    out = []
    for max_tokens in lengths:
        for concurrency in CONCURRENCY:
            w = window_for(max_tokens, concurrency, window)
            direct = asyncio.run(_measure("grpc", grpc_url, None, max_tokens, concurrency, warmup, w))
            print(row(direct, max_tokens), flush=True)
            via = asyncio.run(_measure("gateway", grpc_url, gateway_url, max_tokens, concurrency, warmup, w))
            print(row(via, max_tokens), flush=True)
            cost = 100 * (1 - via.tokens_per_s / direct.tokens_per_s) if direct.tokens_per_s else float("nan")
            extra_ttft = via.ttft_ms(50) - direct.ttft_ms(50)
            print(f"         gateway cost: {cost:+.1f}% of tokens/s (goal <= 5%), {extra_ttft:+.2f} ms of TTFT p50 "
                  f"(goal <= 2 ms)", flush=True)
            out.append({"max_tokens": max_tokens, "concurrency": concurrency, "cost_pct": cost,
                        "extra_ttft_ms": extra_ttft})
    met = [r for r in out if r["cost_pct"] <= 5 and r["extra_ttft_ms"] <= 2]
    print(f"\ngoals met in {len(met)} of {len(out)} rows", flush=True)
    return out


def run(ctx) -> None:
    """The `make bench` entry: a gateway in front of the bench's tritonserver."""
    with tempfile.TemporaryDirectory() as data:
        gateway = GatewayProcess(ctx.grpc_url, port=free_port(), data_dir=Path(data),
                                 log_file=Path(data) / "gateway.log")
        gateway.start(timeout=180)
        try:
            compare(ctx.grpc_url, gateway.url, ctx.window, ctx.warmup, ctx.quick)
        finally:
            gateway.stop()
