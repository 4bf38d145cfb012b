"""The codegen stages without a server: both generator engines (torch and OpenVINO, behind the engine seam)
against transformers' generate, sampling, stop words, UTF-8 hold-back, cancellation; the torch engine's own
batching (chunked prefill, the vocabulary projection); and the tokenizer stages' checks.

Tests taking `engine` run once per engine (ENGINES); `torch_engine` is the torch engine alone."""
from __future__ import annotations

import copy
import json
import threading
import time
from functools import lru_cache

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GPTJForCausalLM

import fake_pb_utils
from build import codegen as codegen_build
from codegen_common.detokenizer import Detokenizer, cut_at_stop_words
from codegen_preprocess.prompt_encoder import PromptEncoder, PromptRequest
from gptj_generator.loading import load_engine
from gptj_generator.seam import GenerationRequest, SamplingParams
from gptj_generator.text_stream import TextStream
from gptj_generator.torch_engine import TorchEngine
from model_configs import MODEL_REPOSITORY, load_python_model
from stage_common.errors import BadInput

GENERATOR_DIR = MODEL_REPOSITORY / "codegen_generator" / "1"
ENGINES = ["torch", "openvino"]
PROMPTS = ["def fibonacci(n):", "import os\n", "x",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
           "for i in range(10):\n    print(i)  # a longer prompt than the others, to force left padding"]
WAIT = 120


class Collector:
    """An engine sink that records what a client would receive; can cancel or break mid-way."""

    def __init__(self, cancel_after: int | None = None, fail_send_after: int | None = None):
        self.chunks: list[list[int]] = []
        self.logprobs: list = []
        self.reason = self.error = None
        self.done = threading.Event()
        self.progress = threading.Condition()
        self.cancel_after, self.fail_send_after = cancel_after, fail_send_after

    @property
    def ids(self) -> list[int]:
        return [i for chunk in self.chunks for i in chunk]

    def send(self, token_ids, logprobs=None):
        if self.fail_send_after is not None and len(self.ids) >= self.fail_send_after:
            raise ConnectionError("client went away")
        with self.progress:
            self.chunks.append(list(token_ids))
            self.logprobs += logprobs or []
            self.progress.notify_all()

    def finish(self, reason, token_ids, logprobs=None):
        if token_ids:
            self.send(token_ids, logprobs)
        self.reason = reason
        self.done.set()

    def fail(self, error):
        self.error = error
        self.done.set()

    def cancelled(self):
        return self.cancel_after is not None and len(self.ids) >= self.cancel_after

    def wait_tokens(self, n: int) -> None:
        with self.progress:
            assert self.progress.wait_for(lambda: len(self.ids) >= n or self.done.is_set(), WAIT)

    def wait(self, timeout: float = WAIT) -> "Collector":
        assert self.done.wait(timeout), "generation did not finish"
        return self


def make_engine(kind: str, **options):
    """An engine of `kind` over the demo generator (one inference thread: stable on a shared 2-core box); OpenVINO in
    f32 unless asked otherwise, the exact mode these tests hold to transformers (auto would be bf16 on a CPU with
    AVX512_BF16 or AMX, f32 on others: the same test must hold on both)."""
    if kind == "torch":
        torch.set_num_threads(1)
    else:
        options.setdefault("precision", "f32")
    options.setdefault("max_batch_size", 8)
    options.setdefault("max_tokens_limit", 512)
    return load_engine(kind, GENERATOR_DIR, **options)


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    engine = make_engine(request.param)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def torch_engine():
    engine = make_engine("torch")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(GENERATOR_DIR))


@lru_cache(maxsize=1)
def reference_model() -> GPTJForCausalLM:
    """transformers' GPT-J on the same weights: what every engine's greedy tokens are held to."""
    torch.set_num_threads(1)
    return GPTJForCausalLM.from_pretrained(str(GENERATOR_DIR), dtype=torch.float32).eval()


def reference(tokenizer, prompt: str, max_tokens: int) -> list[int]:
    """transformers' own greedy generation for one unpadded prompt; the EOS is never streamed."""
    model = reference_model()
    encoded = tokenizer(prompt, return_tensors="pt")
    assert set(encoded) == {"input_ids", "attention_mask"}, "GPT-J must never get token_type_ids"
    with torch.inference_mode():
        out = model.generate(**encoded, max_new_tokens=max_tokens, do_sample=False)
    ids = out[0, encoded["input_ids"].shape[1]:].tolist()
    return ids[:-1] if ids and ids[-1] == model.config.eos_token_id else ids


