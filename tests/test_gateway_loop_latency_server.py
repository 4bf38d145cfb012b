"""The event loop stays responsive under the heaviest requests the gateway accepts (issue 34): while a
maximal /v1/embeddings request (MAX_REQUEST_TEXT_BYTES of texts of MAX_TEXT_BYTES each, "truncate": true,
tokenized whole for `usage` and by Triton) and a maximal image request (images of MAX_IMAGE_BYTES,
base64-decoded and header-checked) run, GET /v1/models is probed in a loop and its p95 latency stays
within a loose bound: before the fix a single probe waited for all the tokenizing (seconds). The bound is
loose on purpose (a noisy shared box); the figures are printed (pytest -s)."""
from __future__ import annotations

import json
import random
import threading
import time

import httpx
import numpy as np
import pytest

from bench.stats import percentile
from gateway.settings import Settings
from gateway_helpers import MINILM, b64, png_bytes

pytestmark = pytest.mark.integration

P95_BOUND_S = 0.25
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]


def random_text(rng: random.Random, size: int) -> str:
    words, length = [], 0
    while length < size - 12:
        word = rng.choice(WORDS) + str(rng.randrange(1000))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def test_v1_models_answers_promptly_while_maximal_requests_run(gateway):
    gateway.triton.load("text_embedding")
    limits, rng = Settings(), random.Random(0)
    count = min(limits.max_inputs, limits.max_request_text_bytes // limits.max_text_bytes)
    texts = [random_text(rng, limits.max_text_bytes) for _ in range(count)]
    # bodies encoded before the probe starts: the client's own JSON work must not stall the probe thread
    embeddings_body = json.dumps({"model": MINILM, "input": texts, "truncate": True}).encode()
    image = png_bytes() + b"\0" * (limits.max_image_bytes - len(png_bytes()) - 16)
    # as many full-size images as fit beside the embeddings body in BODY_BUFFER_BYTES (all bodies held at once)
    room = (limits.body_buffer_bytes - len(embeddings_body) - 4096) // (len(b64(image)) + 4)
    assert room >= 1, "a full-size image must fit the body budget beside a maximal embeddings request"
    images_body = json.dumps({"model_name": "not-loaded-model", "image": [b64(image)] * min(4, room)}).encode()
    headers = {"content-type": "application/json"}
    results: dict[str, object] = {}

    def send(name: str, path: str, body: bytes, address: str = "127.0.0.1"):
        # two clients, two addresses: one address's bodies hold at most BODY_BUFFER_KEY_BYTES of the budget
        with httpx.Client(base_url=gateway.url, timeout=600,
                          transport=httpx.HTTPTransport(local_address=address)) as client:
            started = time.perf_counter()
            results[name] = client.post(path, content=body, headers=headers)
            results[name + "_s"] = time.perf_counter() - started

    senders = [threading.Thread(target=send, args=("embeddings", "/v1/embeddings", embeddings_body)),
               threading.Thread(target=send, args=("images", "/infer", images_body, "127.0.0.2"))]
    latencies = []
    with httpx.Client(base_url=gateway.url, timeout=60) as probe:
        probe.get("/v1/models")  # connection open before timing
        for t in senders:
            t.start()
        while any(t.is_alive() for t in senders):
            started = time.perf_counter()
            assert probe.get("/v1/models").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.02)
    for t in senders:
        t.join()

    ms = np.asarray(latencies) * 1000
    print(f"\n/v1/models during the maximal requests: {len(ms)} probes, p50 {percentile(ms, 50):.1f} ms, "
          f"p95 {percentile(ms, 95):.1f} ms, max {ms.max():.1f} ms; embeddings request "
          f"{results['embeddings_s']:.1f} s ({results['embeddings'].status_code}), image request {results['images_s']:.1f} s")
    embeddings = results["embeddings"]
    if embeddings.status_code == 503:  # Triton's 30 s queue timeout on a loaded box: the gateway's
        assert embeddings.json()["error"]["code"] == "overloaded"  # own work ran all the same
    else:
        assert embeddings.status_code == 200, embeddings.text
        assert len(embeddings.json()["data"]) == count
        assert embeddings.json()["usage"]["prompt_tokens"] > 0
    # the images were decoded and checked (all four valid), then the unknown model answered 404
    assert results["images"].status_code == 404, results["images"].text
    assert len(ms) >= 5
    assert percentile(ms, 95) <= P95_BOUND_S * 1000
