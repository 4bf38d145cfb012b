"""Issue 55, token-id prompts, without a server: /v1/completions takes `prompt` as the model's own token ids (an
array of ints, or an array of such arrays, as OpenAI's API defines them); the gateway sends them to
`codegen_stream` as `input_ids` (never as text), refusing what cannot be an id by position; codegen_preprocess
passes them through untokenized and unhealed, naming an id outside the vocabulary by position; codegen_stream's
echo spells them out, with their own tokens and offsets. Embeddings keep refusing ids
(tests/test_embeddings_contract.py)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

import fake_pb_utils as pb
from codegen_common.generation_params import GenerationParams
from gateway import errors
from gateway.completions import sequences as runner
from gateway.completions.checks import resolve
from gateway.completions.tensors import sequences
from gateway.schemas.completions import CompletionRequest
from gateway.settings import Settings
from gateway.triton.engine import StreamResponse
from model_configs import MODEL_REPOSITORY, load_python_model

WAIT = 60
TOKENIZER = MODEL_REPOSITORY / "codegen_preprocess" / "1" / "tokenizer.json"


def _resolve(**body):
    return resolve(CompletionRequest(model="codegen", **body), Settings())


def test_token_id_prompts_go_to_the_model_as_input_ids_not_text():
    one = sequences(_resolve(prompt=[5, 6, 7], max_tokens=2))
    assert len(one) == 1 and "text_input" not in one[0].inputs
    assert one[0].inputs["input_ids"].dtype == np.int32 and one[0].inputs["input_ids"].tolist() == [[5, 6, 7]]
    several = sequences(_resolve(prompt=[[1, 2], [3]], n=2, seed=10, max_tokens=2))
    assert [s.inputs["input_ids"].tolist() for s in several] == [[[1, 2]], [[1, 2]], [[3]], [[3]]]
    assert [s.where for s in several] == ["prompt[0]"] * 2 + ["prompt[1]"] * 2
    assert [int(s.inputs["random_seed"][0, 0]) for s in several] == [10, 11, 10, 11]


@pytest.mark.parametrize("prompt, where", [
    ([1, -1], "prompt[1] is -1"),
    ([1, 2**31], f"prompt[1] is {2**31}"),
    ([[1], [2, "x"]], "prompt[1][1] is 'x'"),
    ([[1], [2, 3.5]], "prompt[1][1] is 3.5"),
    ([[1], [2, True]], "prompt[1][1] is True"),
    ([[1], []], "prompt[1] is empty"),
    ([[1], 2], "prompt[1] must be a list of token ids"),
])
def test_what_cannot_be_a_token_id_is_a_400_naming_its_position(prompt, where):
    with pytest.raises(errors.BadRequest) as refused:
        _resolve(prompt=prompt)
    assert where in refused.value.message and refused.value.param == "prompt"


class RefusingEngine:
    """codegen_stream refusing the ids of prompt 1 as codegen_preprocess does (an INVALID_ARGUMENT message)."""

    async def stream_infer(self, model, inputs, timeout_s=None):
        if inputs["input_ids"].tolist() == [[9999]]:
            raise errors.BadRequest("the token id at position 0 is 9999: not in this model's vocabulary "
                                    "(ids 0 to 4095)", code="invalid_input")
        yield StreamResponse({"text_output": np.array([[b"x"]], np.object_),
                              "finish_reason": np.array([[b"length"]], np.object_)}, True)


def test_the_models_refusal_names_the_prompt_it_is_about():
    with pytest.raises(errors.BadRequest) as refused:
        asyncio.run(runner.collect(RefusingEngine(), sequences(_resolve(prompt=[[1, 2], [9999]], max_tokens=1))))
    assert refused.value.message.startswith("prompt[1]: the token id at position 0 is 9999")
    with pytest.raises(errors.BadRequest) as alone:  # one prompt: the message as the model gave it
        asyncio.run(runner.collect(RefusingEngine(), sequences(_resolve(prompt=[9999], max_tokens=1))))
    assert alone.value.message.startswith("the token id at position 0")


@pytest.fixture(scope="module")
def preprocess():
    return load_python_model("codegen_preprocess")


def _ids(rows) -> np.ndarray:
    return np.array(rows, np.int32)


def test_preprocess_passes_ids_through_unhealed_and_names_an_id_outside_the_vocabulary(preprocess):
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    newline = tokenizer.encode("def f(x):\n").ids  # ends in whitespace: a text prompt's last id would be healed
    width = len(newline) + 2
    padded = _ids([newline + [-1, -1], [5, 6] + [-1] * (width - 2)])  # rows of two lengths, right-padded with -1
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    responses = preprocess.execute([
        pb.InferenceRequest({"input_ids": padded, "request_output_len": _ids([[4], [4]])}),
        pb.InferenceRequest({"input_ids": _ids([[5, vocab, 7]])}),
        pb.InferenceRequest({"input_ids": _ids([[-1, -1]])}),
        pb.InferenceRequest({"input_ids": _ids([[5]]), "text_input": np.array([[b"x"]], np.object_)}),
        pb.InferenceRequest({"input_ids": _ids([[5, 6]]), "request_output_len": _ids([[0]]),
                             "logprobs": _ids([[1]]), "exclude_input_in_output": np.array([[False]])})])
    ok = responses[0]
    assert not ok.has_error(), ok.error().message()
    lengths = ok.output("input_lengths").reshape(-1).tolist()
    assert lengths == [len(newline), 2]
    ids = ok.output("input_ids")
    assert ids[0, :lengths[0]].tolist() == newline and ids[1, :2].tolist() == [5, 6]
    params = [GenerationParams.from_json(v) for v in ok.output("generation_params").reshape(-1)]
    assert all(not p.token_healing and p.heal_prefix == "" for p in params)
    out_of_range = responses[1].error()
    assert out_of_range.code() == pb.TritonError.INVALID_ARG
    assert f"position 1 is {vocab}" in out_of_range.message() and f"0 to {vocab - 1}" in out_of_range.message()
    assert "empty" in responses[2].error().message()
    assert "not both" in responses[3].error().message()
    assert not responses[4].has_error()  # score only: max_tokens 0 with the prompt's logprobs


def _answer(ids, logprobs: dict | None = None):
    tensors = [pb.Tensor("output_ids", np.array([ids], np.int32)),
               pb.Tensor("finish_reason", np.array([[b"length"]], np.object_)),
               pb.Tensor("completion_tokens", np.array([[len(ids)]], np.int32))]
    if logprobs is not None:
        tensors.append(pb.Tensor("logprobs", np.array([[json.dumps(logprobs).encode()]], np.object_)))
    return pb.InferenceResponse(tensors)


def test_codegen_stream_echoes_a_token_id_prompt_with_its_own_tokens_and_offsets(monkeypatch):
    """The ids reach the preprocessing as input_ids (no text_input), and echo spells them out: the prompt's
    tokens are its ids' own, each offset where its token starts in the echoed text."""
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    prompt_ids = tokenizer.encode("def add(a, b):").ids
    calls = []

    def bls(request, decoupled):
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        calls.append((request.model_name, set(inputs), request.passed_trace))
        if "probe" in inputs:
            return iter([])
        if request.model_name.endswith("preprocess"):
            params = GenerationParams(max_tokens=0, exclude_input=False, logprobs=1, token_healing=False)
            return pb.InferenceResponse([pb.Tensor("input_ids", inputs["input_ids"]),
                                         pb.Tensor("input_lengths", np.array([[len(prompt_ids)]], np.int32)),
                                         pb.Tensor("generation_params", np.array([[params.to_json().encode()]],
                                                                                 np.object_))])
        wire = {"prompt": [None] + [[-0.5, [[5, -0.25]]]] * (len(prompt_ids) - 1), "ids": []}
        return iter([_answer([], wire)])

    monkeypatch.setattr(pb, "bls_handler", bls)
    model = load_python_model("codegen_stream")
    try:
        request = pb.InferenceRequest({"input_ids": np.array([prompt_ids], np.int32),
                                       "max_tokens": _ids([[0]]), "logprobs": _ids([[1]]),
                                       "exclude_input_in_output": np.array([[False]])})
        model.execute([request])
        assert request.sender.answered.wait(WAIT)
    finally:
        model.finalize()
    ((preprocess_name, preprocess_inputs, _), *_) = calls
    assert preprocess_name == "codegen_preprocess" and "input_ids" in preprocess_inputs
    assert "text_input" not in preprocess_inputs
    ((response, _),) = [(r, f) for r, f in request.sender.sent if r is not None]
    assert not response.has_error(), response.error().message()
    text = response.output("text_output").reshape(-1)[0].decode()
    assert text == "def add(a, b):"
    logprobs = json.loads(response.output("logprobs").reshape(-1)[0])
    assert logprobs["tokens"] == [tokenizer.decode([i]) for i in prompt_ids]
    assert all(text[offset:].startswith(token) for offset, token in zip(logprobs["text_offset"], logprobs["tokens"]))
    assert logprobs["token_logprobs"][0] is None and logprobs["token_logprobs"][1:] == [-0.5] * (len(prompt_ids) - 1)