def ids_of(tokenizer, prompt: str) -> list[int]:
    return tokenizer(prompt)["input_ids"]


def test_greedy_equals_generate_for_prompts_joining_at_different_steps(engine, tokenizer):
    lengths = [48, 40, 32, 24, 16]
    expected = [reference(tokenizer, p, n) for p, n in zip(PROMPTS, lengths)]
    sinks = []
    for prompt, n in zip(PROMPTS, lengths):
        if sinks:
            sinks[-1].wait_tokens(5)  # the previous one is mid-generation: this one joins a running batch
        sinks.append(Collector())
        engine.submit(GenerationRequest(ids_of(tokenizer, prompt), n), sinks[-1])
    for sink, want, prompt in zip(sinks, expected, PROMPTS):
        assert sink.wait().ids == want, prompt
        assert sink.reason in ("length", "eos")
    # the reverse arrival order (short prompts first) gives the same tokens too
    reverse = []
    for prompt, n in zip(PROMPTS[::-1], lengths):
        if reverse:
            reverse[-1].wait_tokens(3)
        reverse.append(Collector())
        engine.submit(GenerationRequest(ids_of(tokenizer, prompt), n), reverse[-1])
    for sink, prompt, n in zip(reverse, PROMPTS[::-1], lengths):
        assert sink.wait().ids == reference(tokenizer, prompt, n), prompt


def test_greedy_equals_generate_for_prompts_prefilled_together(engine, tokenizer):
    """Requests that arrive together share one left-padded prefill pass."""
    sinks = [Collector() for _ in PROMPTS]
    for prompt, sink in zip(PROMPTS, sinks):
        engine.submit(GenerationRequest(ids_of(tokenizer, prompt), 24), sink)
    for prompt, sink in zip(PROMPTS, sinks):
        assert sink.wait().ids == reference(tokenizer, prompt, 24), prompt


def test_compute_is_charged_once_per_sequence_in_each_step(engine, tokenizer):
    """request_seconds counts a step once for every row in it (Triton's per-request statistics
    for a batched model); busy_seconds counts it once."""
    def run(prompts: list[str]) -> tuple[float, float]:
        busy, charged = engine.busy_seconds, engine.request_seconds
        sinks = [Collector() for _ in prompts]
        for prompt, sink in zip(prompts, sinks):
            engine.submit(GenerationRequest(ids_of(tokenizer, prompt), 16), sink)
        for sink in sinks:
            sink.wait()
        time.sleep(0.2)  # the loop's last turn is counted after the final send
        return engine.busy_seconds - busy, engine.request_seconds - charged

    busy, charged = run(PROMPTS[:1])
    assert charged == pytest.approx(busy, rel=1e-6)
    busy, charged = run(PROMPTS[:3])
    assert 1.5 * busy < charged <= 3 * busy * (1 + 1e-6)


def test_seeded_sampling_is_reproducible_and_depends_on_the_seed(engine, tokenizer):
    prompt = ids_of(tokenizer, PROMPTS[0])
    settings = [SamplingParams(1.0, 0, 1.0, 7), SamplingParams(0.8, 50, 0.9, 7)]
    runs = {}
    others = (8, 9, 10, 11)  # the demo model may end a sampled row early (end-of-text): more than one other seed
    for params in settings:
        for seed in (7, 7) + others:
            sink = Collector()
            engine.submit(GenerationRequest(prompt, 24, SamplingParams(params.temperature, params.top_k,
                                                                       params.top_p, seed)), sink)
            runs.setdefault((params, seed), []).append(sink)
        # a greedy batch-mate must not change the sampled tokens
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[3]), 24), Collector())
    for params in settings:
        first, again = [s.wait().ids for s in runs[(params, 7)]]
        assert first == again and first
        assert any(runs[(params, seed)][0].wait().ids != first for seed in others), "the seed changes nothing"


def test_top_k_1_is_greedy(engine, tokenizer):
    sink = Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[1]), 16, SamplingParams(1.0, 1, 1.0, 3)), sink)
    assert sink.wait().ids == reference(tokenizer, PROMPTS[1], 16)


