"""/v1/completions without a server: the route over a fake `codegen_stream` engine that follows the
tensor contract (text_output pieces, finish_reason on the last response, token counts)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from codegen_common.limits import DEFAULT_MAX_TOKENS
from gateway import errors
from gateway.app import create_app
from gateway.completions import sequences as runner
from gateway.completions.checks import resolve
from gateway.completions.tensors import Sequence, sequence_inputs, sequences
from gateway.keys import key_line
from gateway.schemas.completions import CompletionRequest
from gateway.settings import Settings
from gateway.triton.engine import StreamResponse, stream_error


def _value(inputs, name):
    return inputs[name].reshape(-1)[0]


class FakeEngine:
    """Generates "<seed>:<i> " pieces, one per token; a prompt's length in words is its token count.
    A stop word ends the sequence after two pieces; prompt "too long" fails like the preprocessing;
    prompt "fail later" fails after its first piece. exclude_input_in_output false prepends the prompt to the
    first piece; logprobs gives each piece's logprobs object (offsets from the piece's start; the prompt is one
    token with a null logprob), as codegen_stream does."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.calls, self.active, self.cancelled = delay, [], 0, 0

    async def stream_infer(self, model, inputs, timeout_s=None):
        self.calls.append((model, inputs))
        prompt = _value(inputs, "text_input")
        prompt = prompt.decode() if isinstance(prompt, bytes) else prompt
        if prompt == "too long":
            raise errors.BadRequest("the prompt has 2000 tokens, but ... context window of 1024 tokens")
        max_tokens, seed = int(_value(inputs, "max_tokens")), int(_value(inputs, "random_seed"))
        stops = "stop_words" in inputs
        echo = "exclude_input_in_output" in inputs and not _value(inputs, "exclude_input_in_output")
        logprobs = "logprobs" in inputs
        prompt_tokens = len(prompt.split())
        if max_tokens == 0:  # score only
            yield StreamResponse(self._piece(prompt, "", "length", prompt_tokens, 0, logprobs), True)
            return
        self.active += 1
        finished = False
        try:
            for i in range(max_tokens):
                await asyncio.sleep(self.delay)
                if prompt == "fail later" and i == 1:
                    raise errors.internal(RuntimeError("boom"), "fake")
                last = i == max_tokens - 1 or (stops and i == 1)
                reason = ("stop" if stops else "length") if last else ""
                yield StreamResponse(self._piece(prompt if echo and i == 0 else "", f"{seed}:{i} ", reason,
                                                 prompt_tokens, i + 1, logprobs), last)
                if last:
                    finished = True
                    return
        finally:
            self.active -= 1
            self.cancelled += not finished


    @staticmethod
    def _piece(echoed: str, text: str, reason: str, prompt_tokens: int, completion_tokens: int, logprobs: bool):
        out = {"text_output": np.array([[(echoed + text).encode()]], dtype=object),
               "finish_reason": np.array([[reason.encode()]], dtype=object),
               "prompt_tokens": np.array([[prompt_tokens]], dtype=np.int32),
               "completion_tokens": np.array([[completion_tokens]], dtype=np.int32)}
        if logprobs:
            tokens = ([echoed] if echoed else []) + ([text] if text else [])
            out["logprobs"] = np.array([[json.dumps({
                "tokens": tokens, "token_logprobs": [None if t == echoed else -0.5 for t in tokens],
                "top_logprobs": [None if t == echoed else {t: -0.5} for t in tokens],
                "text_offset": [0 if t == echoed else len(echoed) for t in tokens]}).encode()]], dtype=object)
        return out


@pytest.fixture()
def api():
    app = create_app(Settings(completions_max_n=4, completions_max_sequences=8, completions_max_tokens=64))
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host: the gateway has no keys
        # no Triton here: the server watch (which would find none and refuse every request) is stopped
        client.portal.call(app.state.server_watch.close)
        app.state.admission.server_problem = None
        app.state.engine = FakeEngine()
        client.engine = app.state.engine
        yield client


