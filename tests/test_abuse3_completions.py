"""Issue 56, items 3, 5 and 7, without a server: POST /v1/completions over test_completions_unit's fake
`codegen_stream` engine (a prompt's length in words is its token count). The token quota reads the validated
request (max_tokens and n are integers or a 400), an echo pays for the prompt tokens it sends back (a
score-only request for all it sends), stop strings are bounded before anything copies them, and a unary
answer is joined in linear time and encoded off the event loop."""
from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.completions import shapes
from gateway.keys import key_line
from gateway.schemas.completions import MAX_STOP, MAX_STOP_CHARS
from gateway.settings import Settings
from test_completions_unit import FakeEngine

KEY = "gk-abuse3-tokens-0123456789"


def _client(app, headers=None):
    client = TestClient(app, base_url="http://127.0.0.1", headers=headers or {})
    client.__enter__()
    client.portal.call(app.state.server_watch.close)  # no Triton here
    app.state.admission.server_problem = None
    app.state.engine = client.engine = FakeEngine()
    return client


@pytest.fixture()
def keyed(tmp_path):
    """A key of 100 tokens per minute."""
    keys = tmp_path / "keys"
    keys.write_text(key_line(KEY, "abuse3", "inference", tpm=100))
    app = create_app(Settings(api_keys_file=keys, completions_max_n=8, completions_max_sequences=8,
                              completions_max_tokens=64))
    client = _client(app, {"Authorization": f"Bearer {KEY}"})
    yield client
    client.__exit__(None, None, None)


@pytest.fixture()
def open_api():
    client = _client(create_app(Settings(completions_max_n=4, completions_max_sequences=8,
                                         completions_max_tokens=64)))
    yield client
    client.__exit__(None, None, None)


def post(client, **body):
    return client.post("/v1/completions", json={"model": "codegen", **body})


# ---- item 3: max_tokens and n are integers, or a 400 -----------------------------------------------

@pytest.mark.parametrize("field, value", [("max_tokens", "60"), ("max_tokens", 60.0), ("max_tokens", True),
                                          ("n", "2"), ("n", 2.0), ("n", True)])