def test_stop_word_ends_generation_and_is_cut(engine, tokenizer):
    full = reference(tokenizer, PROMPTS[1], 48)  # runs to 48 (the demo model ends a function early)
    text = tokenizer.decode(full, skip_special_tokens=True)
    stop = text[20:23]
    assert stop.strip(), "pick a visible stop word"
    sink = Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[1]), 48, stop_words=[stop]), sink)
    sink.wait()
    assert sink.reason == "stop" and len(sink.ids) < len(full)
    assert sink.ids == full[:len(sink.ids)]
    pieces = [tokenizer.decode(c, skip_special_tokens=True) for c in sink.chunks]
    assert all(stop not in p for p in pieces[:-1]), "only the last chunk may hold the stop word"
    assert cut_at_stop_words("".join(pieces), [stop]) == text[:text.index(stop)]


def test_validation_errors_name_the_problem_and_the_engine_keeps_serving(engine, tokenizer):
    prompt = ids_of(tokenizer, "x")
    cases = {
        "the prompt is empty": GenerationRequest([], 8),
        "max_tokens must be between 1 and 512, got 0": GenerationRequest(prompt, 0),
        "max_tokens must be between 1 and 512, got 513": GenerationRequest(prompt, 513),
        "context window of 1024 tokens leaves room for at most 524": GenerationRequest(prompt * 600, 500),
        "temperature must be >= 0": GenerationRequest(prompt, 8, SamplingParams(temperature=-0.5)),
        "top_p must be in (0, 1], got 0.0": GenerationRequest(prompt, 8, SamplingParams(1.0, 0, 0.0)),
        "top_p must be in (0, 1], got 1.5": GenerationRequest(prompt, 8, SamplingParams(1.0, 0, 1.5)),
        "top_k must be >= 0": GenerationRequest(prompt, 8, SamplingParams(1.0, -1, 1.0)),
    }
    for message, request in cases.items():
        with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            engine.submit(request, Collector())
    sink = Collector()
    engine.submit(GenerationRequest(prompt, 8), sink)
    assert sink.wait().ids == reference(tokenizer, "x", 8)


@pytest.mark.parametrize("how", ["cancelled", "send fails"])
def test_a_client_that_leaves_frees_its_row(engine, tokenizer, how):
    kwargs = {"cancel_after": 4} if how == "cancelled" else {"fail_send_after": 4}
    leaving, staying = Collector(**kwargs), Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[2]), 400), leaving)
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[0]), 40), staying)
    leaving.wait()
    expected = "cancelled" if how == "cancelled" else None
    assert leaving.reason == expected and len(leaving.ids) < 200  # of 400
    assert (leaving.error is None) == (how == "cancelled"), "a failed send is an error, a cancel is not"
    assert staying.wait().ids == reference(tokenizer, PROMPTS[0], 40)
    deadline = time.monotonic() + WAIT
    while engine.active and time.monotonic() < deadline:  # the loop drops the row right after finish()
        time.sleep(0.01)
    assert engine.active == 0


def test_cancel_by_key_stops_a_running_or_waiting_request(engine, tokenizer):
    running, waiting = Collector(), Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 400, key="running"), running)
    running.wait_tokens(3)
    engine.cancel("running")
    engine.cancel("no such request")  # harmless
    running.wait()
    assert running.reason == "cancelled" and len(running.ids) < 50
    fillers = [Collector() for _ in range(engine.max_batch_size)]
    for sink in fillers:
        engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 30), sink)
    engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 30, key="waiting"), waiting)  # no free row yet
    engine.cancel("waiting")
    assert waiting.wait().reason == "cancelled" and waiting.ids == []
    for sink in fillers:
        assert sink.wait().reason == "length"


# ---- chunked prefill ----------------------------------------------------------------------------

CHUNK = 4  # prompt tokens fed per loop turn while others decode, small so every prompt here is chunked


@pytest.fixture(scope="module")
def chunked_engine():
    engine = make_engine("torch", prefill_chunk_tokens=CHUNK)
    yield engine
    engine.close()


class StepRecorder(Collector):
    """Also notes the engine's decode-step count when the first token arrives."""

    def __init__(self, engine, **kwargs):
        super().__init__(**kwargs)
        self.engine, self.steps_at_first = engine, None

    def send(self, token_ids):
        if self.steps_at_first is None:
            self.steps_at_first = self.engine.steps
        super().send(token_ids)


