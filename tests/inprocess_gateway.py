"""The gateway app in this process, without Triton (bench/inprocess_gateway.py: a fake engine answers inference
with zero vectors and records what it was asked), runtime model generation stubbed here. Requests go through the
real routes, middleware and error handlers (httpx's ASGI transport) on the test's own event loop, so a test can
also watch that loop's latency while a request runs."""
from __future__ import annotations

import asyncio
import time

from bench.inprocess_gateway import FakeEngine, inprocess_gateway  # noqa: F401 - the tests' in-process gateway
from gateway import modelgen
from gateway.modelgen import ModelSpec


def stub_generation(monkeypatch, tmp_path) -> None:
    """Runtime loads produce a spec like a generated one's (CLIP: text and image ensembles) without files."""
    def generate(name, pretrained, kind, source, repository, export=None, limits=None):
        base = modelgen.triton_name(name, pretrained)
        clip = kind == "clip"
        return ModelSpec(model_name=name, pretrained=pretrained, kind=kind, dimension=8, max_tokens=16,
                         text_model=base + ("_text" if clip else ""), image_model=base + "_image" if clip else None,
                         triton_models=(base + "_text", base + "_image", base + "_encoder") if clip
                         else (base, base + "_encoder"), normalized=True)

    monkeypatch.setattr(modelgen, "resolve_source", lambda name, pretrained, kind, roots, hub_options=None: tmp_path)
    monkeypatch.setattr(modelgen, "generate", generate)


async def max_loop_gap(awaitable, tick_s: float = 0.005):
    """(result, longest stretch in seconds during which the event loop ran nothing else)."""
    gaps, done = [], asyncio.Event()

    async def ticker():
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(tick_s)
            now = time.perf_counter()
            gaps.append(now - last - tick_s)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker is running before the work starts
    try:
        result = await awaitable
    finally:
        done.set()
        await task
    return result, max(gaps, default=0.0)
