"""Prefix caching in the OpenVINO engine (issue 53; backends/gptj_generator/openvino_engine.py): on by default; a
prompt that extends a just-served one prefills only its new tokens; greedy output is the same on and off, for the
request and its batch-mates; the bounded cache and openvino.genai#4047 (a prompt the cache cannot hold ended
silently with no tokens) at the context window's length. In process, on the demo generator."""
from __future__ import annotations

import inspect
import textwrap

import pytest

from gptj_generator.openvino_engine import KV_BLOCK_TOKENS, OpenVINOEngine
from gptj_generator.seam import GenerationRequest
from model_configs import load_python_model
from stage_common.errors import Overloaded
from test_codegen_engine import WAIT, Collector, make_engine, tokenizer  # noqa: F401

NEW = 16
# held-out real code: the interpreter's own library (not the demo's training set, not written here)
SOURCE = inspect.getsource(textwrap)


class FirstTokenStep(Collector):
    """Notes the engine's step count when the first ids came: a prompt's prefill steps (chunked), plus one."""

    def __init__(self, engine):
        super().__init__()
        self.engine, self.first_step = engine, None

    def send(self, token_ids, logprobs=None):
        if self.first_step is None and token_ids:
            self.first_step = self.engine.steps
        super().send(token_ids, logprobs)


def run(engine, prompts: list[list[int]], new: int = NEW) -> list[Collector]:
    """Every prompt submitted in one turn (batch-mates), greedy; their collectors once all are done."""
    sinks = [FirstTokenStep(engine) for _ in prompts]
    with engine._wakeup:
        for prompt, sink in zip(prompts, sinks):
            engine.submit(GenerationRequest(prompt, new), sink)
    for sink in sinks:
        assert sink.wait(WAIT).error is None, sink.error
    return sinks


def steps_to_first_token(engine, prompt: list[int]) -> int:
    before = engine.steps
    return run(engine, [prompt])[0].first_step - before


@pytest.fixture(scope="module")
def code_ids(tokenizer):
    return tokenizer(SOURCE)["input_ids"]


@pytest.fixture(scope="module")
def engines():
    """Prefix caching on (the default) and off; prompts are prefilled 64 tokens a step, so that a prefill's
    length shows in its steps."""
    on = make_engine("openvino", prefill_chunk_tokens=64)
    off = make_engine("openvino", prefill_chunk_tokens=64, prefix_caching=False)
    yield on, off
    on.close()
    off.close()


def test_prefix_caching_is_on_by_default_in_the_served_config(code_ids):
    model = load_python_model("codegen_generator")
    try:
        engine = model.engine
        assert engine.settings()["prefix_caching"] is True
        cold = steps_to_first_token(engine, code_ids[:700])
        assert cold >= 700 // (engine.prefill_chunk_tokens + 16) and steps_to_first_token(engine, code_ids[:700]) == 1
    finally:
        model.finalize()


def test_a_prompt_extending_a_served_one_prefills_only_its_new_tokens(engines, code_ids):
    on, off = engines
    first, follow_up = code_ids[:600], code_ids[:640]  # "the next request adds a few lines"
    assert len(code_ids) > 640
    run(on, [first])
    run(off, [first])
    cached, cold = steps_to_first_token(on, follow_up), steps_to_first_token(off, follow_up)
    print(f"\nsteps to the first token of a 640-token follow-up: cached {cached}, cold {cold}")
    assert cold >= 640 // (64 + 8), "the cold prompt is prefilled 64 tokens a step (and a row's 8 more)"
    assert cached <= 0.25 * cold, (cached, cold)


def test_greedy_output_is_the_same_with_caching_on_and_off_and_batch_mates_are_unaffected(engines, code_ids,
                                                                                         tokenizer):
    on, off = engines
    mate = tokenizer("def fibonacci(n):\n")["input_ids"]
    prompts = [code_ids[:500], code_ids[:520], code_ids[:300] + code_ids[700:760], mate]
    want = [s.ids for s in run(off, prompts)]
    assert [s.ids for s in run(on, prompts)] == want, "cold"
    assert [s.ids for s in run(on, prompts)] == want, "every prompt cached whole"
    again = [code_ids[:530], code_ids[:500], mate]  # extending, cached whole, and the batch-mate beside them
    assert [s.ids for s in run(on, again)] == [s.ids for s in run(off, again)]


