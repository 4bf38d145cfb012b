"""The OpenVINO engine's own promises (backends/gptj_generator/openvino_engine.py), beyond the contract both
engines share (test_codegen_engine.py): a failing step fails the running requests alone and the pipeline serves on,
a request the pipeline refuses fails alone, the pending bound, seeds, the dropped second copy of the weights,
the engine choice, and a generator stub on OpenVINO that never imports torch."""
from __future__ import annotations

import threading

import psutil
import pytest

from gptj_generator.file_pages import mapped_ranges
from gptj_generator.loading import choose_engine
from gptj_generator.openvino_engine import WEIGHTS_FILE, fold_seed
from gptj_generator.seam import DecodeLoopDied, GenerationRequest, SamplingParams
from model_configs import load_python_model
from stage_common.errors import Overloaded
from test_codegen_engine import GENERATOR_DIR, WAIT, Collector, ids_of, make_engine, reference, tokenizer  # noqa: F401
from test_torch_free_stages import _assert_loads_torch_free

PROMPT = "def fibonacci(n):"


class PipeProxy:
    """The engine's pipeline with faults on demand: steps that raise, a gate that holds the step, a refusal."""

    def __init__(self, pipe):
        self.pipe, self.failing_steps, self.refuse = pipe, 0, None
        self.gate, self.stepping = threading.Event(), threading.Event()
        self.gate.set()

    def step(self):
        self.stepping.set()
        assert self.gate.wait(WAIT)
        if self.failing_steps:
            self.failing_steps -= 1
            raise RuntimeError("injected step fault")
        return self.pipe.step()

    def add_request(self, request_id, prompt, config):
        if self.refuse is not None and self.refuse(prompt.data.tolist()[0]):
            raise RuntimeError("injected refusal")
        return self.pipe.add_request(request_id, prompt, config)

    def __getattr__(self, name):
        return getattr(self.pipe, name)


@pytest.fixture
def faulty():
    """One row, one waiting request at most."""
    engine = make_engine("openvino", max_batch_size=1, max_pending=1, cancel_poll_seconds=0)
    engine.pipe = PipeProxy(engine.pipe)
    yield engine
    engine.pipe.gate.set()
    engine.close()


@pytest.fixture
def refusing():
    engine = make_engine("openvino", cancel_poll_seconds=0)
    engine.pipe = PipeProxy(engine.pipe)
    yield engine
    engine.close()


def test_a_failing_step_fails_the_running_request_and_the_waiting_one_is_served(faulty, tokenizer):
    running, waiting = Collector(), Collector()
    faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 200), running)
    running.wait_tokens(2)
    faulty.submit(GenerationRequest(ids_of(tokenizer, "import os\n"), 16), waiting)  # no free row: it waits
    faulty.pipe.failing_steps = 1
    assert isinstance(running.wait().error, DecodeLoopDied)
    assert waiting.wait().error is None and waiting.ids == reference(tokenizer, "import os\n", 16)
    assert faulty.restarts == 1
    after = Collector()
    faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 24), after)
    assert after.wait().ids == reference(tokenizer, PROMPT, 24), "the pipeline serves as a fresh one"


def test_a_request_the_pipeline_refuses_fails_alone(refusing, tokenizer):
    refused_prompt = ids_of(tokenizer, "x")
    refusing.pipe.refuse = lambda ids: ids == refused_prompt
    before, refused, after = Collector(), Collector(), Collector()
    with refusing._wakeup:  # queued together, so admitted in one turn
        for prompt, sink in ((ids_of(tokenizer, PROMPT), before), (refused_prompt, refused),
                             (ids_of(tokenizer, PROMPT), after)):
            refusing.submit(GenerationRequest(prompt, 8), sink)
    assert "injected refusal" in str(refused.wait().error)
    assert before.wait().ids == after.wait().ids == reference(tokenizer, PROMPT, 8)
    assert refusing.restarts == 0


def test_over_the_pending_bound_a_request_is_refused_at_once(faulty, tokenizer):
    faulty.pipe.gate.clear()
    faulty.pipe.stepping.clear()
    first, second = Collector(), Collector()
    faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4), first)
    assert faulty.pipe.stepping.wait(WAIT)  # the first holds the one row; the second waits for it
    faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4), second)
    with pytest.raises(Overloaded, match="max_pending_requests"):
        faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4), Collector())
    faulty.pipe.gate.set()
    assert first.wait().error is None and second.wait().error is None


def test_seeds_of_64_bits_are_folded_and_unseeded_requests_draw_their_own(tokenizer):
    assert fold_seed(1) != fold_seed(2**32 + 1) and max(fold_seed(2**64 - 1), fold_seed(2**40)) < 2**32
    engine = make_engine("openvino")
    try:
        def sampled(seed):
            sink = Collector()
            engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 24, SamplingParams(1.0, 0, 1.0, seed)), sink)
            return sink.wait().ids

        big = 2**40 + 5  # folded, it must not collide with 5
        assert sampled(big) == sampled(big) != sampled(5)
        # a row may end early (end-of-text): several draws are compared
        assert len({tuple(sampled(None)) for _ in range(4)}) > 1, "an unset seed must not be a fixed one"
    finally:
        engine.close()


def test_the_mapped_weights_are_dropped_after_the_warm_up(tokenizer):
    engine = make_engine("openvino")
    try:
        weights = engine.ir_dir / WEIGHTS_FILE
        assert engine.dropped_bytes >= weights.stat().st_size
        starts = {start for start, _ in mapped_ranges(weights)}
        resident = sum(m.rss for m in psutil.Process().memory_maps(grouped=False)
                       if int(m.addr.split("-")[0], 16) in starts)
        assert resident < weights.stat().st_size / 4, (resident, weights.stat().st_size)
        done = Collector()  # and the engine still runs on its own copy
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 8), done)
        assert done.wait().ids == reference(tokenizer, PROMPT, 8)
    finally:
        engine.close()


