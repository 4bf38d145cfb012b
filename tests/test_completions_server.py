"""/v1/completions through the live gateway with the real `openai` SDK, compared with the `codegen`
ensemble called straight over gRPC and with the codegen tokenizer's counts; disconnects checked on the
generator's active-sequences gauge (Triton's metrics port)."""
from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
import urllib.request

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from codegen_engines import ENGINES, load_generator_with_engine
from gateway_helpers import error_of
from model_configs import MODEL_REPOSITORY

pytestmark = pytest.mark.integration

PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n    def __init__(self):\n", "x = [",
           "for i in range(10):\n", "# read a file\n", "def add(a, b):\n    return", "while True:\n"]
ACTIVE = "codegen_generator_active_sequences"  # the generator's gauge of sequences in its decode batch


@pytest.fixture(scope="module", params=ENGINES)
def api(gateway, request):
    """Every test on each of the generator's engines: the shipped default (OpenVINO on this CPU), then torch
    (the generator reloaded with `engine: torch`, and back to the shipped `auto` afterwards)."""
    gateway.triton.load("codegen_generator", "codegen", "codegen_stream")
    if request.param != ENGINES[0]:
        load_generator_with_engine(gateway.triton.client, request.param)
    try:
        yield gateway
    finally:
        if request.param != ENGINES[0]:
            load_generator_with_engine(gateway.triton.client, "auto")


@pytest.fixture(scope="module")
def sdk(api):
    from openai import OpenAI

    client = OpenAI(base_url=api.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL_REPOSITORY / "codegen_preprocess" / "1" / "tokenizer.json"))


