"""Issue 44's logprobs, echo and token healing on every engine the generator has (no Triton): served logprobs, their
top alternatives and the prompt's (echo) equal transformers' log_softmax on the same weights (1e-4); a score-only
request (max_tokens 0) ends with the prompt's logprobs; healing's first id spells the backed-off bytes and both
engines choose the same healed ids."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gptj_generator.healing import AllowedIds, Healing, choose
from gptj_generator.sampling import new_generator, sample, token_logprob
from gptj_generator.seam import GenerationRequest, SamplingParams
from stage_common.errors import BadInput
from test_codegen_engine import ENGINES, PROMPTS, Collector, ids_of, make_engine, reference_model, tokenizer  # noqa: F401

TOLERANCE = 1e-4
TOP = 5


class EchoCollector(Collector):
    """Also records the prompt's logprobs (sent once, with the first chunk)."""

    def __init__(self):
        super().__init__()
        self.prompt_logprobs = None

    def send(self, token_ids, logprobs=None, prompt_logprobs=None):
        if prompt_logprobs is not None:
            assert self.prompt_logprobs is None, "the prompt's logprobs came twice"
            self.prompt_logprobs = prompt_logprobs
        super().send(token_ids, logprobs)

    def finish(self, reason, token_ids, logprobs=None, prompt_logprobs=None):
        if prompt_logprobs is not None and not token_ids:
            self.send([], logprobs, prompt_logprobs)
            prompt_logprobs = None
        if token_ids:
            self.send(token_ids, logprobs, prompt_logprobs)
        self.reason = reason
        self.done.set()


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    engine = make_engine(request.param)
    yield engine
    engine.close()


