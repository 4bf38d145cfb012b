"""Closed-loop HTTP load (the HTTP twin of bench/perf.py's gRPC `run_load`): `concurrency` clients
each send their next request as soon as the last returns; every request that ends inside the window
counts. Used for the gateway and for the FastAPI peer, so both are measured the same way."""
from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Callable

import aiohttp

from perf import LoadResult

BodyFactory = Callable[[], dict]  # a fresh JSON body for one request


Target = tuple[str, dict[str, str]]  # a URL and the headers its requests carry


async def _closed_loop(targets: list[Target], make_body: BodyFactory, concurrency: int, warmup: float,
                       window: float) -> list[tuple[list[float], int, str]]:
    """(latencies, errors, first error) per target. Each client sends its requests to the targets in turn
    (client i starts at target i), so with two targets both see the same moments of the same box."""
    results = [([], 0, "") for _ in targets]
    start = time.perf_counter()
    measure_from, measure_to = start + warmup, start + warmup + window
    # aiohttp, not httpx: httpx's connection pool was the bottleneck at 256 connections here (50 req/s
    # where aiohttp drove the same gateway at 144 with the client's CPU to spare)
    connector = aiohttp.TCPConnector(limit=concurrency * len(targets))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as client:
        async def worker(first: int):
            for turn in itertools.count(first):
                index = turn % len(targets)
                url, headers = targets[index]
                t0 = time.perf_counter()
                if t0 >= measure_to:
                    return
                error = ""
                try:
                    async with client.post(url, json=make_body(), headers=headers) as response:
                        body = await response.read()
                    if response.status != 200:
                        error = f"HTTP {response.status}: {body[:200]!r}"
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    error = f"{type(e).__name__}: {e}"
                t1 = time.perf_counter()
                if measure_from <= t1 <= measure_to:
                    latencies, errors, first_error = results[index]
                    if error:
                        results[index] = (latencies, errors + 1, first_error or error)
                    else:
                        latencies.append(t1 - t0)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return results


def bearer(api_key: str | None) -> dict[str, str]:
    """`api_key` (else $GATEWAY_API_KEY) as `Authorization: Bearer`."""
    return {"Authorization": f"Bearer {key}"} if (key := api_key or os.environ.get("GATEWAY_API_KEY")) else {}


def run_http_load(url: str, make_body: BodyFactory, concurrency: int, window: float = 10.0, warmup: float = 2.0,
                  label: str = "http", rows_per_request: int = 1, api_key: str | None = None) -> LoadResult:
    """`api_key` (else $GATEWAY_API_KEY) goes as `Authorization: Bearer`."""
    [(latencies, errors, first_error)] = asyncio.run(
        _closed_loop([(url, bearer(api_key))], make_body, concurrency, warmup, window))
    return LoadResult(label, concurrency, window, latencies, errors, rows_per_request, first_error, {})


def run_http_load_interleaved(targets: dict[str, Target], make_body: BodyFactory, concurrency: int,
                              window: float = 10.0, warmup: float = 2.0) -> dict[str, LoadResult]:
    """One closed loop of `concurrency` clients, each sending its requests to every target in turn: the
    targets share every moment of the box's drift, so their latencies compare request for request."""
    found = asyncio.run(_closed_loop(list(targets.values()), make_body, concurrency, warmup, window))
    return {label: LoadResult(label, concurrency, window, latencies, errors, 1, first_error, {})
            for label, (latencies, errors, first_error) in zip(targets, found)}