def direct(api, prompt: str, max_tokens: int, **optional) -> dict:
    """The `codegen` ensemble over gRPC, one row: every output as a Python value."""
    arrays = {"text_input": np.array([[prompt.encode()]], dtype=np.object_),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    if "stop" in optional:
        arrays["stop_words"] = np.array([[w.encode() for w in optional["stop"]]], dtype=np.object_)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == np.object_ else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = api.triton.client.infer("codegen", inputs, client_timeout=300)
    out = {}
    for name in ("text_output", "finish_reason", "prompt_tokens", "completion_tokens"):
        array = result.as_numpy(name)  # None if the model lacks the output: a KeyError where a test needs it
        if array is None:
            continue
        value = array.reshape(-1)[0]
        out[name] = value.decode() if isinstance(value, bytes) else int(value)
    return out


GAUGE_TRACE: list[tuple[float, float]] = []  # (time, value) at each change: shown when a wait times out
ROWS = "codegen_decode_rows"  # the generator's sequence rows over all decode steps: n tokens decoded add n - 1


def generator_metrics(api) -> dict[str, float]:
    with urllib.request.urlopen(api.triton.server.metrics_url, timeout=10) as response:
        values = {line.split("{", 1)[0].split(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                  for line in response.read().decode().splitlines() if line and not line.startswith("#")}
    assert ACTIVE in values and ROWS in values, f"{ACTIVE} or {ROWS} is not on Triton's metrics port"
    if not GAUGE_TRACE or GAUGE_TRACE[-1][1] != values[ACTIVE]:
        GAUGE_TRACE.append((round(time.monotonic(), 2), values[ACTIVE]))
    return values


def active_sequences(api) -> float:
    return generator_metrics(api)[ACTIVE]


def rows_at_rest(api) -> float:
    """The generator's decoded-rows count once it is idle (the counter is sent when the loop idles):
    the same on two looks 0.3 s apart, with no sequence in the batch."""
    def steady():
        first = generator_metrics(api)
        if first[ACTIVE]:
            return None
        time.sleep(0.3)
        second = generator_metrics(api)
        return (second[ROWS],) if not second[ACTIVE] and second[ROWS] == first[ROWS] else None
    return wait_for(steady, what="an idle generator")[0]


def wait_for(condition, timeout: float = 60.0, what: str = ""):
    """The condition's first true value."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}; gauge changes: {GAUGE_TRACE[-12:]}"
        time.sleep(0.05)
    return value


def events(lines) -> list:
    """SSE `data:` payloads from an iterator of lines."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_greedy_text_usage_and_length_equal_codegen(api, sdk, tokenizer):
    prompt, max_tokens = PROMPTS[0], 24
    reference = direct(api, prompt, max_tokens)
    completion = sdk.completions.create(model="codegen", prompt=prompt, max_tokens=max_tokens, temperature=0)
    choice = completion.choices[0]
    assert choice.text == reference["text_output"] and choice.finish_reason == reference["finish_reason"]
    prompt_tokens = len(tokenizer.encode(prompt).ids)
    if choice.finish_reason == "length":
        assert completion.usage.completion_tokens == max_tokens
    assert completion.usage.prompt_tokens == prompt_tokens == reference["prompt_tokens"]
    assert completion.usage.completion_tokens == reference["completion_tokens"]
    assert completion.usage.total_tokens == prompt_tokens + completion.usage.completion_tokens

    chunks = list(sdk.completions.create(model="codegen", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == reference["text_output"]
    assert [c.choices[0].finish_reason for c in text_chunks[:-1]] == [None] * (len(text_chunks) - 1)
    assert text_chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == completion.usage.model_dump()


def test_finish_reason_length_and_stop(api, sdk):
    prompt = PROMPTS[4]  # runs past 40 tokens (the demo model ends a function early: docs/demo-models.md)
    full = sdk.completions.create(model="codegen", prompt=prompt, max_tokens=40, temperature=0)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 40
    text = full.choices[0].text
    stop = next(text[i:i + 2] for i in range(len(text) // 3, len(text) - 1) if text[i:i + 2].strip())
    expected = text[:text.find(stop)]
    for stream in (False, True):
        got = sdk.completions.create(model="codegen", prompt=prompt, max_tokens=40, temperature=0, stop=stop,
                                     stream=stream)
        if stream:
            pieces = list(got)
            assert "".join(c.choices[0].text for c in pieces) == expected
            assert pieces[-1].choices[0].finish_reason == "stop"
        else:
            assert got.choices[0].text == expected and got.choices[0].finish_reason == "stop"
            assert got.usage.completion_tokens < 40
    assert direct(api, prompt, 40, stop=[stop])["text_output"] == expected


def test_eight_prompts_in_one_request_equal_eight_requests(api, sdk):
    params = dict(model="codegen", max_tokens=12, temperature=0.8, seed=1234)
    batched = sdk.completions.create(prompt=PROMPTS, **params)
    assert [c.index for c in batched.choices] == list(range(8))
    singles = [sdk.completions.create(prompt=p, **params) for p in PROMPTS]
    assert [c.text for c in batched.choices] == [s.choices[0].text for s in singles]
    assert batched.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert batched.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)


def test_n_with_a_seed_is_reproducible(api, sdk):
    params = dict(model="codegen", prompt=PROMPTS[1], max_tokens=16, temperature=1.0, n=3, seed=42)
    first, second = (sdk.completions.create(**params) for _ in range(2))
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in second.choices] and len(texts) == 3
    assert len(set(texts)) > 1  # seed + i: three different samples
    streamed = {}
    for chunk in sdk.completions.create(stream=True, **params):
        streamed[chunk.choices[0].index] = streamed.get(chunk.choices[0].index, "") + chunk.choices[0].text
    assert [streamed[i] for i in range(3)] == texts


def test_first_chunk_leaves_while_the_sequence_is_still_generating(api, long_prompts):
    body = {"model": "codegen", "prompt": long_prompts[0], "max_tokens": 512, "temperature": 0, "stream": True}
    with api.http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
        # the first chunk is here and the generator is still on the sequence (the gauge lags <= 0.2 s)
        wait_for(lambda: active_sequences(api) >= 1, timeout=30, what="the generator's gauge")
        rest = events(lines)
    assert len(rest) > 2, "the whole completion had been generated before the first chunk left"
    assert rest[-1] == "[DONE]" and rest[-2]["choices"][0]["finish_reason"] in ("length", "stop")


NEIGHBOUR_ROWS = 6  # several rows: the generator's steps take longer, so the neighbour outlives the checks


MORE_PROMPTS = ["import sys\n", "def main():\n", "# utilities\n", "if __name__ == '__main__':\n", "class A:\n",
                "return [", "try:\n", "with open(path) as f:\n"]


@pytest.fixture(scope="module")
def long_prompts(api) -> list[str]:
    """NEIGHBOUR_ROWS + 2 prompts whose greedy completion runs to 512 tokens (no end-of-text before it),
    so that every row of the disconnect test stays in the batch until it leaves or the test is done."""
    from concurrent.futures import ThreadPoolExecutor

    candidates = PROMPTS + MORE_PROMPTS
    with ThreadPoolExecutor(4) as pool:
        reasons = list(pool.map(lambda p: direct(api, p, 512)["finish_reason"], candidates))
    found = [p for p, reason in zip(candidates, reasons) if reason == "length"]
    assert len(found) >= NEIGHBOUR_ROWS + 2, f"only {len(found)} prompts run to 512 tokens"
    return found[:NEIGHBOUR_ROWS + 2]


class Neighbour(threading.Thread):
    """Long streamed completions of NEIGHBOUR_ROWS prompts, one after another in the background until
    `stop()`, each read to its end: back to back, so that a neighbour streams through the checks however
    fast the box decodes (one round of 512 tokens took ~2 s on a fast run)."""

    def __init__(self, api, prompts: list[str]):
        super().__init__(daemon=True)
        self.api, self.prompts, self.rounds, self._stopping = api, prompts, [], threading.Event()
        self.body = {"model": "codegen", "prompt": prompts, "max_tokens": 512, "temperature": 0, "stream": True}
        # rows of the round under way whose last chunk has not arrived: at most this many are in the batch
        self.open_rows = 0

    def run(self):
        with httpx.Client(base_url=self.api.url, timeout=300) as client:
            while not self._stopping.is_set():
                round_events: list = []
                self.rounds.append(round_events)
                self.open_rows = len(self.prompts)
                with client.stream("POST", "/v1/completions", json=self.body) as response:
                    for event in events(response.iter_lines()):
                        round_events.append(event)
                        if event != "[DONE]" and event["choices"][0]["finish_reason"] is not None:
                            self.open_rows -= 1

    def stop(self) -> None:
        """Ends after the round under way, which runs to its end."""
        self._stopping.set()
        self.join(300)

    def texts(self) -> list[list[str]]:
        """Each round's text per prompt; a round without its [DONE] fails."""
        out = []
        for round_events in self.rounds:
            assert round_events and round_events[-1] == "[DONE]", "a neighbour round did not end with [DONE]"
            texts = [""] * len(self.prompts)
            for event in round_events[:-1]:
                texts[event["choices"][0]["index"]] += event["choices"][0]["text"]
            out.append(texts)
        return out


def open_unary(api, body: dict) -> socket.socket:
    """A unary completion sent on a raw connection, so that the test decides when the client leaves."""
    url = urllib.parse.urlsplit(api.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    return sock


def test_disconnects_free_the_generator_row_while_a_neighbour_streams(api, long_prompts):
    """A stream abandoned after its first chunk, then a unary request whose connection closes: each row
    leaves the decode batch early, i.e. decodes fewer tokens than the same request run to its end (the
    generator's count of decoded rows, read at rest), while a neighbour of NEIGHBOUR_ROWS sequences
    streams beside it, round after round, and loses nothing. Counted, not timed: on a fast box a
    512-token row lives ~2 s, so a gauge seen dropping could as well be a row at its end."""
    neighbour_prompts, stream_prompt, unary_prompt = long_prompts[:NEIGHBOUR_ROWS], long_prompts[-1], long_prompts[-2]
    text, rows = {}, {}  # each prompt run alone to its end: its text and the rows it decoded
    for prompt in long_prompts:
        start = rows_at_rest(api)
        text[prompt] = direct(api, prompt, 512)["text_output"]
        rows[prompt] = rows_at_rest(api) - start

    def rows_left_beside_the_neighbour(open_row) -> float:
        """Rows decoded by the request `open_row(neighbour)` sends, in the batch beside the neighbour, and whose
        client leaves when it returns; the neighbour's rounds checked against the texts run alone."""
        start = rows_at_rest(api)
        neighbour = Neighbour(api, neighbour_prompts)
        neighbour.start()
        try:
            wait_for(lambda: active_sequences(api) == NEIGHBOUR_ROWS, timeout=60, what="the neighbour in the batch")
            open_row(neighbour)
        finally:
            neighbour.stop()  # also when a check failed: a neighbour left streaming would load the next tests
        assert not neighbour.is_alive() and neighbour.rounds
        for texts in neighbour.texts():  # the neighbour lost nothing, in any round
            assert texts == [text[p] for p in neighbour_prompts]
        return rows_at_rest(api) - start - len(neighbour.rounds) * sum(rows[p] for p in neighbour_prompts)

    def in_the_batch(neighbour) -> bool:
        """More rows decode than the neighbour can have in the batch (its rows whose last chunk has not arrived):
        the request under test is one of them. A fast engine (OpenVINO) ends a neighbour round within ~1 s, so
        the neighbour's six rows and this one are seldom all in the batch at once."""
        before = neighbour.open_rows  # the bound read on both sides of the gauge (a row may end in between)
        return active_sequences(api) > max(before, neighbour.open_rows)

    def abandoned_stream(neighbour):
        body = {"model": "codegen", "prompt": stream_prompt, "max_tokens": 512, "temperature": 0, "stream": True}
        with httpx.Client(base_url=api.url, timeout=300) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                # the line iterator is held open while waiting: dropped, it would close the stream there and then
                lines = response.iter_lines()
                next(line for line in lines if line.startswith("data: "))  # the row is decoding
                wait_for(lambda: in_the_batch(neighbour), timeout=30, what="the stream in the batch")
        # leaving the blocks closes the connection after the first chunk

    def closed_unary(neighbour):
        unary = open_unary(api, {"model": "codegen", "prompt": unary_prompt, "max_tokens": 512, "temperature": 0})
        try:
            wait_for(lambda: in_the_batch(neighbour), timeout=30, what="the unary row in the batch")
        finally:
            unary.close()  # the unary client leaves

    for open_row, prompt in ((abandoned_stream, stream_prompt), (closed_unary, unary_prompt)):
        decoded = rows_left_beside_the_neighbour(open_row)
        assert 0 < decoded < rows[prompt], f"{open_row.__name__}: {decoded} rows decoded, {rows[prompt]} to its end"


def test_bad_input_is_a_400_and_the_service_keeps_serving(api, tokenizer):
    long_prompt = "x = 1\n" * 1200
    assert len(tokenizer.encode(long_prompt).ids) > 1024
    cases = [({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
             ({"prompt": "x", "max_tokens": 100000}, "max_tokens"), ({"prompt": "x", "temperature": -1}, "temperature"),
             ({"prompt": "x", "top_p": 0}, "top_p"), ({"prompt": "x", "top_p": 1.01}, "top_p"),
             ({"prompt": "x", "stop": list("abcde")}, "stop"), ({"prompt": "x", "n": 1000}, "n"),
             ({"prompt": "x", "logprobs": 6}, "logprobs"), ({"prompt": "x", "best_of": 3}, "best_of"),
             ({"prompt": "x", "suffix": "s"}, "suffix"), ({"prompt": "x", "logit_bias": {"5": 1}}, "logit_bias"),
             ({"prompt": "x", "presence_penalty": 1}, "presence_penalty"),
             ({"prompt": "x", "frequency_penalty": 1}, "frequency_penalty")]
    for body, param in cases:
        r = api.http.post("/v1/completions", json={"model": "codegen", **body})
        assert r.status_code == 400, (body, r.text)
        error = error_of(r)
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    for stream in (False, True):
        r = api.http.post("/v1/completions", json={"model": "codegen", "prompt": long_prompt, "stream": stream})
        assert r.status_code == 400, r.text
        assert "context window of 1024" in r.json()["error"]["message"], r.text
    r = api.http.post("/v1/completions", json={"model": "no-such-model", "prompt": "x"})
    assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]
    assert "codegen" in [m["id"] for m in api.http.get("/v1/models").json()["data"]]
    r = api.http.post("/v1/completions", json={"model": "codegen", "prompt": "def f():", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