def test_a_charged_number_in_another_form_is_a_400_before_any_charge(keyed, field, value):
    r = post(keyed, prompt="x", **{field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field, error
    assert keyed.engine.calls == []
    # nothing was charged: the whole 100 tokens are still there
    assert post(keyed, prompt="x", max_tokens=50, n=2).status_code == 200


def test_a_null_max_tokens_is_the_default_and_charged_as_such(keyed):
    # null is the default, 16 a choice: 6 x 16 = 96 fits in 100 once, not twice
    assert post(keyed, prompt="x", max_tokens=None, n=6).status_code == 200
    assert all(int(inputs["max_tokens"].reshape(-1)[0]) == 16 for _m, inputs in keyed.engine.calls)
    r = post(keyed, prompt="x", max_tokens=None, n=None)  # n null: 1 choice of 16 tokens
    assert r.status_code == 429 and "may use 16" in r.json()["error"]["message"], r.text


# ---- item 3: an echo pays for the prompt tokens it sends back ----------------------------------------

def test_a_score_only_request_is_charged_for_its_prompt_tokens(keyed):
    prompt = " ".join(["tok"] * 30)  # 30 tokens: four of them echo 120, over the key's 100
    r = post(keyed, prompt=[prompt] * 4, max_tokens=0, echo=True, logprobs=1)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "rate_limit_exceeded" and "echoes 120" in r.json()["error"]["message"]
    # the refusal took what was left of the window: the next request is refused before it runs
    calls = len(keyed.engine.calls)
    assert post(keyed, prompt="x", max_tokens=1).status_code == 429
    assert len(keyed.engine.calls) == calls


def test_echo_costs_the_prompt_for_every_choice(keyed):
    prompt = " ".join(["tok"] * 20)  # echoed by each of 2 choices: 40, and 2 x 1 generated: 42 a request
    for _ in range(2):
        r = post(keyed, prompt=prompt, max_tokens=1, n=2, echo=True)
        assert r.status_code == 200, r.text
    assert post(keyed, prompt=prompt, max_tokens=1, n=2, echo=True).status_code == 429  # 126 > 100
    assert post(keyed, prompt=prompt, max_tokens=1, n=2).status_code == 429  # the window is spent


def test_a_streamed_echo_over_the_quota_is_a_429_before_the_stream(keyed):
    prompt = " ".join(["tok"] * 60)
    r = post(keyed, prompt=[prompt, prompt], max_tokens=1, echo=True, stream=True)
    assert r.status_code == 429 and r.headers["content-type"].startswith("application/json"), r.text


# ---- item 5: stop strings are bounded by the schema ------------------------------------------------

@pytest.mark.parametrize("stop, message", [
    (["s"] * (MAX_STOP + 1), f"at most {MAX_STOP} strings"),
    ("x" * (MAX_STOP_CHARS + 1), f"over the limit of {MAX_STOP_CHARS}"),
    (["ok", "y" * (MAX_STOP_CHARS + 1)], "stop[1]"),
    (["s"] * 100_000, f"at most {MAX_STOP} strings"),
])
def test_stop_strings_over_openais_bounds_are_a_400_before_any_work(open_api, stop, message):
    r = post(open_api, prompt="x", max_tokens=1, stop=stop)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stop" and message in error["message"], error
    assert open_api.engine.calls == []


def test_stop_strings_within_the_bounds_reach_every_sequence(open_api):
    stop = ["z" * MAX_STOP_CHARS] * MAX_STOP
    assert post(open_api, prompt="x", max_tokens=2, n=2, stop=stop).status_code == 200
    assert [list(inputs["stop_words"].reshape(-1)) for _m, inputs in open_api.engine.calls] == [stop, stop]


def test_the_openapi_document_states_the_stop_bounds(open_api):
    stop = open_api.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]["properties"]["stop"]
    forms = {f.get("type"): f for f in stop["anyOf"]}
    assert forms["string"]["maxLength"] == MAX_STOP_CHARS
    assert forms["array"]["maxItems"] == MAX_STOP and forms["array"]["items"]["maxLength"] == MAX_STOP_CHARS


# ---- item 7: a score-only answer, joined in linear time, encoded off the event loop ---------------------

def _piece(tokens: list[str]) -> dict:
    offsets = [sum(map(len, tokens[:i])) for i in range(len(tokens))]
    return {"tokens": list(tokens), "token_logprobs": [-0.5] * len(tokens),
            "top_logprobs": [{t: -0.5} for t in tokens], "text_offset": offsets}


def test_joining_pieces_extends_one_accumulator_and_leaves_the_pieces_alone():
    first, second, third = _piece(["ab", "c"]), _piece(["d"]), _piece(["ef", "g"])
    acc = shapes.joined(None, first, 0)
    assert acc is not first and acc["tokens"] is not first["tokens"]
    # each later piece is appended to the same object (a new object per piece copied all before it again)
    assert shapes.joined(acc, second, 3) is acc and shapes.joined(acc, third, 4) is acc
    assert acc["tokens"] == ["ab", "c", "d", "ef", "g"] and acc["text_offset"] == [0, 2, 3, 4, 6]
    assert first == _piece(["ab", "c"]) and third == _piece(["ef", "g"])  # the pieces are unchanged
    assert shapes.joined(acc, None, 7) is acc


def test_a_unary_answer_is_encoded_off_the_event_loop(open_api, monkeypatch):
    threads = []
    encode = shapes.rendered

    def recording(body):
        try:
            asyncio.get_running_loop()
            threads.append("event loop")
        except RuntimeError:
            threads.append("worker")
        return encode(body)

    monkeypatch.setattr(shapes, "rendered", recording)
    r = post(open_api, prompt=["one two three"] * 8, max_tokens=0, echo=True, logprobs=5)
    assert r.status_code == 200 and len(r.json()["choices"]) == 8, r.text
    assert r.json()["choices"][0]["logprobs"]["tokens"] == ["one two three"]
    assert threads == ["worker"]
