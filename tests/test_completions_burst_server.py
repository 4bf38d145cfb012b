"""Issue 55: a burst of 256 concurrent streams on the demo model through the live gateway, every one served (200
and its `[DONE]`), none refused: the sequences beyond the completion slots wait in the gateway's queue
(gateway/triton/fair_slots.py) instead of meeting codegen_stream's 64 threads. Kept light: 2 tokens each."""
from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = pytest.mark.integration
STREAMS = 256  # the gateway's default MAX_CONNECTIONS_PER_CLIENT: one connection each


def test_256_concurrent_streams_all_complete(gateway):
    gateway.triton.load("codegen_generator", "codegen", "codegen_stream")  # codegen: its codegen_preprocess

    async def burst():
        limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=600, limits=limits) as client:
            async def one(i: int):
                body = {"model": "codegen", "prompt": f"def f{i}(x):", "max_tokens": 2, "stream": True,
                        "temperature": 0}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    text = "".join([line async for line in response.aiter_lines()])
                    return response.status_code, text

            return await asyncio.gather(*(one(i) for i in range(STREAMS)), return_exceptions=True)

    results = asyncio.run(burst())
    failed = [r if isinstance(r, Exception) else r[1][:300] for r in results
              if isinstance(r, Exception) or r[0] != 200 or "[DONE]" not in r[1]]
    assert not failed, (len(failed), failed[:3], gateway.log_tail())
