"""Closed-loop HTTP load (the HTTP twin of bench/perf.py's gRPC `run_load`, both over bench/load.py):
`concurrency` clients each send their next request as soon as the last returns; every request that ends
inside the window counts. Used for the gateway and for the FastAPI peer, so both are measured the same way."""
from __future__ import annotations

import asyncio
import os
from typing import Callable

import aiohttp

from bench import load
from bench.load import LoadResult

BodyFactory = Callable[[], dict]  # a fresh JSON body for one request


Target = tuple[str, dict[str, str]]  # a URL and the headers its requests carry


async def _closed_loop(targets: list[Target], make_body: BodyFactory, concurrency: int, warmup: float,
                       window: float) -> load.Run:
    """Each client sends its requests to the targets in turn (client i starts at target i: its request of turn t
    goes to target (i + t) mod n), so with two targets both see the same moments of the same box."""
    # aiohttp, not httpx: httpx's connection pool was the bottleneck at 256 connections here (50 req/s
    # where aiohttp drove the same gateway at 144 with the client's CPU to spare)
    connector = aiohttp.TCPConnector(limit=concurrency * len(targets))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as client:
        async def request(call: load.Call) -> None:
            url, headers = targets[target_of(call, len(targets))]
            async with client.post(url, json=make_body(), headers=headers) as response:
                body = await response.read()
            if response.status != 200:
                raise load.Failed(f"HTTP {response.status}: {body[:200]!r}")

        return await load.run_async(request, concurrency, duration=window, warmup=warmup)


def target_of(call: load.Call, targets: int) -> int:
    return (call.worker + call.turn) % targets


def bearer(api_key: str | None) -> dict[str, str]:
    """`api_key` (else $GATEWAY_API_KEY) as `Authorization: Bearer`."""
    return {"Authorization": f"Bearer {key}"} if (key := api_key or os.environ.get("GATEWAY_API_KEY")) else {}


def run_http_load(url: str, make_body: BodyFactory, concurrency: int, window: float = 10.0, warmup: float = 2.0,
                  label: str = "http", rows_per_request: int = 1, api_key: str | None = None) -> LoadResult:
    """`api_key` (else $GATEWAY_API_KEY) goes as `Authorization: Bearer`."""
    run = asyncio.run(_closed_loop([(url, bearer(api_key))], make_body, concurrency, warmup, window))
    return LoadResult.of(label, concurrency, run, rows_per_request)


def run_http_load_interleaved(targets: dict[str, Target], make_body: BodyFactory, concurrency: int,
                              window: float = 10.0, warmup: float = 2.0) -> dict[str, LoadResult]:
    """One closed loop of `concurrency` clients, each sending its requests to every target in turn: the
    targets share every moment of the box's drift, so their latencies compare request for request."""
    run = asyncio.run(_closed_loop(list(targets.values()), make_body, concurrency, warmup, window))
    out = {}
    for i, label in enumerate(targets):
        mine = load.Run(run.started, run.window_from, run.window_to,
                        [r for r in run.every if target_of(r, len(targets)) == i], run.ended)
        out[label] = LoadResult.of(label, concurrency, mine)
    return out
