"""Async handlers never block the event loop (issue 34, items 1-3): counting tokens for `usage`, base64
decoding and Pillow's header check, and a store's count run in worker threads. Each test makes the
blocking step slow on purpose (a sleep in the real function's place, or a store lock held by another
thread) and watches the loop: before the fix the loop stood still for the whole step."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from gateway.embedding import images
from gateway.embedding import embed as embeddings
from gateway.search.collections import CollectionInfo
from gateway.settings import Settings
from gateway_helpers import MINILM, b64, png_bytes
from inprocess_gateway import inprocess_gateway, max_loop_gap

STALL_S = 1.0  # how long each blocking step takes here
BOUND_S = 0.5  # the loop may pause this long at most (parsing, a noisy shared box), far below STALL_S


def slowed(monkeypatch, module, name: str) -> list[str]:
    """Make module.name take STALL_S longer (blocking, as CPU work does); returns the threads it ran on."""
    real, threads = getattr(module, name), []

    def slow(*args, **kwargs):
        threads.append(threading.current_thread().name)
        time.sleep(STALL_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, slow)
    return threads


def test_counting_tokens_does_not_block_the_loop(tmp_path, monkeypatch):
    """Inputs over INLINE_COUNT_CHARS are counted in the CPU pool (a few sentences are counted inline:
    ~45 us each, less than the pool's thread hop)."""
    threads = slowed(monkeypatch, embeddings, "measure")
    text = "a few words " * 30  # 360 characters; 4 of them are over INLINE_COUNT_CHARS
    assert 4 * len(text) > embeddings.INLINE_COUNT_CHARS

    async def scenario():
        async with inprocess_gateway(tmp_path) as (_app, client):
            request = client.post("/v1/embeddings", json={"model": MINILM, "input": [text] * 4})
            response, gap = await max_loop_gap(request)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["prompt_tokens"] == 4 * (2 + 90)  # [CLS] 30 x "a few words" [SEP]
            return gap

    gap = asyncio.run(scenario())
    assert gap < BOUND_S, f"the event loop stood still for {gap:.2f}s while tokens were counted"
    assert threads and threads[0] != "MainThread"


def test_decoding_and_checking_images_does_not_block_the_loop(tmp_path, monkeypatch):
    decode_threads = slowed(monkeypatch, images, "_decode_base64")
    check_threads = slowed(monkeypatch, images, "check_image")
    image = b64(png_bytes())

    async def scenario():
        async with inprocess_gateway(tmp_path) as (_app, client):
            # images are decoded and checked before the model is looked up: no model needed for the 404
            request = client.post("/infer", json={"model_name": "not-loaded", "image": [image, image]})
            response, gap = await max_loop_gap(request)
            assert response.status_code == 404, response.text
            return gap

    gap = asyncio.run(scenario())
    assert gap < BOUND_S, f"the event loop stood still for {gap:.2f}s while images were decoded"
    assert len(decode_threads) == 2 and len(check_threads) == 2
    assert "MainThread" not in decode_threads + check_threads


def test_a_qdrant_count_waiting_for_its_lock_does_not_block_the_loop(tmp_path):
    async def scenario():
        async with inprocess_gateway(tmp_path) as (app, client):
            service = app.state.collections
            await service.create(CollectionInfo(name="q", model="m", pretrained=None, store="qdrant",
                                                distance="cosine", dimension=8))
            await service.upsert("q", ["a"], np.ones((1, 8), dtype=np.float32), [{}])
            held = threading.Event()

            def long_search():  # local mode: a search holds the client's lock; count() waits for it
                with service._qdrant_lock:
                    held.set()
                    time.sleep(STALL_S)

            threading.Thread(target=long_search, daemon=True).start()
            held.wait(10)
            response, gap = await max_loop_gap(client.get("/collections/q"))
            assert response.status_code == 200 and response.json()["count"] == 1, response.text
            return gap

    gap = asyncio.run(scenario())
    assert gap < BOUND_S, f"the event loop stood still for {gap:.2f}s while Qdrant counted"


def test_a_maximal_base64_image_holds_the_loop_for_a_fraction_of_its_decode(tmp_path):
    """The real work, not a sleep: binascii holds the GIL for a whole call, so a worker thread alone does
    not free the loop; the decode goes in chunks the GIL changes hands between. Compared with the same
    decode done in one blocking call on this box (min of runs: noise only adds)."""
    settings = Settings()
    image = png_bytes() + bytes(range(256)) * ((settings.max_image_bytes - 4096) // 256)
    value = b64(image)

    blocking = []
    for _ in range(2):
        started = time.perf_counter()
        images.inline_image(value, settings)
        blocking.append(time.perf_counter() - started)

    async def scenario():
        gaps = []
        for _ in range(3):
            data, gap = await max_loop_gap(images.image_bytes(value, settings))
            assert len(data) == len(image)
            gaps.append(gap)
        return gaps

    gaps = asyncio.run(scenario())
    assert min(gaps) < 0.5 * min(blocking), (f"the loop stood still {min(gaps) * 1000:.0f} ms; the decode takes "
                                            f"{min(blocking) * 1000:.0f} ms")
