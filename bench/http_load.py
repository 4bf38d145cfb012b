"""Closed-loop HTTP load (the HTTP twin of bench/perf.py's gRPC `run_load`): `concurrency` clients
each send their next request as soon as the last returns; every request that ends inside the window
counts. Used for the gateway and for the FastAPI peer, so both are measured the same way."""
from __future__ import annotations

import asyncio
import os
import time
from typing import Callable

import aiohttp

from perf import LoadResult

BodyFactory = Callable[[], dict]  # a fresh JSON body for one request


async def _closed_loop(url: str, make_body: BodyFactory, concurrency: int, warmup: float,
                       window: float, headers: dict[str, str]) -> tuple[list[float], int, str]:
    latencies: list[float] = []
    errors = 0
    first_error = ""
    start = time.perf_counter()
    measure_from, measure_to = start + warmup, start + warmup + window
    # aiohttp, not httpx: httpx's connection pool was the bottleneck at 256 connections here (50 req/s
    # where aiohttp drove the same gateway at 144 with the client's CPU to spare)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300),
                                     headers=headers) as client:
        async def worker():
            nonlocal errors, first_error
            while True:
                t0 = time.perf_counter()
                if t0 >= measure_to:
                    return
                try:
                    async with client.post(url, json=make_body()) as response:
                        body = await response.read()
                    ok = response.status == 200
                    if not ok:
                        first_error = first_error or f"HTTP {response.status}: {body[:200]!r}"
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    ok, first_error = False, first_error or f"{type(e).__name__}: {e}"
                t1 = time.perf_counter()
                if measure_from <= t1 <= measure_to:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors, first_error


def run_http_load(url: str, make_body: BodyFactory, concurrency: int, window: float = 10.0, warmup: float = 2.0,
                  label: str = "http", rows_per_request: int = 1, api_key: str | None = None) -> LoadResult:
    """`api_key` (else $GATEWAY_API_KEY) goes as `Authorization: Bearer`."""
    headers = {"Authorization": f"Bearer {key}"} if (key := api_key or os.environ.get("GATEWAY_API_KEY")) else {}
    latencies, errors, first_error = asyncio.run(_closed_loop(url, make_body, concurrency, warmup, window, headers))
    return LoadResult(label, concurrency, window, latencies, errors, rows_per_request, first_error, {})