def post(api, **body):
    return api.post("/v1/completions", json={"model": "codegen", **body})


def sse_events(response) -> list:
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in response.text.split("\n\n") if line]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def test_unary_shape_and_usage(api):
    r = post(api, prompt="def f(x):  return", max_tokens=3, temperature=0, seed=7)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "codegen" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": "7:0 7:1 7:2 ", "finish_reason": "length", "logprobs": None}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    model, inputs = api.engine.calls[0]
    assert model == "codegen_stream"
    assert {k: v.dtype for k, v in inputs.items()} == {
        "text_input": np.object_, "max_tokens": np.int32, "temperature": np.float32, "top_k": np.int32,
        "top_p": np.float32, "random_seed": np.uint64}
    assert all(v.shape == (1, 1) for v in inputs.values())


def test_stop_echo_and_defaults(api):
    r = post(api, prompt="a b", stop=["\n", "#"], echo=True)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"].startswith("a b") and choice["text"].count(":") == 2
    inputs = api.engine.calls[0][1]
    assert inputs["stop_words"].tolist() == [["\n", "#"]]
    assert _value(inputs, "max_tokens") == 16 and _value(inputs, "temperature") == 1.0  # OpenAI's defaults


def test_prompt_list_and_n_are_indexed_and_seeded(api):
    r = post(api, prompt=["one", "two words"], n=3, seed=100, max_tokens=1)
    body = r.json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    # choice j of every prompt is seeded seed + j: the same as sending each prompt alone
    assert [c["text"] for c in body["choices"]] == ["100:0 ", "101:0 ", "102:0 "] * 2
    assert body["usage"] == {"prompt_tokens": 1 + 2, "completion_tokens": 6, "total_tokens": 9}
    assert [_value(i, "text_input") for _, i in api.engine.calls] == ["one"] * 3 + ["two words"] * 3


def resolved(**body):
    return resolve(CompletionRequest(model="codegen", **body), Settings())


def test_unseeded_sequences_differ():
    seeds = [int(_value(s.inputs, "random_seed")) for s in sequences(resolved(prompt="x", n=3))]
    assert len(set(seeds)) == 3


def test_a_request_is_resolved_once_with_its_defaults():
    """Left out and null read alike, as the schema's defaults (max_tokens: the generator's own)."""
    for given in ({}, {"max_tokens": None, "n": None, "temperature": None, "top_p": None, "stream": None}):
        c = resolved(prompt="x", **given)
        assert (c.max_tokens, c.n, c.temperature, c.top_p, c.stream) == (DEFAULT_MAX_TOKENS, 1, 1.0, 1.0, False)
        assert [s.max_tokens for s in sequences(c)] == [_value(s.inputs, "max_tokens") for s in sequences(c)] == [16]
    c = resolved(prompt="x", stop=["", "#"], stream=True, stream_options={"include_usage": True})
    assert c.stop == ("#",) and c.include_usage
    assert not resolved(prompt="x", stream=False).include_usage


def test_budget_is_max_tokens_x_n_x_prompts():
    assert resolved(prompt=["a", "b"], max_tokens=10, n=3).budget == 60
    assert resolved(prompt="a").budget == 16  # OpenAI's default max_tokens
    assert resolved(prompt="a", max_tokens=None, n=2).budget == 32  # null is the default, as generated
    assert resolved(prompt=["a", "b"], max_tokens=0, echo=True, logprobs=0).budget == 2  # score only: 1 a sequence


class FinalOnlyEngine:
    """Two pieces without a reason, then a bare FINAL flag: the reason comes from the sequence's max_tokens."""

    async def stream_infer(self, model, inputs, timeout_s=None):
        for i in range(2):
            yield StreamResponse({"text_output": np.array([[b"t "]], dtype=object),
                                  "completion_tokens": np.array([[i + 1]], dtype=np.int32)}, False)
        yield StreamResponse({}, True)