def test_a_long_prompt_is_fed_in_chunks_between_the_running_batchs_steps(chunked_engine, tokenizer):
    """While a sequence decodes, a joining prompt of L tokens is fed CHUNK tokens per turn with a
    decode step after each: the running sequence gets ceil(L / CHUNK) - 1 steps before the joiner's
    first token (all-at-once prefill gives it none), and both equal transformers' generate."""
    engine = chunked_engine
    prompt = ids_of(tokenizer, PROMPTS[3])
    assert len(prompt) > 5 * CHUNK
    running, joining = Collector(), StepRecorder(engine)
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[0]), 120), running)
    running.wait_tokens(3)
    steps_at_submit = engine.steps
    engine.submit(GenerationRequest(prompt, 24), joining)
    assert joining.wait().ids == reference(tokenizer, PROMPTS[3], 24)
    assert running.wait().ids == reference(tokenizer, PROMPTS[0], 120)
    assert joining.steps_at_first - steps_at_submit >= -(-len(prompt) // CHUNK) - 1


def test_prompts_fed_together_in_chunks_equal_generate(chunked_engine, tokenizer):
    """A left-padded group of prompts of different lengths, chunked while another sequence decodes."""
    engine = chunked_engine
    running = Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[1]), 200), running)
    running.wait_tokens(2)
    sinks = [Collector() for _ in PROMPTS]
    for prompt, sink in zip(PROMPTS, sinks):
        engine.submit(GenerationRequest(ids_of(tokenizer, prompt), 16), sink)
    for prompt, sink in zip(PROMPTS, sinks):
        assert sink.wait().ids == reference(tokenizer, prompt, 16), prompt
    assert running.wait().ids == reference(tokenizer, PROMPTS[1], 200)


class CancelledOnPoll(Collector):
    """A client that leaves when asked for the n-th time (the engine asks every turn)."""

    def __init__(self, polls: int):
        super().__init__()
        self.polls, self.asked = polls, 0

    def cancelled(self):
        self.asked += 1
        return self.asked >= self.polls


def test_a_client_leaving_while_its_prompt_is_fed_frees_its_row_and_spares_its_group(tokenizer):
    engine = make_engine("torch", prefill_chunk_tokens=CHUNK, cancel_poll_seconds=0)
    try:
        running = Collector()
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[0]), 200), running)
        running.wait_tokens(2)
        leaving, staying = CancelledOnPoll(polls=3), Collector()  # asked at admission, then per turn
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[3]), 30), leaving)
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[4]), 30), staying)
        assert leaving.wait().reason == "cancelled" and leaving.ids == []
        assert staying.wait().ids == reference(tokenizer, PROMPTS[4], 30)
        assert running.wait().ids == reference(tokenizer, PROMPTS[0], 200)
    finally:
        engine.close()


def test_only_the_last_prompt_position_goes_through_the_vocabulary_projection(torch_engine, tokenizer):
    engine = torch_engine
    prompts = PROMPTS[3:5]
    expected = [reference(tokenizer, prompt, 4) for prompt in prompts]  # generate's own calls unhooked
    shapes = []
    hook = engine.model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: shapes.append(tuple(args[0].shape)))
    try:
        sinks = [Collector() for _ in prompts]
        for prompt, sink in zip(prompts, sinks):
            engine.submit(GenerationRequest(ids_of(tokenizer, prompt), 4), sink)
        assert [sink.wait().ids for sink in sinks] == expected
    finally:
        hook.remove()
    hidden = engine.model.config.n_embd
    assert shapes and all(len(shape) == 2 and shape[1] == hidden for shape in shapes), shapes  # [rows, hidden]


# ---- UTF-8: a model made to spell "€" (3 bytes) one byte-token at a time -----------------------

