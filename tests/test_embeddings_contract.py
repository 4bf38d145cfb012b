"""The embeddings contract of issue 44 through the real routes, in process (a fake Triton engine): token-id
input refused with the cause and LangChain's fix; up to 2,048 inputs, sent in batches of the model's max
batch that go through one after another (never refused by the coalescer's queue bound, never holding other
requests behind all of their rows); inputs over the served model's maximum sequence length refused with
their index and the limit unless `truncate`; GET /v1/models/{id} for every listed id, slashes included."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateway import modelgen
from gateway.middleware.policy import ROUTES, cap, texts_cap
from gateway.modelgen import ModelSpec, builtin_specs
from gateway.settings import ROOT, Settings
from gateway_helpers import MINILM
from inprocess_gateway import FakeEngine, inprocess_gateway

LONG = "a " * 300  # 600 characters, 302 tokens for all-MiniLM-L6-v2 ([CLS] 300 x "a" [SEP]): over its 256
MINILM_TOKENIZER = ROOT / "model_repository" / "text_embedding_tokenizer"


def run(scenario, tmp_path, **settings):
    async def main():
        async with inprocess_gateway(tmp_path, **settings) as (app, client):
            return await scenario(app, client)
    return asyncio.run(main())


def error_of(response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] in ("invalid_request_error", "not_found_error", "payload_too_large_error"), error
    return error


# ---- 1. token ids --------------------------------------------------------------------------------------
@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"model": MINILM, "input": [9906, 1917]}, "input"),
    ("/v1/embeddings", {"model": MINILM, "input": [[9906, 1917], [15339]]}, "input"),
    ("/infer", {"model_name": MINILM, "text": [[9906, 1917]]}, "text"),
])
def test_token_ids_are_refused_with_the_cause_and_langchains_fix(tmp_path, path, body, param):
    async def scenario(app, client):
        return await client.post(path, json=body), app.state.engine.inferred

    response, inferred = run(scenario, tmp_path)
    error = error_of(response)
    assert error["param"] == param and error["code"] == "token_ids_not_supported"
    assert "token ids" in error["message"].lower() and "another tokenizer" in error["message"]
    assert "check_embedding_ctx_length=False" in error["message"]
    assert inferred == []


def test_a_huge_token_id_list_is_refused_quickly(tmp_path):
    """The input's form is read from its first item: 2 million ids are not validated one by one (the
    former union built one error per item: 19 s and a 380 MB message)."""
    async def scenario(_app, client):
        return await client.post("/v1/embeddings", json={"model": MINILM, "input": [12345] * 2_000_000})

    response = run(scenario, tmp_path)
    assert error_of(response)["code"] == "token_ids_not_supported" and len(response.content) < 2000


# ---- 2. up to 2,048 inputs in batches ----------------------------------------------------------------
def test_2048_inputs_are_embedded_in_batches_of_the_models_max_batch(tmp_path):
    assert Settings().max_inputs == 2048 and Settings.from_env({"MAX_INPUTS": "10"}).max_inputs == 10

    async def scenario(app, client):
        ok = await client.post("/v1/embeddings", json={"model": MINILM, "input": [f"text {i}" for i in range(2048)]})
        over = await client.post("/v1/embeddings", json={"model": MINILM, "input": ["x"] * 2049})
        return ok, over, app.state.engine.inferred

    ok, over, inferred = run(scenario, tmp_path)
    assert ok.status_code == 200, ok.text
    assert [d["index"] for d in ok.json()["data"]] == list(range(2048))
    assert inferred == [("text_embedding", 64)] * 32  # all-MiniLM-L6-v2's max batch
    assert "MAX_INPUTS" in error_of(over)["message"]


class SerialEngine(FakeEngine):
    """One Triton instance: requests run one at a time, in arrival order, each taking `delay` seconds."""

    def __init__(self, delay: float = 0.01):
        super().__init__()
        self.delay, self.lock, self.done = delay, asyncio.Lock(), []

    async def infer(self, model, inputs, outputs, timeout_s=None):
        async with self.lock:
            await asyncio.sleep(self.delay)
            rows = len(next(iter(inputs.values())))
            self.done.append(rows)
            return {"embedding": np.ones((rows, 8), dtype=np.float32)}


@pytest.mark.parametrize("calls", [4, 0])
def test_a_2048_input_request_does_not_hold_a_small_one_behind_all_its_rows(tmp_path, calls):
    async def scenario(app, client):
        app.state.engine = engine = SerialEngine()
        big = asyncio.create_task(client.post("/v1/embeddings", json={"model": MINILM, "input": ["a b c"] * 2048}))
        while not engine.done and not big.done():  # the big request's first batch is through
            await asyncio.sleep(0.001)
        small = await client.post("/v1/embeddings", json={"model": MINILM, "input": ["alone"]})
        batches_before_small = len(engine.done)
        return (await big), small, batches_before_small, engine.done

    big, small, before, done = run(scenario, tmp_path, coalesce_calls=calls, max_inputs=2048)
    assert big.status_code == 200 and small.status_code == 200, (big.text, small.text)
    assert before <= 4, f"the small request waited for {before} batches of the large one"
    assert sorted(done) == [1] + [64] * 32  # the small one went alone, between the large one's batches


def test_a_2048_input_request_is_not_refused_by_the_coalescers_queue_bound(tmp_path):
    """With every Triton call slot busy, requests queue in the coalescer, at most 256 rows: a 2,048-input
    request queues one batch at a time, so it waits its turn instead of a 503."""
    async def scenario(app, client):
        app.state.engine = engine = SerialEngine(delay=0.2)
        busy = asyncio.create_task(client.post("/v1/embeddings", json={"model": MINILM, "input": ["busy"]}))
        await asyncio.sleep(0.05)  # holds the only slot (COALESCE_CALLS=1)
        big = await client.post("/v1/embeddings", json={"model": MINILM, "input": ["a b c"] * 2048})
        return big, await busy, engine

    big, busy, engine = run(scenario, tmp_path, coalesce_calls=1, max_inputs=2048)
    assert busy.status_code == 200 and big.status_code == 200, big.text
    assert len(big.json()["data"]) == 2048


def test_the_body_cap_holds_2048_inputs_and_a_request_bounds_its_text_bytes(tmp_path):
    settings = Settings()
    # 2,048 texts of 8 KiB on average (or 256 at MAX_TEXT_BYTES): docs/security.md's table
    assert cap(ROUTES[("POST", "/v1/embeddings")], settings) == 16 * 1024 * 1024 + 64 * 1024
    assert texts_cap(settings) <= settings.body_buffer_bytes
    assert texts_cap(Settings(max_inputs=8)) == 8 * 64 * 1024 + 64 * 1024
    assert Settings.from_env({"MAX_REQUEST_TEXT_BYTES": "1000"}).max_request_text_bytes == 1000

    async def scenario(_app, client):
        return await client.post("/v1/embeddings", json={"model": MINILM, "input": ["x" * 40] * 3})

    error = error_of(run(scenario, tmp_path, max_request_text_bytes=100), 413)
    assert "MAX_REQUEST_TEXT_BYTES" in error["message"]


# ---- 3. the model's maximum sequence length ------------------------------------------------------------
def test_an_input_over_the_models_maximum_is_refused_naming_its_index_and_the_limit(tmp_path):
    async def scenario(app, client):
        refused = await client.post("/v1/embeddings", json={"model": MINILM, "input": ["short", LONG]})
        inferred = list(app.state.engine.inferred)
        truncated = await client.post("/v1/embeddings", json={"model": MINILM, "input": ["short", LONG],
                                                               "truncate": True})
        infer = await client.post("/infer", json={"model_name": MINILM, "text": [LONG]})
        infer_truncated = await client.post("/infer", json={"model_name": MINILM, "text": [LONG], "truncate": True})
        return refused, inferred, truncated, infer, infer_truncated

    refused, inferred, truncated, infer, infer_truncated = run(scenario, tmp_path)
    error = error_of(refused)
    assert error["param"] == "input" and error["code"] == "context_length_exceeded"
    assert "input[1]" in error["message"] and "302 tokens" in error["message"] and "256" in error["message"]
    assert '"truncate": true' in error["message"]
    assert inferred == []  # a few sentences are measured before any Triton work
    assert truncated.status_code == 200 and truncated.json()["usage"]["prompt_tokens"] == 3 + 256
    assert "text[0]" in error_of(infer)["message"]
    assert infer_truncated.status_code == 200


def test_a_large_over_long_input_is_refused_too(tmp_path):
    """Inputs over INLINE_COUNT_CHARS are measured in the CPU pool while Triton embeds: still refused."""
    async def scenario(_app, client):
        return await client.post("/v1/embeddings", json={"model": MINILM, "input": ["fine"] * 3 + [LONG * 4]})

    assert "input[3]" in error_of(run(scenario, tmp_path))["message"]


def test_truncate_default_makes_truncation_the_default(tmp_path):
    assert Settings.from_env({"TRUNCATE_DEFAULT": "true"}).truncate_default is True
    assert Settings.from_env({}).truncate_default is False

    async def scenario(_app, client):
        default = await client.post("/v1/embeddings", json={"model": MINILM, "input": [LONG]})
        refused = await client.post("/v1/embeddings", json={"model": MINILM, "input": [LONG], "truncate": False})
        return default, refused

    default, refused = run(scenario, tmp_path, truncate_default=True)
    assert default.status_code == 200 and default.json()["usage"]["prompt_tokens"] == 256
    assert error_of(refused)["code"] == "context_length_exceeded"


def test_the_limit_is_the_served_models_own(tmp_path, monkeypatch):
    """The shipped model's limit is its tokenizer stage's max_length; a loaded model's is its own."""
    from gateway.modelgen.spec import configured_max_length

    assert builtin_specs()[0].max_tokens == configured_max_length(MINILM_TOKENIZER / "config.pbtxt") == 256
    config = tmp_path / "config.pbtxt"
    config.write_text('parameters [\n  { key: "max_length" value: { string_value: "77" } }\n]\n')
    assert configured_max_length(config) == 77

    def generate(name, pretrained, kind, source, repository, export=None, limits=None):
        return ModelSpec(model_name=name, pretrained=None, kind=kind, dimension=8, max_tokens=16,
                         text_model="short_model", image_model=None, triton_models=("short_model",),
                         normalized=True, tokenizer_file=str(MINILM_TOKENIZER / "1" / "tokenizer.json"))

    monkeypatch.setattr(modelgen, "resolve_source", lambda name, pretrained, kind, roots, hub_options=None: tmp_path)
    monkeypatch.setattr(modelgen, "generate", generate)

    async def scenario(_app, client):
        loaded = await client.post("/load_sentence_transformer_model", json={"model_name": "short-model"})
        assert loaded.status_code == 200, loaded.text
        fits = await client.post("/v1/embeddings", json={"model": "short-model", "input": ["one two three"]})
        over = await client.post("/v1/embeddings", json={"model": "short-model", "input": ["word " * 15]})
        return fits, over

    fits, over = run(scenario, tmp_path)
    assert fits.status_code == 200, fits.text
    assert "17 tokens" in error_of(over)["message"] and "maximum sequence length of 16" in error_of(over)["message"]


# ---- 4. GET /v1/models/{id} ---------------------------------------------------------------------------
def test_every_listed_model_can_be_retrieved_by_its_id(tmp_path):
    async def scenario(_app, client):
        listed = (await client.get("/v1/models")).json()["data"]
        retrieved = [await client.get(f"/v1/models/{m['id']}") for m in listed]
        escaped = await client.get("/v1/models/" + MINILM.replace("/", "%2F"))
        missing = await client.get("/v1/models/sentence-transformers/not-served")
        return listed, retrieved, escaped, missing

    listed, retrieved, escaped, missing = run(scenario, tmp_path)
    assert {m["id"] for m in listed} >= {MINILM, "codegen"}
    for model, response in zip(listed, retrieved):
        assert response.status_code == 200 and response.json() == model  # OpenAI's model object, as listed
    assert escaped.status_code == 200 and escaped.json()["id"] == MINILM
    error = error_of(missing, 404)
    assert error["code"] == "model_not_found" and "sentence-transformers/not-served" in error["message"]