@pytest.mark.parametrize("max_tokens, reason", [(2, "length"), (5, "stop")])
def test_a_bare_final_flag_takes_its_reason_from_max_tokens(max_tokens, reason):
    seq = Sequence(0, 0, "p", max_tokens, sequence_inputs("p", max_tokens, 1.0, 1.0, 0, []))
    choices = asyncio.run(runner.collect(FinalOnlyEngine(), [seq]))
    assert [(c.text, c.finish_reason) for c in choices] == [("t t ", reason)]


def test_stream_chunks_usage_and_done(api):
    r = post(api, prompt=["p", "q"], max_tokens=2, seed=1, stream=True, stream_options={"include_usage": True})
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    chunks = events[:-2]
    assert {c["id"] for c in chunks} == {usage["id"]} and all(c["object"] == "text_completion" for c in chunks)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == "1:0 1:1 "
        assert [c["finish_reason"] for c in mine] == [None, "length"]


def test_stream_without_usage_and_with_echo(api):
    events = sse_events(post(api, prompt="hello", max_tokens=2, seed=0, stream=True, echo=True))
    assert events[-1] == "[DONE]" and all(e == "[DONE]" or e["choices"] for e in events)
    assert events[0]["choices"][0]["text"] == "hello0:0 "


def test_error_before_the_first_piece_is_a_plain_400(api):
    for stream in (False, True):
        r = post(api, prompt="too long", stream=stream)
        assert r.status_code == 400, r.text
        assert "context window of 1024" in r.json()["error"]["message"]


def test_error_after_the_stream_started_is_an_event(api):
    events = sse_events(post(api, prompt="fail later", max_tokens=5, stream=True))
    assert events[0]["choices"][0]["text"].endswith(":0 ") and events[0]["choices"][0]["finish_reason"] is None
    assert "internal error" in events[-1]["error"]["message"] and "boom" not in json.dumps(events[-1])
    assert "[DONE]" not in events