def test_the_engine_parameter_picks_openvino_on_cpu_and_torch_on_gpu():
    assert choose_engine("auto", gpu=False) == "openvino" and choose_engine("auto", gpu=True) == "torch"
    assert choose_engine("torch", gpu=False) == "torch" and choose_engine("openvino", gpu=False) == "openvino"
    with pytest.raises(ValueError, match="OpenVINO does not drive NVIDIA GPUs"):
        choose_engine("openvino", gpu=True)
    with pytest.raises(ValueError, match="must be one of"):
        choose_engine("onnx", gpu=False)


def test_each_engine_is_handed_only_the_config_options_it_takes():
    from gptj_generator.loading import engine_options, own_options
    from gptj_generator.openvino_engine import OpenVINOEngine
    from gptj_generator.torch_engine import TorchEngine

    options = engine_options({"parameters": {"max_scored_rows": {"string_value": "3"}}})  # every engine's options
    assert own_options(OpenVINOEngine, options) == options and options["max_scored_rows"] == 3
    openvino_only = {"max_scored_rows", "prefix_caching", "kv_cache_tokens", "prompt_lookup_tokens", "precision"}
    assert own_options(TorchEngine, options) == {k: v for k, v in options.items() if k not in openvino_only}
    assert own_options(TorchEngine, {"ir_dir": "x"}) == {"ir_dir": "x"}, "not a config option: its constructor judges"


@pytest.mark.parametrize("setting, expected", [(None, "openvino"), ("torch", "torch"), ("openvino", "openvino")])
def test_the_generator_model_loads_the_configured_engine(setting, expected):
    model = load_python_model("codegen_generator", params={"engine": setting} if setting else None)
    try:
        assert model.engine.name == expected
    finally:
        model.finalize()


@pytest.mark.parametrize("params, expected", [(None, 1), ({"max_scored_rows": "3"}, 3)])
def test_the_served_generator_takes_max_scored_rows_from_its_config(params, expected):
    model = load_python_model("codegen_generator", params=params)
    try:
        assert model.engine.name == "openvino" and model.engine.max_scored_rows == expected
    finally:
        model.finalize()


def test_the_generator_on_openvino_never_imports_torch():
    _assert_loads_torch_free("load_python_model('codegen_generator').finalize()")


@pytest.fixture
def gated():
    """Four rows; the scorer follows one row at most, and prefills one prompt token per turn (so one prompt)."""
    engine = make_engine("openvino", max_batch_size=4, max_scored_rows=1, prefill_chunk_tokens=1,
                         cancel_poll_seconds=0)
    engine.pipe = PipeProxy(engine.pipe)
    yield engine
    engine.pipe.gate.set()
    engine.close()


class After(Collector):
    """Notes whether `other` had ended when this request's first ids came."""

    def __init__(self, other: Collector):
        super().__init__()
        self.other, self.started_after_other = other, None

    def send(self, token_ids, logprobs=None):
        if self.started_after_other is None and token_ids:
            self.started_after_other = self.other.done.is_set()
        super().send(token_ids, logprobs)


def test_the_scorer_follows_max_scored_rows_and_plain_requests_go_ahead(gated, tokenizer):
    """Alternatives (logprobs >= 1) cost a scorer forward per id on the loop thread: over the bound a request
    waits for a scored row to end (without one, 8 such rows slowed their batch-mates to 0.16x: bench_logprobs.py)."""
    prompt = ids_of(tokenizer, PROMPT)
    gated.pipe.gate.clear()
    gated.pipe.stepping.clear()
    first = Collector()
    second, plain = After(first), After(first)
    with gated._wakeup:  # queued together: one turn sees all three
        gated.submit(GenerationRequest(prompt, 12, logprobs=2), first)
        gated.submit(GenerationRequest(prompt, 12, logprobs=2), second)
        gated.submit(GenerationRequest(ids_of(tokenizer, "import os\n"), 12), plain)
    assert gated.pipe.stepping.wait(WAIT)
    assert (gated.running, gated.pending) == (2, 1), "the second waits for the scorer, the plain one went ahead"
    gated.pipe.gate.set()
    assert first.wait().ids == second.wait().ids == reference(tokenizer, PROMPT, 12)
    assert plain.wait().ids == reference(tokenizer, "import os\n", 12) and plain.started_after_other is False
    assert second.started_after_other is True
    assert first.logprobs == second.logprobs and all(len(lp.top) == 2 for lp in first.logprobs)


def test_scorer_prefills_are_spread_over_turns(gated, tokenizer):
    """Token healing and echo prefill the prompt on the scorer, on the loop thread: past prefill_chunk_tokens in
    a turn, the next such request waits for the next turn (the batch steps in between), as the pipeline's own
    prefill is chunked."""
    healed = ids_of(tokenizer, "def mean(values):\n")
    prefix = tokenizer.decode([healed[-1]]).encode()
    gated.pipe.gate.clear()
    gated.pipe.stepping.clear()
    sinks = [Collector() for _ in range(3)]
    with gated._wakeup:
        for sink in sinks[:2]:
            gated.submit(GenerationRequest(healed[:-1], 6, heal_prefix=prefix), sink)
        gated.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 6), sinks[2])
    assert gated.pipe.stepping.wait(WAIT)
    assert (gated.running, gated.pending) == (2, 1), "one scorer prefill this turn; the plain request went ahead"
    gated.pipe.gate.set()
    assert sinks[0].wait().ids == sinks[1].wait().ids and sinks[0].error is None and len(sinks[0].ids) == 6
    assert sinks[2].wait().ids == reference(tokenizer, PROMPT, 6)
