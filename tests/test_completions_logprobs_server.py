"""Issue 44 items 5 and 6 through the live gateway, on both generator engines (the shipped default, OpenVINO on CPU,
then torch): completions logprobs (unary and streamed) equal transformers' log_softmax on the same weights (1e-4),
with echo and score-only requests; lm-evaluation-harness's local-completions request shapes answered and parsed as
the harness parses them; token healing on by default (every held-out header ending in a newline, and one ending in
spaces, gets a non-empty completion; prompts ending on a clean boundary are unchanged; the answer starts right after
the prompt) and off per request (`token_healing: false`, and the `codegen` ensemble's `token_healing` tensor)."""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer, GPTJForCausalLM

from build.train_codegen import function_headers
from codegen_engines import ENGINES, load_generator_with_engine
from model_configs import MODEL_REPOSITORY

pytestmark = pytest.mark.integration

GENERATOR_DIR = MODEL_REPOSITORY / "codegen_generator" / "1"
TOLERANCE = 1e-4
TIMEOUT = 300
CLEAN = ["def fibonacci(n):", "x = [", "print(", "class Stack:\n    def push(self, item):"]


@pytest.fixture(scope="module", params=ENGINES)
def api(gateway, request):
    gateway.triton.load("codegen_generator", "codegen", "codegen_stream")
    if request.param != ENGINES[0]:
        load_generator_with_engine(gateway.triton.client, request.param)
    yield gateway
    if request.param != ENGINES[0]:
        load_generator_with_engine(gateway.triton.client, "auto")  # as shipped, for the modules after this one