def euro_spelling_engine(engine) -> tuple[TorchEngine, list[int]]:
    """The demo GPT-J with its blocks silenced (each block adds nothing to the residual), so the next
    token depends on the last one only; lm_head then maps each byte of "€" to the next byte."""
    model = copy.deepcopy(engine.model)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.out_proj.weight.zero_()
            block.mlp.fc_out.weight.zero_()
            block.mlp.fc_out.bias.zero_()
        table = engine.token_bytes
        start = table.index(b"x")
        euro = [table.index(bytes([b])) for b in "€".encode()]
        nxt = {start: euro[0], euro[0]: euro[1], euro[1]: euro[2], euro[2]: euro[0]}
        embeddings = torch.eye(model.config.n_embd)[:len(nxt)] * 3
        model.lm_head.weight.zero_()
        model.lm_head.bias.zero_()
        for row, (token, follower) in enumerate(nxt.items()):
            model.transformer.wte.weight[token] = embeddings[row]
            normed = model.transformer.ln_f(embeddings[row])
            model.lm_head.weight[follower] += normed  # "€" follows both "x" and the last byte of "€"
    return TorchEngine(model, table, engine.eos, 4, 512), [start] + euro


def test_multi_byte_characters_split_across_tokens_are_held_back(torch_engine):
    engine = torch_engine
    spelling, (start, *euro) = euro_spelling_engine(engine)
    try:
        sink = Collector()
        spelling.submit(GenerationRequest([start], 10), sink)
        sink.wait()
    finally:
        spelling.close()
    assert sink.error is None and sink.reason == "length", (sink.error, sink.reason, sink.chunks)
    assert sink.ids[:9] == euro * 3, "the crafted model spells euro signs"
    assert sink.chunks[:3] == [euro] * 3, "each character is released whole"
    texts = [b"".join(engine.token_bytes[i] for i in chunk).decode("utf-8") for chunk in sink.chunks[:3]]
    assert texts == ["€"] * 3
    assert sink.chunks[-1] == [euro[0]], "at the end, an unfinished character is flushed"


def test_text_stream_holds_back_partial_characters_and_stop_word_prefixes(torch_engine):
    table = torch_engine.token_bytes
    tok = {bytes([b]): table.index(bytes([b])) for b in b"ab\n\xc3\xa9\xff"}
    stream = TextStream(table)
    assert stream.push(tok[b"a"]) == [tok[b"a"]]
    assert stream.push(tok[b"\xc3"]) == []  # first half of "é"
    assert stream.push(tok[b"\xa9"]) == [tok[b"\xc3"], tok[b"\xa9"]]
    assert stream.push(tok[b"\xff"]) == [tok[b"\xff"]]  # can never become valid: released at once
    stream = TextStream(table, stop_words=["\nb"])
    assert stream.push(tok[b"a"]) == [tok[b"a"]]
    assert stream.push(tok[b"\n"]) == []  # may be the start of the stop word
    assert stream.push(tok[b"a"]) == [tok[b"\n"], tok[b"a"]]
    assert stream.push(tok[b"\n"]) == []
    assert stream.push(tok[b"b"]) == [tok[b"\n"], tok[b"b"]] and stream.stopped


# ---- the tokenizer stages (no torch) -------------------------------------------------------------

def test_token_bytes_match_the_tokenizers_decoder(torch_engine, tokenizer):
    engine = torch_engine
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(0, len(tokenizer), size=int(rng.integers(1, 30))).tolist()
        assert b"".join(engine.token_bytes[i] for i in ids).decode("utf-8", "replace") == \
            tokenizer.decode(ids, skip_special_tokens=True)


def test_ids_beyond_the_tokenizer_stream_as_nothing_and_a_padded_demo_vocabulary_never_yields_them(
        torch_engine, tokenizer, monkeypatch):
    """codegen-350M's vocabulary (51200) is larger than its tokenizer's; so is the bench's 350m demo."""
    engine = torch_engine
    beyond = len(tokenizer) + 7
    stream = TextStream(engine.token_bytes)
    assert stream.push(beyond) == [beyond] and stream.text == ""
    assert tokenizer.decode([beyond]) == ""  # what the postprocessing makes of it

    monkeypatch.setitem(codegen_build.DEMO_SIZES, "padded", dict(
        vocab_size=len(tokenizer) + 512, n_positions=128, n_embd=32, n_layer=1, n_head=2, rotary_dim=8))
    model = codegen_build.demo_model(tokenizer, "padded")
    assert model.config.vocab_size == len(tokenizer) + 512
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(**tokenizer(PROMPTS[0], return_tensors="pt"), max_new_tokens=64, do_sample=True,
                             temperature=1.0, top_k=0)
    assert int(out.max()) < len(tokenizer)


