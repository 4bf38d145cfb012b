"""One trace per request through a live gateway and a live Triton, both exporting OTLP/HTTP to a receiver
this test starts on 127.0.0.1 (bench/otlp_receiver.py: opentelemetry-proto's messages decoded, no mock of
the SDK). This module starts its own Triton with the trace config `make triton` gives it (the session's
shared Triton runs without tracing) and its own gateway with the OTEL_* variables, ACCESS_LOG=1 and
LOG_FORMAT=json. One /v1/embeddings, one /v1/completions stream and one failing request (an image sent to
a text-only model): one trace id across the gateway's and Triton's spans, every parent present, the
ensemble's stages named, the preprocessing's and the generator's own spans under their front, the ids
in headers, error body and log lines, and no input text, prompt, key or image bytes in any span attribute or
log line. Then issue 56's heavy request (64 sequences with logprobs), traced three times: Triton stays up."""
from __future__ import annotations

import base64
import json
import time

import httpx
import pytest

from bench.otlp_receiver import OtlpReceiver
from gateway.keys import key_line
from gateway_helpers import MINILM, png_bytes
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer

pytestmark = pytest.mark.integration

KEY = "gk-tracing-test-secret-7f3a9c"
TEXT = "zebra quantum marmalade 6021 embeds here"
PROMPT = "def tracing_probe_5813(x):"
SERVICE = "gateway-under-test"
EMBEDDING_STAGES = {"text_embedding", "text_embedding_tokenizer", "text_embedding_encoder", "text_embedding_pooling"}
WAIT_S = 90


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced_triton(receiver, tmp_path_factory):
    log = tmp_path_factory.mktemp("traced_triton") / "tritonserver.log"
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_file=log,
                          explicit_models=["text_embedding", "codegen_stream", "codegen_preprocess", "codegen_generator"],
                          traces_url=receiver.url,  # what `make triton` passes (launcher/stack.py)
                          extra_args=["--trace-config", "opentelemetry,bsp_schedule_delay=200"])  # exports within 0.2 s
    server.start(timeout=300)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def traced_gateway(receiver, traced_triton, tmp_path_factory):
    folder = tmp_path_factory.mktemp("traced_gateway")
    keys = folder / "keys.txt"
    keys.write_text(key_line(KEY, "tracer", "inference"))
    process = GatewayProcess(traced_triton.grpc_url, port=free_port(), data_dir=folder / "data",
                             log_file=folder / "gateway.log",
                             env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": SERVICE,
                                  "OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "200",
                                  "ACCESS_LOG": "1", "LOG_FORMAT": "json", "GATEWAY_API_KEYS_FILE": str(keys),
                                  "PRELOAD_MODELS": ""})
    process.start(timeout=180)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def exchanges(traced_gateway):
    """The three requests, each with its response (headers, body) and the trace id its traceparent names."""
    image = base64.b64encode(png_bytes()).decode()
    headers = {"Authorization": f"Bearer {KEY}"}
    done = {}
    with httpx.Client(base_url=traced_gateway.url, headers=headers, timeout=300) as http:
        done["embeddings"] = http.post("/v1/embeddings", json={"model": MINILM, "input": [TEXT]})
        body = {"model": "codegen", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as stream:
            lines, first_chunk_ns = [], None
            for line in stream.iter_lines():
                if line.startswith("data:") and first_chunk_ns is None:
                    first_chunk_ns = time.time_ns()
                lines.append(line)
            done_ns = time.time_ns()
        done["stream"] = stream
        done["stream_lines"], done["first_chunk_ns"], done["done_ns"] = lines, first_chunk_ns, done_ns
        done["failing"] = http.post("/infer", json={"model_name": MINILM, "image": [image]})
    done["image"] = image
    return done


def trace_of(response) -> str:
    version, trace_id, _span, flags = response.headers["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1, response.headers["traceparent"]
    return trace_id


def collected(receiver, trace_id: str, names: set[str]) -> list:
    """The trace's spans once every name in `names` has arrived (exports are batched every 0.2 s)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        spans = [s for s in receiver.spans() if s.trace_id == trace_id]
        if names <= {s.name for s in spans} or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def assert_one_tree(spans, root_name: str):
    """One trace: every span's parent is in it, except the root, the gateway's server span."""
    ids = {s.span_id for s in spans}
    (root,) = [s for s in spans if s.name == root_name]
    assert root.service == SERVICE and not root.parent_id
    orphans = [(s.service, s.name) for s in spans if s is not root and s.parent_id not in ids]
    assert not orphans, f"spans whose parent is not in the trace: {orphans}"
    return root


def children(spans, parent) -> list:
    return [s for s in spans if s.parent_id == parent.span_id]


def test_an_embedding_is_one_trace_from_the_gateway_through_every_ensemble_step(receiver, exchanges):
    response = exchanges["embeddings"]
    assert response.status_code == 200, response.text
    trace_id = trace_of(response)
    call_name = "inference.GRPCInferenceService/ModelInfer"
    spans = collected(receiver, trace_id, {"POST /v1/embeddings", call_name, "gateway.count_tokens", *EMBEDDING_STAGES})
    root = assert_one_tree(spans, "POST /v1/embeddings")
    attributes = root.attributes()
    assert attributes["http.route"] == "/v1/embeddings" and attributes["gateway.model"] == MINILM
    assert attributes["gateway.key_id"] == "tracer"
    assert attributes["gateway.request_id"] == response.headers["x-request-id"]
    assert {"gateway.read_body", "gateway.quotas", "gateway.count_tokens", call_name} <= {
        s.name for s in children(spans, root)}
    (call,) = [s for s in spans if s.name == call_name]
    triton = [s for s in spans if s.service == "triton-inference-server"]
    assert EMBEDDING_STAGES <= {s.name for s in triton}, "Triton's spans name the ensemble's steps"
    assert "compute" in {s.name for s in triton}
    triton_roots = [s for s in triton if s.parent_id == call.span_id]
    assert triton_roots, "Triton's request span is a child of the gateway's client span"
    (ensemble,) = [s for s in triton if s.name == "text_embedding"]
    steps = {s.name for s in children(spans, ensemble)}
    assert EMBEDDING_STAGES - {"text_embedding"} <= steps, steps


def test_a_completions_stream_is_one_trace_from_its_first_token_to_its_last_event(receiver, exchanges):
    stream = exchanges["stream"]
    assert stream.status_code == 200 and [line for line in exchanges["stream_lines"] if line][-1] == "data: [DONE]"
    trace_id = trace_of(stream)
    call_name = "inference.GRPCInferenceService/ModelStreamInfer"
    spans = collected(receiver, trace_id, {"POST /v1/completions", call_name, "codegen_stream",
                                           "codegen_preprocess.encode"})
    root = assert_one_tree(spans, "POST /v1/completions")
    events = {e.name: e.time_unix_nano for e in root.span.events}
    assert "first_token" in events
    assert root.span.start_time_unix_nano < events["first_token"] < root.span.end_time_unix_nano
    # the server span lasts until the last event was written: at least from the first chunk to [DONE]
    assert root.span.end_time_unix_nano - events["first_token"] >= 0
    assert (root.span.end_time_unix_nano - root.span.start_time_unix_nano
            >= exchanges["done_ns"] - exchanges["first_chunk_ns"] - 50_000_000)
    (call,) = [s for s in spans if s.name == call_name]
    assert call.parent_id == root.span_id and "first_response" in {e.name for e in call.span.events}
    triton = {s.name for s in spans if s.service == "triton-inference-server"}
    # codegen_stream's BLS calls carry no trace= (made after execute returned, they would spawn a child of a freed
    # trace: docs/observability.md): its preprocessing makes its own span under the traceparent it is passed
    assert {"codegen_stream", "codegen_preprocess.encode", "compute"} <= triton, triton
    (front,) = [s for s in spans if s.name == "codegen_stream"]
    (preprocess,) = [s for s in spans if s.name == "codegen_preprocess.encode"]
    assert preprocess.parent_id == front.span_id, "the preprocessing's span under its caller's span"


def test_the_generators_own_span_is_in_the_completions_trace_under_its_front(receiver, exchanges):
    """The decoupled calls into the generator carry no trace= (it crashes Triton 2.51): codegen_stream passes its
    request's traceparent as a parameter, and the generator opens `codegen_generator.sequence` under it with the
    OpenTelemetry SDK (backends/stage_common/tracing.py): one trace id from the gateway to the sequence."""
    trace_id = trace_of(exchanges["stream"])
    spans = collected(receiver, trace_id, {"POST /v1/completions", "codegen_stream", "codegen_generator.sequence"})
    assert_one_tree(spans, "POST /v1/completions")
    (sequence,) = [s for s in spans if s.name == "codegen_generator.sequence"]
    (front,) = [s for s in spans if s.name == "codegen_stream"]
    assert sequence.service == "triton-inference-server"
    assert sequence.parent_id == front.span_id, "a child of the front's span, whose request made the call"
    attributes = sequence.attributes()
    assert attributes["gen_ai.request.max_tokens"] == 8 and attributes["gen_ai.request.temperature"] == 0
    assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["codegen.engine"] in ("openvino", "torch")
    assert {"stop", "length"} & set(attributes["gen_ai.response.finish_reasons"]["arrayValue"]["values"][0].values())
    assert [e.name for e in sequence.span.events] == ["queued", "scheduled", "first_token", "finished"]
    assert sequence.span.start_time_unix_nano <= sequence.span.end_time_unix_nano


def test_a_failing_request_can_be_looked_up_by_its_ids(receiver, exchanges):
    failing = exchanges["failing"]
    assert failing.status_code == 409, failing.text
    error = failing.json()["error"]
    assert error["request_id"] == failing.headers["x-request-id"]
    trace_id = trace_of(failing)
    spans = collected(receiver, trace_id, {"POST /infer"})
    root = assert_one_tree(spans, "POST /infer")
    attributes = root.attributes()
    assert attributes["http.response.status_code"] == 409  # a text-only model asked for an image: a conflict with its state
    assert attributes["gateway.request_id"] == error["request_id"]
    assert not [s for s in spans if s.service == "triton-inference-server"], "refused before Triton"


def test_access_lines_are_json_with_each_requests_ids(traced_gateway, exchanges):
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in traced_gateway.log_file.read_text().splitlines()
                 if line.startswith("{")]
        access = {line["request_id"]: line for line in lines if line.get("logger") == "gateway.access"}
        wanted = [exchanges[name] for name in ("embeddings", "stream", "failing")]
        if all(r.headers["x-request-id"] in access for r in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for response in wanted:
        line = access[response.headers["x-request-id"]]
        assert line["trace_id"] == trace_of(response) and line["status"] == response.status_code
        assert line["key_id"] == "tracer"


def test_no_span_and_no_log_line_holds_a_key_a_text_or_an_image(receiver, traced_gateway, exchanges):
    image = exchanges["image"]
    secrets = {"the key": KEY, "the input text": TEXT, "the prompt": PROMPT, "the image (base64)": image[40:120],
               "the image (bytes)": png_bytes()[16:48].hex()}
    trace_ids = {trace_of(exchanges[name]) for name in ("embeddings", "stream", "failing")}
    spans = [s for s in receiver.spans() if s.trace_id in trace_ids]
    assert len(spans) > 20
    dumped = json.dumps([[s.name, s.attributes(), [e.name for e in s.span.events]] for s in spans])
    log = traced_gateway.log_file.read_text()
    for what, secret in secrets.items():
        assert secret not in dumped, f"{what} is in a span"
        assert secret not in log, f"{what} is in the gateway's log"


def test_the_heavy_traced_request_of_issue_56_leaves_triton_up(receiver, traced_triton, traced_gateway, exchanges):
    """Issue 56 item 1: 8 prompts x n 8 with logprobs 5, greedy, traced at 100%, crashed Triton 2.51 (Signal 11 in
    TRITONSERVER_ServerInferAsync: a BLS call given a trace its request had already released). Three times, each
    answered in full under one trace, and the same server process serves on."""
    pid = traced_triton.process.pid
    prompts = [f"def heavy_{i}(x):" for i in range(8)]
    with httpx.Client(base_url=traced_gateway.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=600) as http:
        for _ in range(3):
            r = http.post("/v1/completions", json={"model": "codegen", "prompt": prompts, "n": 8, "logprobs": 5,
                                                   "temperature": 0, "max_tokens": 32})
            assert r.status_code == 200, r.text
            choices = r.json()["choices"]
            assert len(choices) == 64 and all(c["logprobs"]["tokens"] for c in choices)
            deadline, trace_id = time.monotonic() + WAIT_S, trace_of(r)
            while True:  # every sequence's span (exports come in batches)
                spans = [s for s in receiver.spans() if s.trace_id == trace_id]
                counts = {name: len([s for s in spans if s.name == name])
                          for name in ("codegen_preprocess.encode", "codegen_generator.sequence")}
                ids = {s.span_id for s in spans}
                whole = all(not s.parent_id or s.parent_id in ids for s in spans)
                if (set(counts.values()) == {64} and whole) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            # every sequence's two spans, or neither. Known gap (docs/observability.md, "Gaps"): in the whole suite
            # on the 2-core box 1 and 3 of 64 sequences had no span in two runs (alone: 64 of 64, every run)
            assert counts["codegen_preprocess.encode"] == counts["codegen_generator.sequence"] >= 56, counts
            assert_one_tree(spans, "POST /v1/completions")
        assert traced_triton.process.poll() is None and traced_triton.process.pid == pid, "Triton died"
        assert traced_triton.is_up()
        after = http.post("/v1/completions", json={"model": "codegen", "prompt": PROMPT, "max_tokens": 4})
        assert after.status_code == 200, after.text