def test_unary_error_cancels_the_other_sequences(api):
    api.app.state.engine = engine = FakeEngine(delay=0.01)
    r = post(api, prompt=["fine", "fail later"], max_tokens=50)
    assert r.status_code == 500 and "boom" not in r.text
    assert engine.active == 0 and engine.cancelled == 2


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": ["ok", ""]}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"), ({"prompt": "x", "max_tokens": 65}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"), ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"), ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "n": 0}, "n"), ({"prompt": "x", "n": 5}, "n"), ({"prompt": ["x"] * 3, "n": 3}, "prompt"),
    ({"prompt": "x", "seed": -1}, "seed"), ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"), ({"prompt": "x", "max_tokens": 0, "logprobs": 1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0, "echo": True}, "max_tokens"),
    ({"prompt": "x", "best_of": 2}, "best_of"), ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"), ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": 1}, "frequency_penalty"), ({"prompt": "x", "stream_options": {}}, "stream_options"),
    ({"prompt": 5}, "prompt"), ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": [9906, -1]}, "prompt"), ({"prompt": [[9906], [1917, "x"]]}, "prompt"),  # not token ids
])
def test_bad_input_is_a_400_naming_the_parameter(api, body, param):
    r = post(api, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"].startswith(param), error
    assert param.split(".")[0] in error["message"] or body == {}
    assert api.engine.calls == []  # refused before any work


def test_noop_values_of_unsupported_parameters_are_accepted(api):
    r = post(api, prompt="x", best_of=1, presence_penalty=0, frequency_penalty=0.0, logit_bias={}, user="u", max_tokens=1)
    assert r.status_code == 200, r.text
    # what clients send as their defaults (issue 44): an empty suffix, zero biases, best_of = n
    r = post(api, prompt="x", suffix="", logit_bias={"50256": 0}, best_of=2, n=2, max_tokens=1)
    assert r.status_code == 200, r.text
    assert [c["logprobs"] for c in r.json()["choices"]] == [None, None]
    # logprobs 0 is OpenAI's "the chosen tokens' logprobs, no alternatives": an object, not an error
    r = post(api, prompt="x", logprobs=0, max_tokens=1, seed=1)
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"]["tokens"] == ["1:0 "]


def test_logprobs_unary_join_the_pieces_offsets(api):
    r = post(api, prompt="a b", max_tokens=3, seed=4, logprobs=2, echo=True)
    choice = r.json()["choices"][0]
    assert choice["text"] == "a b4:0 4:1 4:2 "
    lp = choice["logprobs"]
    assert lp["tokens"] == ["a b", "4:0 ", "4:1 ", "4:2 "]
    assert lp["token_logprobs"] == [None, -0.5, -0.5, -0.5] and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [0, 3, 7, 11]  # each token's start in the choice's text
    assert all(choice["text"][o:].startswith(t) for o, t in zip(lp["text_offset"], lp["tokens"]))
    inputs = api.engine.calls[0][1]
    assert _value(inputs, "logprobs") == 2 and not _value(inputs, "exclude_input_in_output")


def test_logprobs_streamed_offsets_count_from_the_choice_start(api):
    events = sse_events(post(api, prompt="p", max_tokens=3, seed=2, logprobs=1, stream=True))
    chunks = [e["choices"][0] for e in events if e != "[DONE]"]
    text = "".join(c["text"] for c in chunks)
    offsets = [o for c in chunks for o in c["logprobs"]["text_offset"]]
    tokens = [t for c in chunks for t in c["logprobs"]["tokens"]]
    assert text == "2:0 2:1 2:2 " and offsets == [0, 4, 8] and tokens == ["2:0 ", "2:1 ", "2:2 "]


def test_score_only_and_token_healing_field(api):
    r = post(api, prompt=["one two", "three"], max_tokens=0, echo=True, logprobs=1, temperature=0)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["text"] for c in choices] == ["one two", "three"]
    assert [c["logprobs"]["token_logprobs"] for c in choices] == [[None], [None]]
    assert [c["finish_reason"] for c in choices] == ["length", "length"]
    r = post(api, prompt="x", max_tokens=1, token_healing=False)
    assert r.status_code == 200 and _value(api.engine.calls[-1][1], "token_healing") == np.False_
    assert "token_healing" not in api.engine.calls[0][1]  # sent only when the request says


def test_unknown_model_is_404_and_codegen_is_listed(api):
    r = api.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert r.status_code == 404 and "gpt-4" in r.json()["error"]["message"]
    assert "codegen" in [m["id"] for m in api.get("/v1/models").json()["data"]]


def test_closing_the_stream_early_cancels_every_sequence():
    engine = FakeEngine(delay=0.01)
    seqs = sequences(resolved(prompt=["a", "b", "c"], max_tokens=100))

    async def main():
        pieces = runner.stream(engine, seqs)
        first = await pieces.__anext__()
        assert engine.active == 3 and first.finish_reason is None
        await pieces.aclose()

    asyncio.run(main())
    assert engine.active == 0 and engine.cancelled == 3


@pytest.mark.parametrize("message, kind", [
    ("the prompt has 2000 tokens, but with max_tokens=16 the context window of 1024 tokens leaves room for at most 1008",
     errors.BadRequest),
    ("internal error (id 0123456789ab, see the server log)", errors.Internal),
    ("Stub process 'codegen_stream_0' is not healthy.", errors.Unavailable),  # restarted by the supervisor
    ("codegen is over capacity: 64 requests in flight, retry later", errors.Unavailable),
    # the fronts' UNAVAILABLE refusals, which a gRPC stream carries without their status (issue 48)
    ("codegen_generator lost the request (its process was restarted): retry", errors.Unavailable),
    ("codegen_generator gave no answer in 10 s (it did not take the request): retry", errors.Unavailable),
    ("the generator's process died; it is being restarted: retry", errors.Unavailable),
    ("the generator has 64 requests waiting for a row, its limit (max_pending_requests=64): retry later",
     errors.Unavailable),
    ("Request for unknown model: 'codegen_stream' is not found", errors.NotFound),
])
def test_stream_errors_are_classified_by_message(message, kind):
    error = stream_error(message, "codegen_stream")
    assert type(error) is kind
    if kind is errors.BadRequest:
        assert error.message == message


