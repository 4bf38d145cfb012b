"""Issue 55, token-id prompts, through the live gateway and Triton: lm-evaluation-harness's local-completions
scoring with its default tokenized_requests (prompt = a list of token-id lists, echo, logprobs, temperature 0,
max_tokens 0 or 1) equals transformers' log-likelihoods on the same weights, token by token; the ids reach the
generator as they are (a tokenization the tokenizer would never make is scored as sent, and a prompt ending in a
newline is not healed); echo spells the ids out with their own tokens and offsets; an id outside the vocabulary is
a 400 naming its prompt and position."""
from __future__ import annotations

import pytest
import torch

from test_completions_logprobs_server import local, log_softmax  # transformers on the served weights, once

pytestmark = pytest.mark.integration

TOLERANCE = 1e-4
TIMEOUT = 300


@pytest.fixture(scope="module")
def api(gateway):
    gateway.triton.load("codegen_generator", "codegen_preprocess", "codegen_stream")
    return gateway


def post(api, **body):
    return api.http.post("/v1/completions", json={"model": "codegen", **body}, timeout=TIMEOUT)


def scored(api, prompts: list[list[int]], max_tokens: int, logprobs: int = 1) -> list[dict]:
    """lm_eval's LocalCompletionsAPI loglikelihood payload (tokenized_requests=True), its choices by index."""
    r = post(api, prompt=prompts, temperature=0, max_tokens=max_tokens, logprobs=logprobs, seed=1234, echo=True)
    assert r.status_code == 200, r.text
    return sorted(r.json()["choices"], key=lambda c: c["index"])


def split_tokens(tokenizer, text: str) -> list[int]:
    """A tokenization the tokenizer never makes: each word-piece id split in two where it can be."""
    out = []
    for token in tokenizer(text)["input_ids"]:
        piece = tokenizer.decode([token])
        halves = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(part)) for part in (piece[:1], piece[1:])] \
            if len(piece) > 1 else []
        if halves and all(len(h) == 1 for h in halves):
            out += [h[0] for h in halves]
        else:
            out.append(token)
    return out


def test_lm_eval_scoring_with_token_id_prompts_equals_transformers(api):
    _, tokenizer = local()
    pairs = [("def add(a, b):\n    return", " a + b"), ("import", " os"), ("x = [1, 2,", " 3]")]
    contexts = [tokenizer(context)["input_ids"] for context, _ in pairs]
    prompts = [ids + tokenizer(continuation)["input_ids"] for ids, (_, continuation) in zip(contexts, pairs)]
    odd = split_tokens(tokenizer, "for i in range(10):")
    assert tokenizer(tokenizer.decode(odd))["input_ids"] != odd, "a tokenization a round trip would change"
    prompts.append(odd)
    contexts.append(odd[:2])
    for max_tokens in (0, 1):  # older harnesses send 0; newer ones 1, and drop the last entry
        for logprobs in (1, 5):
            choices = scored(api, prompts, max_tokens, logprobs)
            assert len(choices) == len(prompts)
            for ids, context, choice in zip(prompts, contexts, choices):
                lp = choice["logprobs"]
                extra = len(lp["token_logprobs"]) - len(ids)
                # one generated entry, unless the model ended at once (end-of-text has none: finish "stop")
                assert extra == 0 if max_tokens == 0 else extra == 1 or choice["finish_reason"] == "stop"
                assert lp["tokens"][:len(ids)] == [tokenizer.decode([i]) for i in ids], "the ids as sent"
                text = choice["text"]
                assert text.startswith(tokenizer.decode(ids))
                assert all(text[o:].startswith(t) for o, t in zip(lp["text_offset"], lp["tokens"]))
                reference = log_softmax(ids)
                assert lp["token_logprobs"][0] is None
                for i in range(1, len(ids)):
                    assert abs(lp["token_logprobs"][i] - float(reference[i - 1, ids[i]])) < TOLERANCE, (ids, i)
                # what the harness computes: the sum after the context, and whether each token was the greedy one
                ctxlen = len(context)
                want = sum(float(reference[i - 1, ids[i]]) for i in range(ctxlen, len(ids)))
                got = lp["token_logprobs"][ctxlen:len(ids)]
                assert abs(sum(got) - want) < TOLERANCE * len(got)
                greedy = all(v == max(top.values()) for v, top in zip(got, lp["top_logprobs"][ctxlen:len(ids)]))
                assert greedy == all(int(reference[i - 1].argmax()) == ids[i] for i in range(ctxlen, len(ids)))


def test_a_token_id_prompt_is_generated_from_as_sent_without_healing(api):
    _, tokenizer = local()
    ids = tokenizer("def is_prime(n):\n")["input_ids"]  # ends in a newline: a text prompt would be healed
    r = post(api, prompt=ids, max_tokens=8, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(ids)  # healing would have backed one off
    model, _ = local()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=8, do_sample=False)
    generated = [t for t in out[0, len(ids):].tolist()]
    if model.config.eos_token_id in generated:
        generated = generated[:generated.index(model.config.eos_token_id)]
    assert body["choices"][0]["text"] == tokenizer.decode(generated)


def test_an_id_outside_the_vocabulary_is_a_400_naming_its_position(api):
    _, tokenizer = local()
    vocab = len(tokenizer)
    r = post(api, prompt=[[5, 6], [5, 6, vocab]], max_tokens=1)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "prompt"
    assert error["message"].startswith(f"prompt[1]: the token id at position 2 is {vocab}"), error
    alone = post(api, prompt=[vocab], max_tokens=1, stream=True)
    assert alone.status_code == 400 and f"position 0 is {vocab}" in alone.json()["error"]["message"]
    assert post(api, prompt=[5, 6], max_tokens=1).status_code == 200, "the server still serves"
