"""Issue 56, items 2 and 6, in process (the gateway's app without Triton): another key's one-sentence embeddings
are served beside a heavy key's 8 concurrent 64-input requests, in the next call, not refused; and a client that
leaves takes its rows out of the coalescer's queue, and no batch of its request is sent afterwards."""
from __future__ import annotations

import asyncio
import json

import numpy as np

from gateway.embedding.embed import Embedder
from gateway.settings import Settings
from gateway_helpers import MINILM
from inprocess_gateway import inprocess_gateway


class GatedEngine:
    """Triton's embeddings, held until `gate` opens; records each call's rows."""

    def __init__(self):
        self.gate = asyncio.Event()
        self.calls: list[list[str]] = []

    async def infer(self, model, inputs, outputs, timeout_s=None):
        values = np.asarray(next(iter(inputs.values()))).reshape(-1)
        rows = [v.decode() if isinstance(v, bytes) else str(v) for v in values]
        self.calls.append(rows)
        await self.gate.wait()
        return {"embedding": np.ones((len(rows), 8), dtype=np.float32)}


def test_another_keys_sentence_goes_in_the_next_call_beside_a_heavy_key():
    async def scenario():
        engine = GatedEngine()
        embedder = Embedder(Settings(), None, engine, {})  # the default queue bounds and coalesce_calls (4)
        heavy = [asyncio.create_task(embedder._embed("m", "text", [f"heavy{i}"] * 64, 64, owner="heavy"))
                 for i in range(8)]
        await asyncio.sleep(0.01)
        light = asyncio.create_task(embedder._embed("m", "text", ["light"], 64, owner="light"))
        await asyncio.sleep(0.01)
        assert not light.done(), light  # today: a 503 at once, the queue being full of the heavy key's rows
        engine.gate.set()
        vectors = await light
        await asyncio.gather(*heavy)
        return engine.calls, vectors

    calls, vectors = asyncio.run(scenario())
    assert vectors.shape == (1, 8)
    first_light = next(i for i, rows in enumerate(calls) if "light" in rows)
    # 4 calls in flight when it came (COALESCE_CALLS), then at most one of the heavy key's batches before it
    assert first_light <= 5, [rows[0] for rows in calls]


def test_a_client_that_leaves_takes_its_queued_rows_out_and_sends_no_more(tmp_path):
    async def scenario():
        async with inprocess_gateway(tmp_path, coalesce_calls=1) as (app, client):
            engine = app.state.engine = GatedEngine()
            app.state.models.engine = engine
            first = asyncio.create_task(client.post("/v1/embeddings", json={"model": MINILM, "input": ["first"]}))
            while not engine.calls:  # the one call slot is busy with the first request's row
                await asyncio.sleep(0.01)
            left = asyncio.Event()
            body = json.dumps({"model": MINILM, "input": ["gone"] * 200}).encode()
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            sent = []

            async def receive():
                if messages:
                    return messages.pop(0)
                await left.wait()
                return {"type": "http.disconnect"}

            async def send(message):
                sent.append(message)

            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"",
                     "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
                     "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                 (b"content-length", str(len(body)).encode())]}
            request = asyncio.create_task(app(scope, receive, send))
            coalescers = app.state.coalescers
            for _ in range(500):  # its first batch queued behind the busy slot
                if any(c.pending_rows for c in coalescers.values()):
                    break
                await asyncio.sleep(0.01)
            queued = sum(c.pending_rows for c in coalescers.values())
            left.set()  # the client goes
            await asyncio.wait_for(request, 30)
            after = sum(c.pending_rows for c in coalescers.values())
            engine.gate.set()
            assert (await first).status_code == 200
            await asyncio.sleep(0.05)
            return queued, after, engine.calls, sent

    queued, after, calls, sent = asyncio.run(scenario())
    assert queued > 0 and after == 0
    assert calls == [["first"]], "no row of the request whose client left was sent"
    assert sent[0]["status"] == 499