def test_preprocess_matches_transformers_and_checks_each_request(tokenizer):
    encoder = PromptEncoder(MODEL_REPOSITORY / "codegen_preprocess" / "1" / "tokenizer.json", 1024, 512)
    ok, too_long = PromptRequest(PROMPTS[3], 64), PromptRequest("x " * 600, 500)
    encoded = encoder.encode([ok, too_long])
    assert encoded[0].tolist() == ids_of(tokenizer, PROMPTS[3]) and encoded[0].dtype == np.int32
    assert isinstance(encoded[1], BadInput) and "at most 524" in str(encoded[1])
    with pytest.raises(BadInput, match="empty"):
        PromptRequest("", 8).check()


def _string(*values: bytes) -> np.ndarray:
    return np.array([list(values)], dtype=np.object_)


def test_preprocess_model_isolates_bad_requests():
    model = load_python_model("codegen_preprocess")
    good = {"text_input": _string(b"def f():"), "request_output_len": np.array([[8]], np.int32)}
    bad = [
        {"text_input": _string(b""), "request_output_len": np.array([[8]], np.int32)},
        {"text_input": _string(b"\xff\xfe"), "request_output_len": np.array([[8]], np.int32)},
        {"text_input": _string(b"x"), "request_output_len": np.array([[0]], np.int32)},
        {**good, "temperature": np.array([[-1.0]], np.float32)},
        {**good, "runtime_top_p": np.array([[0.0]], np.float32)},
        {**good, "stop_words": _string(b"ok", b"\xff")},
    ]
    responses = model.execute([fake_pb_utils.InferenceRequest(r) for r in [good, *bad, good]])
    assert not responses[0].has_error() and not responses[-1].has_error()
    assert responses[0].output("input_lengths").tolist() == [[responses[0].output("input_ids").shape[1]]]
    for response in responses[1:-1]:
        assert response.has_error() and response.error().code() == fake_pb_utils.TritonError.INVALID_ARG


def test_postprocess_decodes_and_cuts_at_the_first_stop_word(tokenizer):
    ids = np.array(ids_of(tokenizer, "a = 1\nb = 2\nc = 3\n"), dtype=np.int32)
    detok = Detokenizer(MODEL_REPOSITORY / "codegen_postprocess" / "1" / "tokenizer.json")
    assert detok.decode([(ids, []), (ids, ["c =", "\nb"])]) == ["a = 1\nb = 2\nc = 3\n", "a = 1"]
    model = load_python_model("codegen_postprocess")
    responses = model.execute([fake_pb_utils.InferenceRequest({"output_ids": ids[None, :],
                                                               "stop_words": _string(b"b =")})])
    assert responses[0].output("text_output").tolist() == [[b"a = 1\n"]]


def test_preprocess_checks_the_generators_limits():
    from model_configs import parse_config

    limit = [parse_config(m).parameters["max_tokens_limit"].string_value
             for m in ("codegen_preprocess", "codegen_generator")]
    assert limit[0] == limit[1], "codegen_preprocess must reject exactly what the generator would"
    window = json.loads((MODEL_REPOSITORY / "codegen_preprocess" / "1" / "config.json").read_text())["n_positions"]
    assert window == json.loads((GENERATOR_DIR / "config.json").read_text())["n_positions"]


# ---- issue 35: every request fails alone, none is lost --------------------------------------------

@pytest.mark.parametrize("bad_id", [-1, 999_999])
def test_an_id_outside_the_vocabulary_is_refused_alone_and_the_running_batch_goes_on(engine, tokenizer, bad_id):
    """Issue 35, item 1: the generator is public on Triton; an out-of-vocabulary id used to raise in the
    embedding, killing the decode loop and every request in it."""
    running = Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[0]), 24), running)
    running.wait_tokens(1)
    with pytest.raises(BadInput, match=rf"input_ids must lie in \[0, {engine.vocab_size}\)"):
        engine.submit(GenerationRequest(ids_of(tokenizer, "x") + [bad_id], 8), Collector())
    assert running.wait().error is None and running.ids == reference(tokenizer, PROMPTS[0], 24)
    assert engine.vocab_size == reference_model().get_input_embeddings().num_embeddings


class CancelledRaises(Collector):
    def cancelled(self):
        raise ConnectionError("the sink could not ask its client")


