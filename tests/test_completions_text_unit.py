"""The torch-free halves of issue 44's logprobs and token healing: which prompts the preprocessing heals, how the
fronts cut the healed text from the answer (across pieces, before stop words) and build OpenAI's logprobs object
from the generator's wire format, and the preprocessing stage's rows with the new inputs."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer

import fake_pb_utils
from codegen_common import logprobs_wire
from codegen_common.completion_text import CompletionTexts, token_string
from codegen_common.generation_params import GenerationParams
from codegen_preprocess.healing import heal
from gptj_generator.seam import TokenLogprob
from model_configs import MODEL_REPOSITORY, load_python_model

TOKENIZER = MODEL_REPOSITORY / "codegen_preprocess" / "1" / "tokenizer.json"


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(TOKENIZER))


@pytest.fixture(scope="module")
def texts():
    return CompletionTexts(TOKENIZER)


def ids(tokenizer, text: str) -> np.ndarray:
    return np.array(tokenizer.encode(text).ids, np.int32)


@pytest.mark.parametrize("prompt, healed", [
    ("def is_prime(n):\n", True), ("class Foo:\n    ", True), ("def mean(val", True), ("x = 1 ", True),
    ("def fibonacci(n):", False), ("print(", False), ("x = [", False),  # a clean boundary: punctuation
    ("x", False),  # the only token: nothing would be left
])
def test_which_prompts_are_healed(tokenizer, prompt, healed):
    sent, removed = heal(ids(tokenizer, prompt), GenerationParams(), tokenizer.decode)
    assert bool(removed) == healed
    assert tokenizer.decode(sent.tolist()) + removed == prompt


def test_healing_is_off_when_asked_and_for_scoring(tokenizer):
    prompt = ids(tokenizer, "def f(x):\n")
    for params in (GenerationParams(token_healing=False), GenerationParams(logprobs=1, exclude_input=False),
                   GenerationParams(max_tokens=0, logprobs=0, exclude_input=False)):
        assert heal(prompt, params, tokenizer.decode)[1] == ""
    assert heal(prompt, GenerationParams(logprobs=1), tokenizer.decode)[1] == "\n"  # logprobs without echo: healed


def test_a_token_ending_inside_a_character_is_not_healed():
    decode = lambda token_ids: "\ufffd" if token_ids == [2] else "a"  # noqa: E731 - a token with half a character
    assert heal(np.array([1, 2]), GenerationParams(), decode)[1] == ""


def test_the_healed_text_is_cut_across_pieces_before_stop_words(texts, tokenizer):
    params = GenerationParams(heal_prefix="\n    ", stop=("\n",))
    answer = texts.start(params)
    # the first pieces spell only part of the prefix (two ids for "\n" then "    ..."): nothing shows yet
    first, _ = answer.piece(ids(tokenizer, "\n"))
    rest, _ = answer.piece(ids(tokenizer, "    return n\nx"))
    assert (first, rest) == ("", "return n")  # the stop word "\n" inside the prefix did not stop it


def test_logprobs_object_of_pieces_with_echo_and_offsets(texts, tokenizer):
    prompt, generated = ids(tokenizer, "def f(x):"), ids(tokenizer, " return x")
    wire = logprobs_wire.encode([TokenLogprob(int(t), -0.25, ((int(t), -0.25), (7, -2.0))) for t in generated],
                                [None] + [TokenLogprob(int(t), -1.0) for t in prompt[1:]])
    answer = texts.start(GenerationParams(logprobs=1, exclude_input=False), prompt)
    text, found = answer.piece(generated, wire, prefix="def f(x):")
    found = json.loads(found)
    assert text == "def f(x): return x"
    names = [tokenizer.decode([int(t)]) for t in list(prompt) + list(generated)]
    assert found["tokens"] == names
    assert found["token_logprobs"] == [None] + [-1.0] * (len(prompt) - 1) + [-0.25] * len(generated)
    assert found["top_logprobs"][0] is None and found["top_logprobs"][1] == {names[1]: -1.0}
    assert found["top_logprobs"][-1] == {names[-1]: -0.25, token_string(texts.token_bytes[7]): -2.0}
    assert all(text[o:].startswith(t) for o, t in zip(found["text_offset"], found["tokens"]))
    assert texts.start(GenerationParams()).piece(generated) == (" return x", "")  # not asked: no object


def test_a_healed_token_starts_before_the_answer(texts, tokenizer):
    healed = ids(tokenizer, "\n    return")
    wire = logprobs_wire.encode([TokenLogprob(int(t), -0.5) for t in healed])
    text, found = texts.start(GenerationParams(logprobs=0, heal_prefix="\n")).piece(healed, wire)
    found = json.loads(found)
    assert text == "    return" and found["text_offset"][0] == -1 and found["tokens"][0].startswith("\n")


def test_token_strings_of_partial_characters():
    assert token_string("é".encode()[:1]) == "bytes:\\xc3" and token_string(b"ab") == "ab"


def test_preprocess_rows_carry_logprobs_healing_and_score_only(tokenizer):
    model = load_python_model("codegen_preprocess")
    text = np.array([[b"def f(x):\n"], [b"def g(y):\n"]], dtype=np.object_)
    request = fake_pb_utils.InferenceRequest({
        "text_input": text, "request_output_len": np.array([[4], [0]], np.int32),
        "logprobs": np.array([[2], [1]], np.int32), "token_healing": np.array([[True], [True]]),
        "exclude_input_in_output": np.array([[True], [False]])})
    off = fake_pb_utils.InferenceRequest({"text_input": text[:1], "token_healing": np.array([[False]])})
    zero = fake_pb_utils.InferenceRequest({"text_input": text[:1], "request_output_len": np.array([[0]], np.int32)})
    healed, plain, refused = model.execute([request, off, zero])
    params = [GenerationParams.from_json(v) for v in healed.output("generation_params").reshape(-1)]
    lengths = healed.output("input_lengths").reshape(-1).tolist()
    full = len(tokenizer.encode("def f(x):\n").ids)
    assert (params[0].heal_prefix, params[0].logprobs, lengths[0]) == ("\n", 2, full - 1)
    assert (params[1].heal_prefix, params[1].prompt_logprobs, params[1].max_tokens, lengths[1]) == ("", True, 0, full)
    assert params[1].generator_arrays()["prompt_logprobs"].tolist() == [[True]]
    assert "heal_prefix" in params[0].generator_arrays() and "logprobs" not in GenerationParams().generator_arrays()
    assert GenerationParams.from_json(plain.output("generation_params").reshape(-1)[0]).heal_prefix == ""
    assert "max_tokens must be between 1 and 512, got 0" in refused.error().message()
