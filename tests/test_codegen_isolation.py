"""Issue 9 and 12 on the codegen stages without a server: sanitized sampling (a tiny temperature is
greedy), per-sequence failures that never touch batch-mates, a supervised decode loop that fails
everything and restarts on a fault, bounded stop words and pending requests, and the rows,
sampling_parameters and counts of the codegen tensor contract. Tests taking `engine` run on both engines;
the torch engine's own faults are injected into its model (the OpenVINO engine's: test_openvino_engine.py)."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

import fake_pb_utils
from gptj_generator import torch_engine as engine_module
from gptj_generator.seam import FINISH_REASONS, DecodeLoopDied, GenerationRequest, SamplingParams
from gptj_generator.torch_engine import TorchEngine
from codegen_common.generation_params import GenerationParams, parse_sampling_parameters
from gptj_generator.sampling import new_generator
from model_configs import load_python_model
from stage_common.errors import BadInput, Overloaded
from test_codegen_engine import (ENGINES, WAIT, Collector, engine, ids_of, make_engine, reference,  # noqa: F401
                                 tokenizer, torch_engine)

PROMPT = "def fibonacci(n):"


class FaultyModel(torch.nn.Module):
    """The generator's model, whose transformer body raises `failures` times (and waits while `gate`
    is clear); the engine runs the body and the vocabulary projection separately."""

    def __init__(self, model, failures: int = 0):
        super().__init__()
        self.inner, self.config, self.failures = model, model.config, failures
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    @property
    def base_model(self):
        return self.body

    def body(self, **kwargs):
        self.entered.set()
        assert self.gate.wait(WAIT)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("injected forward fault")
        return self.inner.base_model(**kwargs)

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def get_input_embeddings(self):  # the engine bounds input_ids by its row count
        return self.inner.get_input_embeddings()


def engine_over(base: TorchEngine, model, **options) -> TorchEngine:
    return TorchEngine(model, base.token_bytes, base.eos, max_batch_size=options.pop("max_batch_size", 8),
                       max_tokens_limit=512, **options)


def test_a_tiny_temperature_is_greedy_and_leaves_its_batch_mate_alone(engine, tokenizer):
    expected = reference(tokenizer, PROMPT, 24)
    tiny, greedy = Collector(), Collector()
    steps = engine.steps
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 24, SamplingParams(temperature=1e-40, seed=1)), tiny)
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 24), greedy)
    assert tiny.wait().error is None and greedy.wait().error is None
    assert tiny.ids == expected and greedy.ids == expected
    assert engine.steps - steps < 2 * 24, "the two sequences shared decode steps"


def test_a_failing_sampling_step_fails_that_sequence_alone(torch_engine, tokenizer, monkeypatch):
    engine = torch_engine
    real = engine_module.sample

    def sample(logits, params, generator):
        if params.seed == 666:
            raise FloatingPointError("injected sampling fault")
        return real(logits, params, generator)

    monkeypatch.setattr(engine_module, "sample", sample)
    bad, good = Collector(), Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 16, SamplingParams(temperature=0.8, seed=666)), bad)
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 16), good)
    assert isinstance(bad.wait().error, FloatingPointError)
    assert good.wait().error is None and good.ids == reference(tokenizer, PROMPT, 16)


def test_a_failing_stop_word_match_fails_that_sequence_alone(engine, tokenizer, monkeypatch):
    from gptj_generator.text_stream import TextStream

    real = TextStream.push

    def push(self, token):
        if "BOOM" in self.stop_words:
            raise UnicodeError("injected stop-word fault")
        return real(self, token)

    monkeypatch.setattr(TextStream, "push", push)
    bad, good = Collector(), Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 12, stop_words=["BOOM"]), bad)
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 12), good)
    assert isinstance(bad.wait().error, UnicodeError)
    assert good.wait().error is None and good.ids == reference(tokenizer, PROMPT, 12)


@pytest.mark.parametrize("kind", ENGINES)
def test_a_failing_progress_callback_does_not_stop_the_loop(kind, tokenizer):
    calls = []

    def progress(_engine):
        calls.append(1)
        raise RuntimeError("injected metrics fault")

    faulty = make_engine(kind, on_progress=progress)
    try:
        for _ in range(2):
            done = Collector()
            faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 8), done)
            assert done.wait().error is None and done.ids == reference(tokenizer, PROMPT, 8)
        assert len(calls) >= 2 and faulty._thread.is_alive()
    finally:
        faulty.close()


def test_a_forward_fault_fails_running_and_pending_requests_then_the_loop_restarts(torch_engine, tokenizer):
    engine = torch_engine
    model = FaultyModel(engine.model, failures=1)
    model.gate.clear()
    faulty = engine_over(engine, model, max_batch_size=1)
    try:
        running, pending = Collector(), Collector()
        faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 8), running)
        assert model.entered.wait(WAIT)  # the first is in its prefill; the second must wait for a row
        faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 8), pending)
        model.gate.set()
        assert isinstance(running.wait().error, DecodeLoopDied)
        assert isinstance(pending.wait().error, DecodeLoopDied)
        assert faulty.restarts == 1 and faulty.active == 0
        after = Collector()
        faulty.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 8), after)
        assert after.wait().error is None and after.ids == reference(tokenizer, PROMPT, 8)
    finally:
        faulty.close()


def test_over_the_pending_bound_a_request_is_refused_at_once(torch_engine, tokenizer):
    engine = torch_engine
    model = FaultyModel(engine.model)
    model.gate.clear()
    busy = engine_over(engine, model, max_batch_size=1, max_pending=1)
    try:
        first, second = Collector(), Collector()
        busy.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4), first)
        assert model.entered.wait(WAIT)
        busy.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4), second)
        with pytest.raises(Overloaded, match="max_pending_requests"):
            busy.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4), Collector())
        model.gate.set()
        assert first.wait().error is None and second.wait().error is None
    finally:
        busy.close()


@pytest.mark.parametrize("words, message", [(["a"] * 9, "number of stop words is 9, over the limit of 8"),
                                            (["x" * 65], "over the limit of 64 (max_stop_word_chars)")])
def test_stop_words_are_bounded(engine, tokenizer, words, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4, stop_words=words), Collector())


@pytest.mark.parametrize("params, message", [
    (SamplingParams(temperature=float("nan")), "temperature"), (SamplingParams(temperature=float("inf")),
                                                                "temperature"),
    (SamplingParams(temperature=1.0, top_p=float("nan")), "top_p"), (SamplingParams(top_k=10**7), "top_k")])
def test_non_finite_or_unbounded_sampling_is_refused(engine, tokenizer, params, message):
    with pytest.raises(BadInput, match=message):
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 4, params), Collector())


def test_the_sampling_generator_lives_on_the_logits_device():
    assert new_generator(SamplingParams(temperature=1.0, seed=3), "cpu").device.type == "cpu"
    assert new_generator(SamplingParams(temperature=1e-9), "cpu") is None


def test_sampling_parameters_map_to_the_generation_parameters():
    assert parse_sampling_parameters('{"temperature": 0.5, "top_p": 0.9, "top_k": -1, "max_tokens": 7, '
                                     '"seed": 4, "stop": "\\n"}') == dict(temperature=0.5, top_p=0.9, top_k=0,
                                                                          max_tokens=7, seed=4, stop=("\n",))
    for text, message in [('{"best_of": 2, "n": 1}', r"unsupported keys \['best_of', 'n'\]"),
                          ("[1]", "JSON object"), ("{", "not valid JSON"),
                          ('{"max_tokens": 1.5}', "an integer"), ('{"stop": [1]}', "list of strings")]:
        with pytest.raises(BadInput, match=message):
            parse_sampling_parameters(text)
    params = GenerationParams(max_tokens=3, seed=9, stop=("a",))
    assert GenerationParams.from_json(params.to_json()) == params
    assert params.generator_arrays()["random_seed"].dtype == np.uint64


def _request(**inputs) -> fake_pb_utils.InferenceRequest:
    return fake_pb_utils.InferenceRequest(inputs)


def _strings(rows) -> np.ndarray:
    return np.array([[v if isinstance(v, bytes) else v.encode() for v in row] for row in rows], dtype=np.object_)


def test_preprocess_takes_several_rows_and_sampling_parameters(tokenizer):
    model = load_python_model("codegen_preprocess")
    prompts = ["def f():", "import os\nimport sys\n", "x"]
    several = _request(text_input=_strings([[p] for p in prompts]),
                       request_output_len=np.array([[4], [5], [6]], np.int32),
                       stop_words=_strings([["a", "b"], ["c", ""], ["", ""]]),
                       token_healing=np.array([[False]] * 3))  # the prompts' ids as the tokenizer gives them
    vllm_style = _request(text_input=_strings([["x"]]), exclude_input_in_output=np.array([[False]]),
                          stream=np.array([[True]]),
                          sampling_parameters=_strings([['{"max_tokens": 9, "temperature": 0.3, "stop": ["q"]}']]))
    unknown = _request(text_input=_strings([["x"]]), sampling_parameters=_strings([['{"logprobs": 1}']]))
    too_big = _request(text_input=_strings([["x" * 65537]]))
    responses = model.execute([several, vllm_style, unknown, too_big])
    ids, lengths = responses[0].output("input_ids"), responses[0].output("input_lengths").reshape(-1)
    for row, prompt in enumerate(prompts):
        assert ids[row, :lengths[row]].tolist() == ids_of(tokenizer, prompt)
    params = [GenerationParams.from_json(v) for v in responses[0].output("generation_params").reshape(-1)]
    assert [p.max_tokens for p in params] == [4, 5, 6] and [p.stop for p in params] == [("a", "b"), ("c",), ()]
    vllm = GenerationParams.from_json(responses[1].output("generation_params").reshape(-1)[0])
    assert (vllm.max_tokens, vllm.temperature, vllm.stop, vllm.exclude_input) == (9, pytest.approx(0.3), ("q",),
                                                                                  False)
    assert responses[2].error().code() == fake_pb_utils.TritonError.INVALID_ARG
    assert "logprobs" in responses[2].error().message()
    assert "max_prompt_bytes" in responses[3].error().message()


def test_postprocess_cuts_padding_per_row_and_echoes_the_prompt_when_asked(tokenizer):
    model = load_python_model("codegen_postprocess")
    a, b = ids_of(tokenizer, "a = 1\n"), ids_of(tokenizer, "b = 22\nc")
    ids = np.full((2, max(len(a), len(b))), -1, np.int32)
    ids[0, :len(a)], ids[1, :len(b)] = a, b
    params = [GenerationParams(), GenerationParams(stop=("\n",), exclude_input=False)]
    response = model.execute([_request(output_ids=ids, text_input=_strings([["P0"], ["P1:"]]),
                                       generation_params=_strings([[p.to_json()] for p in params]))])[0]
    assert response.output("text_output").tolist() == [[b"a = 1\n"], [b"P1:b = 22"]]


def test_finish_reasons_and_counts_reach_the_sink(engine, tokenizer):
    length, stop = Collector(), Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 5), length)
    expected = tokenizer.decode(reference(tokenizer, PROMPT, 12))
    word = expected.strip()[3:6] or expected[:2]
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPT), 64, stop_words=[word]), stop)
    assert length.wait().reason == "length" and len(length.ids) == 5
    assert stop.wait().reason == "stop"
    assert FINISH_REASONS[length.reason] == "length"
    assert FINISH_REASONS[stop.reason] == "stop"
    assert json.loads(GenerationParams().to_json())["max_tokens"] == 16


def _eventually(condition, timeout: float = WAIT) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_bounded_workers_refuse_work_beyond_their_threads():
    from stage_common.bounded_workers import BoundedWorkers

    workers, gate, ran = BoundedWorkers(2, "test"), threading.Event(), []
    try:
        for _ in range(2):
            workers.submit(lambda: (gate.wait(WAIT), ran.append(1)))
        with pytest.raises(Overloaded, match="max_in_flight=2"):
            workers.submit(ran.append, 1)
        gate.set()
        assert _eventually(lambda: len(ran) == 2 and workers._busy == 0)
        workers.submit(ran.append, 1)  # a free thread again
        assert _eventually(lambda: len(ran) == 3)
    finally:
        workers.shutdown()


def test_a_row_that_fails_to_detokenize_fails_its_request_alone(tokenizer):
    model = load_python_model("codegen_postprocess")
    good = np.array([ids_of(tokenizer, "a = 1\n")], np.int32)
    bad = np.array([[2**31 - 1]], np.int32)  # far beyond the vocabulary
    real = model.detokenizer.tokenizer

    class Strict:  # the tokenizer, refusing ids it does not know (as some do)
        def decode_batch(self, rows, skip_special_tokens):
            return [self.decode(r, skip_special_tokens) for r in rows]

        def decode(self, ids, skip_special_tokens):
            if any(i >= real.get_vocab_size() for i in ids):
                raise ValueError("unknown id")
            return real.decode(ids, skip_special_tokens=skip_special_tokens)

    model.detokenizer.tokenizer = Strict()
    responses = model.execute([_request(output_ids=good), _request(output_ids=bad), _request(output_ids=good)])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[0].output("text_output").tolist() == [[b"a = 1\n"]]
    assert "internal error (id" in responses[1].error().message()


def test_every_generation_parameter_has_a_kind_so_its_json_row_reads_back():
    """from_json refuses keys it has no kind for: a field added to GenerationParams must get one."""
    from dataclasses import fields

    from codegen_common.generation_params import FIELD_KINDS
    assert set(FIELD_KINDS) == {f.name for f in fields(GenerationParams)}