def test_admission_is_all_or_fail(tokenizer, monkeypatch):
    """Issue 35, item 7: requests taken from the queue but not yet prefilling were lost (never answered)
    when asking a sink or building their tensors raised; now each is failed, the running batch goes on."""
    engine = make_engine("torch", cancel_poll_seconds=0)
    try:
        running = Collector()
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[0]), 60), running)
        running.wait_tokens(1)
        # a sink that raises when asked fails alone; its batch-mate is served
        broken, mate = CancelledRaises(), Collector()
        engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 8), broken)
        engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[1]), 8), mate)
        assert isinstance(broken.wait().error, ConnectionError)
        assert mate.wait().error is None and mate.ids == reference(tokenizer, PROMPTS[1], 8)
        # building the admitted group's tensors raises: every admitted request is failed, none is lost
        real = engine._left_padded
        calls = []

        def broken_copy(seqs):
            calls.append(len(seqs))
            if len(calls) == 1:
                raise RuntimeError("copy to the device failed")
            return real(seqs)

        monkeypatch.setattr(engine, "_left_padded", broken_copy)
        admitted = [Collector(), Collector()]
        with engine._wakeup:  # queued together, so admitted together
            for sink in admitted:
                engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 8), sink)
        for sink in admitted:
            assert isinstance(sink.wait().error, RuntimeError), "an admitted request was lost"
        assert engine.restarts == 0, "the running batch did not have to die"
        after = Collector()
        engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 8), after)
        assert after.wait().ids == reference(tokenizer, "x", 8)
        assert running.wait().error is None and running.ids == reference(tokenizer, PROMPTS[0], 60)
        assert engine._admitting == [] and engine.active == 0
    finally:
        engine.close()


def test_a_loop_death_during_admission_fails_the_admitted_requests(tokenizer, monkeypatch):
    """Issue 35, item 7: a BaseException (not caught by admission) still reaches every admitted request."""
    engine = make_engine("torch", cancel_poll_seconds=0)
    try:
        def dies(*_):
            monkeypatch.undo()
            raise KeyboardInterrupt("the loop died mid-admission")

        monkeypatch.setattr(engine, "_prefill_groups", dies)
        sink = Collector()
        engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 8), sink)
        assert sink.wait().error is not None, "the admitted request was lost"
        after = Collector()
        engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 8), after)
        assert after.wait().ids == reference(tokenizer, "x", 8)
    finally:
        engine.close()


# ---- the seam's extras: per-token logprobs and per-request events (both engines) -----------------------------

def test_logprobs_come_with_their_ids_only_when_asked(engine, tokenizer):
    plain, scored = Collector(), Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[3]), 24), plain)
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[3]), 24, logprobs=0), scored)
    assert plain.wait().ids == scored.wait().ids == reference(tokenizer, PROMPTS[3], 24)
    assert plain.logprobs == []
    assert [lp.token_id for lp in scored.logprobs] == scored.ids
    assert all(lp.logprob <= 0 and lp.top == () for lp in scored.logprobs)
    too_many = engine.max_top_logprobs + 1
    with pytest.raises(BadInput, match=f"logprobs must be between 0 and {engine.max_top_logprobs}"):
        engine.submit(GenerationRequest(ids_of(tokenizer, "x"), 4, logprobs=too_many), Collector())


def test_top_alternatives_come_from_the_torch_engines_logits(torch_engine, tokenizer):
    sink = Collector()
    torch_engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[0]), 8, logprobs=3), sink)
    sink.wait()
    for lp in sink.logprobs:  # greedy: the chosen id is the most likely one
        assert len(lp.top) == 3 and lp.top[0] == (lp.token_id, pytest.approx(lp.logprob))
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_each_request_reports_its_events_in_order(engine, tokenizer):
    events, done = [], Collector()
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[1]), 6, on_event=events.append), done)
    done.wait()
    assert [e.name for e in events] == ["queued", "scheduled", "first_token", "finished"]
    assert events[0].attributes == {"prompt_tokens": len(ids_of(tokenizer, PROMPTS[1])), "max_tokens": 6}
    assert events[-1].attributes == {"reason": done.reason, "completion_tokens": len(done.ids)}
    assert [e.time_ns for e in events] == sorted(e.time_ns for e in events)
    broken = Collector()  # a listener that raises changes nothing
    engine.submit(GenerationRequest(ids_of(tokenizer, PROMPTS[1]), 6, on_event=lambda e: 1 / 0), broken)
    assert broken.wait().error is None and broken.ids == done.ids