def test_prompts_at_the_context_window_are_served_whole_and_cached(engines, code_ids):
    on, off = engines
    window = on.context_window
    long_ids = (code_ids * 2)[:window - 4]  # and 4 new tokens: the whole window
    want = run(off, [long_ids], new=4)[0].ids  # run() fails on an error: a prompt ended with no token is one
    assert run(on, [long_ids], new=4)[0].ids == want
    assert run(on, [long_ids], new=4)[0].ids == want, "the whole window's prompt cached"
    last = (code_ids * 2)[:window - 1]
    assert run(on, [last], new=1)[0].ids == run(off, [last], new=1)[0].ids


def test_a_bounded_cache_full_of_cached_prefixes_still_takes_a_window_long_prompt(code_ids):
    """openvino.genai#4047's trigger: a bounded cache holding other prompts' blocks. The bound is the least
    the engine takes (a window and a block): the cached blocks must be evicted for the new prompt."""
    window = 1024
    bounded = make_engine("openvino", max_batch_size=1, kv_cache_tokens=window + KV_BLOCK_TOKENS)
    off = make_engine("openvino", max_batch_size=1, prefix_caching=False)
    try:
        assert bounded.context_window == window
        for start in (0, 200, 400):  # cached prefixes of other prompts fill the cache
            run(bounded, [(code_ids * 2)[start:start + 700]], new=2)
        long_ids = (code_ids * 2)[50:50 + window - 8]
        assert run(bounded, [long_ids], new=8)[0].ids == run(off, [long_ids], new=8)[0].ids
        assert bounded.cache_stats()["kv_cache_bytes"] > 0
    finally:
        bounded.close()
        off.close()


def test_a_bound_under_one_context_window_is_refused_at_load():
    with pytest.raises(ValueError, match="cannot hold one context window"):
        make_engine("openvino", kv_cache_tokens=1024)


class _SilentHandle:
    """A handle the pipeline finished without a token (openvino.genai#4047's symptom)."""

    def __init__(self, handle, genai):
        self.handle, self.genai = handle, genai

    def can_read(self):
        return False

    def get_status(self):
        return self.genai.GenerationStatus.FINISHED

    def cancel(self):
        self.handle.cancel()


class _SilentPipe:
    def __init__(self, pipe, genai):
        self.pipe, self.genai = pipe, genai

    def add_request(self, request_id, prompt, config):
        handle = self.pipe.add_request(request_id, prompt, config)
        handle.cancel()  # the pipeline drops it at the next step
        return _SilentHandle(handle, self.genai)

    def __getattr__(self, name):
        return getattr(self.pipe, name)


def test_a_request_the_pipeline_ends_with_no_token_fails_as_retryable(tokenizer):
    engine = make_engine("openvino")
    try:
        engine.pipe = _SilentPipe(engine.pipe, engine._genai)
        sink = Collector()
        engine.submit(GenerationRequest(tokenizer("import os\n")["input_ids"], 8), sink)
        assert isinstance(sink.wait().error, Overloaded), sink.error
        assert "no token" in str(sink.error) and sink.ids == []
    finally:
        engine.close()


def test_the_engine_settings_name_what_it_runs_with():
    assert "kv_cache_tokens" in inspect.signature(OpenVINOEngine).parameters
    engine = make_engine("openvino", kv_cache_tokens=4096)
    try:
        settings = engine.settings()
        assert settings["kv_cache_tokens"] == 4096 and settings["precision"] == "f32"
        # the bound in whole blocks, allocated at the first request (the warm-up's)
        stats = engine.cache_stats()
        assert stats["kv_cache_bytes"] == 4096 * 3 * 2 * 128 * 4, stats  # 3 layers, K and V, 128 wide, f32
    finally:
        engine.close()