def test_a_stages_retry_refusal_reads_once_in_the_gateways_words():
    error = stream_error("codegen_generator lost the request (its process was restarted): retry", "codegen_stream")
    assert error.message == ("model 'codegen_stream' could not answer now (codegen_generator lost the request "
                             "(its process was restarted)); retry later")


class BurstEngine:
    """Every response of a sequence at once (no pause between them): they queue up before the
    gateway's consumer runs, as when the gateway falls behind the generator."""

    async def stream_infer(self, model, inputs, timeout_s=None):
        max_tokens = int(_value(inputs, "max_tokens"))
        for i in range(max_tokens):
            last = i == max_tokens - 1
            yield StreamResponse({"text_output": np.array([[f"t{i} ".encode()]], dtype=object),
                                  "finish_reason": np.array([[b"length" if last else b""]], dtype=object),
                                  "prompt_tokens": np.array([[3]], dtype=np.int32),
                                  "completion_tokens": np.array([[i + 1]], dtype=np.int32)}, last)


def test_pieces_that_queue_up_together_are_joined_per_sequence():
    seqs = sequences(resolved(prompt=["a", "b"], max_tokens=5))

    async def main():
        return [piece async for piece in runner.stream(BurstEngine(), seqs)]

    pieces = asyncio.run(main())
    assert len(pieces) < 2 * 5, "every generated piece became its own event"
    for index in (0, 1):
        mine = [p for p in pieces if p.index == index]
        assert "".join(p.text for p in mine) == "t0 t1 t2 t3 t4 "
        assert [p.finish_reason for p in mine][-1] == "length" and all(p.finish_reason is None for p in mine[:-1])
        assert mine[-1].completion_tokens == 5 and mine[-1].prompt_tokens == 3


TOKENS = "gk-test-tokens-0123456789"


@pytest.fixture()
def keyed_api(tmp_path):
    """The route with a key of 100 tokens per minute."""
    keys = tmp_path / "keys"
    keys.write_text(key_line(TOKENS, "tokens-1", "inference", tpm=100))
    app = create_app(Settings(api_keys_file=keys, completions_max_n=8, completions_max_sequences=8,
                              completions_max_tokens=64))
    with TestClient(app, base_url="http://127.0.0.1", headers={"Authorization": f"Bearer {TOKENS}"}) as client:
        client.portal.call(app.state.server_watch.close)
        app.state.admission.server_problem = None
        app.state.engine = client.engine = FakeEngine()
        yield client


def test_the_token_quota_charges_what_the_route_generates(keyed_api):
    # max_tokens null is the default, 16 tokens a choice: 7 x 16 = 112 is over 100 before anything runs
    r = post(keyed_api, prompt="x", max_tokens=None, n=7)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "rate_limit_exceeded" and "may use 112" in r.json()["error"]["message"]
    assert r.headers["x-ratelimit-limit-tokens"] == "100" and int(r.headers["retry-after"]) >= 1
    assert keyed_api.engine.calls == []
    # 60, then 60 more is over 100 (a number sent as a string is a 400: tests/test_abuse3_quotas.py)
    assert post(keyed_api, prompt="x", max_tokens=60).status_code == 200
    assert post(keyed_api, prompt="x", max_tokens=60).status_code == 429


def test_a_refused_request_spends_no_tokens(keyed_api):
    for _ in range(3):  # 65 is over COMPLETIONS_MAX_TOKENS: 400, as without a quota
        r = post(keyed_api, prompt="x", max_tokens=65)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    assert post(keyed_api, prompt="x", max_tokens=50, n=2).status_code == 200  # the whole 100 is left