@lru_cache(maxsize=1)
def local():
    torch.set_num_threads(1)
    return (GPTJForCausalLM.from_pretrained(str(GENERATOR_DIR), dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(str(GENERATOR_DIR)))


def log_softmax(ids: list[int]) -> torch.Tensor:
    model, _ = local()
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def complete(api, **body) -> dict:
    r = api.http.post("/v1/completions", json={"model": "codegen", "temperature": 0, **body}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(api, **body) -> list[dict]:
    r = api.http.post("/v1/completions", json={"model": "codegen", "temperature": 0, "stream": True, **body},
                      timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e)["choices"][0] for e in events[:-1]]


def assert_logprobs_match(text: str, logprobs: dict, ids: list[int], top: int, prompt_ids: int = 0) -> None:
    """Every token's logprob and alternatives against transformers over the same ids; offsets point at each
    token in the text."""
    _, tokenizer = local()
    reference = log_softmax(ids)
    assert len(logprobs["tokens"]) == len(ids)
    for i, (token, logprob, alternatives, offset) in enumerate(zip(*(logprobs[k] for k in (
            "tokens", "token_logprobs", "top_logprobs", "text_offset")))):
        assert token == tokenizer.decode([ids[i]]) and text[offset:].startswith(token), (i, token, offset)
        if i == 0 and prompt_ids:
            assert logprob is None and alternatives is None  # nothing predicts the first prompt token
            continue
        row = reference[i - 1]
        assert abs(logprob - float(row[ids[i]])) < TOLERANCE, (i, logprob, float(row[ids[i]]))
        best = torch.topk(row, top)
        want = {tokenizer.decode([t]): float(v) for t, v in zip(best.indices.tolist(), best.values.tolist())}
        assert token in alternatives and len(alternatives) in (top, top + 1)
        for name, value in want.items():
            assert name in alternatives and abs(alternatives[name] - value) < TOLERANCE


def test_unary_and_streamed_logprobs_with_echo_equal_transformers(api):
    _, tokenizer = local()
    prompt = "def fibonacci(n):"
    prompt_ids = tokenizer(prompt)["input_ids"]
    body = complete(api, prompt=prompt, max_tokens=12, logprobs=3, echo=True)
    choice = body["choices"][0]
    ids = prompt_ids + reference_ids(prompt, 12)  # greedy on either engine is transformers' (test_codegen_fidelity)
    assert choice["text"].startswith(prompt)
    assert_logprobs_match(choice["text"], choice["logprobs"], ids, 3, prompt_ids=len(prompt_ids))
    chunks = streamed(api, prompt=prompt, max_tokens=12, logprobs=3, echo=True)
    assert "".join(c["text"] for c in chunks) == choice["text"]
    joined = {k: [v for c in chunks if c["logprobs"] for v in c["logprobs"][k]] for k in choice["logprobs"]}
    assert joined == choice["logprobs"]  # the same object, offsets counted from the choice's start


def test_lm_evaluation_harness_local_completions_shapes(api):
    """As lm_eval's LocalCompletionsAPI scores (tokenized_requests=False): a list of prompts, echo, logprobs,
    temperature 0 and max_tokens 0 (older harness) or 1 (newer, which drops the last token); it sums
    token_logprobs[ctxlen:] and calls a continuation greedy when each of its tokens is top_logprobs' best."""
    _, tokenizer = local()
    pairs = [("def add(a, b):\n    return", " a + b"), ("import", " os"), ("x = [1, 2,", " 3]")]
    texts = [context + continuation for context, continuation in pairs]
    for max_tokens in (0, 1):
        for logprobs in (1, 5):
            body = complete(api, prompt=texts, max_tokens=max_tokens, logprobs=logprobs, echo=True, seed=1234)
            choices = sorted(body["choices"], key=lambda c: c["index"])
            assert len(choices) == len(pairs)
            for (context, _), text, choice in zip(pairs, texts, choices):
                ctxlen = len(tokenizer(context)["input_ids"])
                ids = tokenizer(text)["input_ids"]
                end = len(ids)  # the harness drops the one generated token (none if it was end-of-text)
                assert len(choice["logprobs"]["token_logprobs"]) - end in ((0,) if max_tokens == 0 else (0, 1))
                scored = choice["logprobs"]["token_logprobs"][ctxlen:end]
                reference = log_softmax(ids)
                want = sum(float(reference[i - 1, ids[i]]) for i in range(ctxlen, len(ids)))
                assert abs(sum(scored) - want) < TOLERANCE * len(scored)
                greedy = all(lp == max(top.values()) for lp, top in
                             zip(scored, choice["logprobs"]["top_logprobs"][ctxlen:end]))
                assert greedy == all(int(reference[i - 1].argmax()) == ids[i] for i in range(ctxlen, len(ids)))
                if max_tokens == 0:
                    assert choice["text"] == text and choice["finish_reason"] == "length"


def healed_reference(prompt: str, max_tokens: int) -> str:
    """transformers, greedy, with the prompt's last token backed off and the next ids masked to those that spell
    it out (the healing the pipeline does), the backed-off text cut from the answer."""
    model, tokenizer = local()
    ids = tokenizer(prompt)["input_ids"]
    removed = tokenizer.decode(ids[-1:])
    ids, left, out = ids[:-1], removed, []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            if left:
                allowed = [i for i in range(logits.shape[0]) if (s := tokenizer.decode([i])) and
                           (s.startswith(left) or left.startswith(s)) and i != model.config.eos_token_id]
                token = allowed[int(logits[allowed].argmax())]
                spelled = tokenizer.decode([token])
                left = left[len(spelled):] if left.startswith(spelled) else ""
            else:
                token = int(logits.argmax())
            if token == model.config.eos_token_id:
                break
            out.append(token)
    return tokenizer.decode(out)[len(removed):]


def test_token_healing_completes_after_a_newline_and_spaces(api):
    headers = [h + "\n" for h in function_headers(16)] + ["class Foo:\n    "]
    body = complete(api, prompt=headers, max_tokens=16)
    texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
    empty = [h for h, t in zip(headers, texts) if not t.strip()]
    assert not empty, f"{len(empty)}/{len(headers)} prompts got nothing: {empty}"
    for header, text in list(zip(headers, texts))[:3] + [(headers[-1], texts[-1])]:
        assert text == healed_reference(header, 16), header  # starts right after the prompt: "\n" not repeated
    # off per request: the plain greedy continuation of the prompt as given
    plain = complete(api, prompt=headers[0], max_tokens=16, token_healing=False)["choices"][0]["text"]
    assert plain == unhealed_reference(headers[0], 16)


def reference_ids(prompt: str, max_tokens: int) -> list[int]:
    """transformers' greedy continuation (its end-of-text dropped)."""
    model, tokenizer = local()
    encoded = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**encoded, max_new_tokens=max_tokens, do_sample=False)
    ids = out[0, encoded["input_ids"].shape[1]:].tolist()
    return ids[:-1] if ids and ids[-1] == model.config.eos_token_id else ids


def unhealed_reference(prompt: str, max_tokens: int) -> str:
    return local()[1].decode(reference_ids(prompt, max_tokens), skip_special_tokens=True)


def test_clean_boundary_prompts_are_unchanged_and_the_ensemble_takes_the_switch(api):
    on = [c["text"] for c in sorted(complete(api, prompt=CLEAN, max_tokens=16)["choices"], key=lambda c: c["index"])]
    assert on == [unhealed_reference(p, 16) for p in CLEAN]

    def ensemble(prompt: str, healing: bool | None) -> str:
        arrays = {"text_input": np.array([[prompt.encode()]], dtype=np.object_),
                  "max_tokens": np.array([[16]], dtype=np.int32)}
        if healing is not None:
            arrays["token_healing"] = np.array([[healing]], dtype=bool)
        tensors = []
        for name, array in arrays.items():
            kind = {np.object_: "BYTES", np.int32: "INT32", np.bool_: "BOOL"}[array.dtype.type]
            tensors.append(grpcclient.InferInput(name, list(array.shape), kind))
            tensors[-1].set_data_from_numpy(array)
        result = grpcclient.InferenceServerClient(api.triton.grpc_url).infer("codegen", tensors,
                                                                              client_timeout=TIMEOUT)
        return result.as_numpy("text_output").reshape(-1)[0].decode()

    prompt = "def is_prime(n):\n"
    assert ensemble(prompt, None) == healed_reference(prompt, 16)
    assert ensemble(prompt, False) == unhealed_reference(prompt, 16)