def reference_logprobs(ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(reference_model()(torch.tensor([ids])).logits[0].float(), -1)


def assert_matches(lp, row: torch.Tensor, top: int) -> None:
    """One TokenLogprob against the reference's log_softmax row predicting its id."""
    assert abs(lp.logprob - float(row[lp.token_id])) < TOLERANCE
    assert len(lp.top) == top
    best = torch.topk(row, top + 1)
    for rank, (token, logprob) in enumerate(lp.top):
        assert abs(logprob - float(best.values[rank])) < TOLERANCE
        assert abs(float(row[token]) - logprob) < TOLERANCE  # ties may swap ids, never values
    assert [t for t, _ in lp.top] == best.indices[:top].tolist() or \
        float(best.values[top - 1] - best.values[top]) < TOLERANCE


def test_generated_and_prompt_logprobs_with_alternatives_equal_transformers(engine, tokenizer):
    for prompt in (PROMPTS[0], PROMPTS[3]):
        ids = ids_of(tokenizer, prompt)
        sink = EchoCollector()
        engine.submit(GenerationRequest(ids, 12, logprobs=TOP, prompt_logprobs=True), sink)
        assert sink.wait().error is None, sink.error
        reference = reference_logprobs(ids + sink.ids)
        assert sink.prompt_logprobs[0] is None and len(sink.prompt_logprobs) == len(ids)
        for i, lp in enumerate(sink.prompt_logprobs[1:], start=1):
            assert lp.token_id == ids[i]
            assert_matches(lp, reference[i - 1], TOP)
        assert [lp.token_id for lp in sink.logprobs] == sink.ids and sink.ids
        for j, lp in enumerate(sink.logprobs):
            assert_matches(lp, reference[len(ids) - 1 + j], TOP)
            assert lp.top[0][0] == lp.token_id or lp.top[0][1] - lp.logprob < TOLERANCE  # greedy


def test_score_only_request_ends_with_the_prompt_logprobs(engine, tokenizer):
    ids = ids_of(tokenizer, PROMPTS[3])
    sink = EchoCollector()
    engine.submit(GenerationRequest(ids, 0, logprobs=1, prompt_logprobs=True), sink)
    assert sink.wait().error is None and sink.reason == "length" and sink.ids == []
    reference = reference_logprobs(ids)
    assert [lp.token_id for lp in sink.prompt_logprobs[1:]] == ids[1:]
    for i, lp in enumerate(sink.prompt_logprobs[1:], start=1):
        assert_matches(lp, reference[i - 1], 1)
    with pytest.raises(BadInput, match="max_tokens must be between 1 and 512, got 0"):
        engine.submit(GenerationRequest(ids, 0, logprobs=1), EchoCollector())
    with pytest.raises(BadInput, match="prompt_logprobs needs logprobs"):
        engine.submit(GenerationRequest(ids, 0, prompt_logprobs=True), EchoCollector())


def healed(engine, tokenizer, prompt: str, max_tokens: int = 16, **sampling) -> tuple[bytes, list[int]]:
    """The prompt with its last id backed off and healed; (backed-off bytes, generated ids)."""
    ids = ids_of(tokenizer, prompt)
    prefix = engine.token_bytes[ids[-1]]
    sink = Collector()
    engine.submit(GenerationRequest(ids[:-1], max_tokens, SamplingParams(**sampling), heal_prefix=prefix), sink)
    assert sink.wait().error is None, sink.error
    return prefix, sink.ids


HEAL_PROMPTS = ["def is_prime(n):\n", "def mean(values):\n", "class Foo:\n    ", "def mean(val"]


@pytest.fixture(scope="module")
def torch_healed(tokenizer):
    engine = make_engine("torch")
    yield {p: healed(engine, tokenizer, p) for p in HEAL_PROMPTS}
    engine.close()


def test_healing_spells_the_prefix_first_and_engines_agree(engine, tokenizer, torch_healed):
    for prompt in HEAL_PROMPTS:
        prefix, ids = healed(engine, tokenizer, prompt)
        spelled = b"".join(engine.token_bytes[i] for i in ids)
        assert spelled.startswith(prefix) and len(spelled) > len(prefix), (prompt, spelled)
        assert ids == torch_healed[prompt][1], prompt  # greedy: the same constrained choice on both engines
        # sampled: still constrained
        prefix, ids = healed(engine, tokenizer, prompt, 4, temperature=1.5, seed=7)
        assert b"".join(engine.token_bytes[i] for i in ids).startswith(prefix) or not ids


def test_healing_constraint_spells_a_prefix_over_several_ids():
    table = [b"", b" ", b"  ", b"   x", b"x", b"\n", b"\n  "]
    healing = Healing(AllowedIds(table), b"   ")
    assert healing.allowed().tolist() == [1, 2, 3]
    healing.advance(2)
    assert healing.remaining == b" " and healing.allowed().tolist() == [1, 2, 3]
    healing.advance(3)
    assert not healing.active
    logits = np.array([9.0, 1.0, 2.0, 0.5, 8.0, 7.0, 3.0])
    rng = np.random.default_rng(1)
    assert choose(logits, np.array([5, 6]), SamplingParams(), rng) == 5
    drawn = {choose(logits, np.array([1, 2, 3]), SamplingParams(temperature=1.0, seed=1), rng) for _ in range(200)}
    assert drawn == {1, 2, 3}
    assert {choose(logits, np.array([1, 2, 3]), SamplingParams(temperature=1.0, top_k=1), rng)
            for _ in range(50)} == {2}


LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0], np.float32)  # softmax: id 5 0.61, id 0 0.22, id 1 0.08, ...


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_the_one_sampler_filters_and_draws_alike_on_numpy_and_torch(library):
    """Both engines call sampling.sample: the OpenVINO engine on numpy rows, the torch engine on its logits tensor."""
    row, device = (LOGITS, None) if library == "numpy" else (torch.from_numpy(LOGITS), "cpu")

    def drawn(draws: int = 1000, **params) -> list[int]:
        sampling = SamplingParams(seed=3, **params)
        generator = new_generator(sampling, device)
        return [sample(row, sampling, generator) for _ in range(draws)]

    assert set(drawn(temperature=1.0)) == set(range(6))
    assert set(drawn(temperature=1.0, top_k=3)) == {5, 0, 1}
    assert set(drawn(temperature=1.0, top_p=0.8)) == {5, 0}  # the mass before id 1 (0.83) reaches 0.8
    assert set(drawn(temperature=1.0, top_p=0.86)) == {5, 0, 1}
    assert set(drawn(temperature=1.0, top_k=4, top_p=0.86)) == {5, 0}  # top-k first: then id 1 comes after 0.86
    assert set(drawn(temperature=1e-9)) == {5} and sample(row, SamplingParams(), None) == 5  # greedy
    assert drawn(20, temperature=1.0) == drawn(20, temperature=1.0), "a seed draws the same ids"
    with pytest.raises(FloatingPointError):  # NaN logits fail their request, never draw garbage
        sample(row * float("nan"), SamplingParams(temperature=1.0), new_generator(SamplingParams(1.0), device))


def test_the_one_logprob_function_gives_the_same_on_numpy_and_torch():
    """Both engines call sampling.token_logprob: numpy rows in float64, torch rows in float32 (as the reference)."""
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 3
    reference = torch.log_softmax(torch.from_numpy(logits), -1)
    for row in (logits, torch.from_numpy(logits)):
        lp = token_logprob(row, 7, TOP)
        assert lp.token_id == 7 and abs(lp.logprob - float(reference[7])) < 1e-5
        assert [i for i, _ in lp.top] == torch.topk(reference, TOP).indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(torch.topk(reference, TOP).values.tolist(), abs=1e-5)
    assert token_logprob(logits, 7, 0).top == ()


def test_an_over_long_heal_prefix_fails_its_request_alone(engine, tokenizer):
    """codegen_generator's heal_prefix comes from the preprocessing, but a direct caller may send anything: one over
    the bound is refused at submit (INVALID_ARGUMENT in Triton) and a batch-mate submitted beside it is served. (Any
    bytes are spellable in a byte-level BPE: every single byte is an id.)"""
    from gptj_generator.healing import MAX_HEAL_PREFIX_BYTES

    ids = ids_of(tokenizer, "def mean(values):")
    mate = Collector()
    engine.submit(GenerationRequest(ids, 8), mate)
    with pytest.raises(BadInput, match="over"):
        engine.submit(GenerationRequest(ids, 8, heal_prefix=b"x" * (MAX_HEAL_PREFIX_BYTES + 1)), Collector())
    assert mate.wait().error is None and mate.ids, mate.error
