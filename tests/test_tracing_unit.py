"""Tracing, request ids and log lines of the gateway in this process (gateway/middleware/tracing.py,
gateway/telemetry/): off by default with nothing but the request id added, a request's spans when on (the
SDK's own in-memory exporter stands behind the app's real provider), the W3C context handed to Triton, the
trace ids in responses, error bodies and log lines, and Triton's --trace-config."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import time

import grpc
import httpx
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.tracing_overhead import helpers_us
from gateway.keys import key_line
from gateway.middleware.tracing import RequestTrace
from gateway.telemetry import spans
from gateway.telemetry.config import TelemetryOptions, traces_url
from gateway.telemetry.log_format import JsonFormatter
from gateway.telemetry.setup import tracer_provider
from gateway.triton.coalesce import Coalescer
from gateway.triton.engine import TritonEngine
from gateway_helpers import MINILM
from inprocess_gateway import inprocess_gateway
from launcher.triton_server import TritonServer

URL = "http://127.0.0.1:4318/v1/traces"
CLIENT_TRACE, CLIENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
SECRET_TEXT = "the quick secret sentence 4711"


# ---- configuration -------------------------------------------------------------------------------

def test_tracing_is_off_unless_an_otlp_endpoint_is_set():
    assert traces_url({}) is None
    assert traces_url({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) is None
    assert traces_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}) == "http://collector:4318/v1/traces"
    assert traces_url({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/custom",
                       "OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318"}) == "http://tempo:4318/custom"
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert traces_url({**on, "OTEL_SDK_DISABLED": "true"}) is None
    assert traces_url({**on, "OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(ValueError, match="OTLP/HTTP only"):
        traces_url({**on, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_access_log_and_log_format_options():
    assert TelemetryOptions.from_env({}) == TelemetryOptions(None, False, False)
    assert TelemetryOptions.from_env({"ACCESS_LOG": "1", "LOG_FORMAT": "JSON"}) == TelemetryOptions(None, True, True)
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        TelemetryOptions.from_env({"LOG_FORMAT": "xml"})
    with pytest.raises(ValueError, match="ACCESS_LOG"):
        TelemetryOptions.from_env({"ACCESS_LOG": "maybe"})


def test_triton_traces_only_what_the_gateway_sends_it_to_the_same_endpoint():
    assert "--trace-config" not in TritonServer().command()
    command = TritonServer(traces_url=URL).command()
    settings = [command[i + 1] for i, arg in enumerate(command) if arg == "--trace-config"]
    assert settings == ["mode=opentelemetry", "level=TIMESTAMPS", "rate=0", "count=-1", f"opentelemetry,url={URL}",
                        "opentelemetry,resource=service.name=triton-inference-server"]


# ---- off: the request id only --------------------------------------------------------------------

def test_untraced_every_answer_has_a_request_id_and_an_error_body_names_it(tmp_path):
    async def scenario():
        async with inprocess_gateway(tmp_path, app_options={"telemetry": TelemetryOptions()}) as (app, client):
            assert app.state.tracer_provider is None
            ok = await client.post("/v1/embeddings", json={"model": MINILM, "input": "hello"})
            mine = await client.post("/v1/embeddings", json={"model": MINILM, "input": ""},
                                     headers={"x-request-id": "client-chosen-1"})
            missing = await client.get("/v1/nothing-here")
            return ok, mine, missing

    ok, mine, missing = asyncio.run(scenario())
    assert ok.status_code == 200 and len(ok.headers["x-request-id"]) == 32
    assert "traceparent" not in ok.headers
    assert mine.status_code == 400 and mine.headers.get_list("x-request-id") == ["client-chosen-1"]
    assert mine.json()["error"]["request_id"] == "client-chosen-1"
    assert missing.status_code == 404 and missing.json()["error"]["request_id"] == missing.headers["x-request-id"]


def test_an_unexpected_500_and_an_admission_503_carry_the_request_id(tmp_path, monkeypatch):
    from gateway.routers import embeddings

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    async def scenario():
        async with inprocess_gateway(tmp_path, app_options={"telemetry": TelemetryOptions()}) as (app, client):
            monkeypatch.setattr(embeddings, "truncate_dimensions", broken)
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # the 500 as a client sees it
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as tolerant:
                failed = await tolerant.post("/v1/embeddings", json={"model": MINILM, "input": "hello"})
            app.state.admission.draining = True
            refused = await client.post("/v1/embeddings", json={"model": MINILM, "input": "hello"})
            return failed, refused

    failed, refused = asyncio.run(scenario())
    assert failed.status_code == 500 and failed.json()["error"]["request_id"] == failed.headers["x-request-id"]
    assert refused.status_code == 503 and len(refused.headers.get_list("x-request-id")) == 1


def test_untraced_the_request_layer_and_the_span_helpers_cost_microseconds():
    """The per-request CPU that tracing adds when off, measured: the RequestTrace layer around a trivial
    ASGI app (the request id, its header) and every span helper the hot path calls. The figures are
    printed (pytest -s); the bounds are loose (a shared 2-core box), for regressions of 10x."""
    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    layer = RequestTrace(inner, None, False)

    async def sent(_message):
        pass

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    def scope():
        return {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": [
            (b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"authorization", b"Bearer x" * 4)]}

    async def per_call(app, n: int) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                await app(scope(), receive, sent)
            best = min(best, (time.perf_counter() - start) / n)
        return best

    async def measure():
        return await per_call(inner, 4000), await per_call(layer, 4000)

    bare, layered = asyncio.run(measure())
    # what engine.infer, coalesce, tokens and the JSON parse call per request (the bench's loop)
    helpers = helpers_us(20000) / 1e6
    added = layered - bare
    print(f"\nuntraced: request layer +{added * 1e6:.2f} us per request (bare app {bare * 1e6:.2f} us), "
          f"span helpers {helpers * 1e6:.2f} us per request")
    assert added < 25e-6 and helpers < 10e-6


# ---- on: one request's spans ---------------------------------------------------------------------

@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = tracer_provider(URL, {}, exporter=exporter)
    yield provider, exporter
    provider.shutdown()


def by_name(finished) -> dict:
    return {span.name: span for span in finished}


def test_a_traced_request_is_one_server_span_with_its_stages_and_a_traceparent(tmp_path, traced):
    provider, exporter = traced

    async def scenario():
        options = {"telemetry": TelemetryOptions(URL), "tracer_provider": provider}
        # the in-process client is 127.0.0.1: a trusted source, whose trace goes on (tests/test_abuse3_tracing.py)
        async with inprocess_gateway(tmp_path, app_options=options,
                                     trace_trusted_sources=("127.0.0.1",)) as (_app, client):
            return await client.post("/v1/embeddings", json={"model": MINILM, "input": [SECRET_TEXT]},
                                     headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})

    response = asyncio.run(scenario())
    assert response.status_code == 200
    provider.force_flush()
    finished = exporter.get_finished_spans()
    named = by_name(finished)
    server = named["POST /v1/embeddings"]
    assert server.kind == trace.SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == CLIENT_TRACE, "the client's trace goes on"
    assert format(server.parent.span_id, "016x") == CLIENT_SPAN
    assert response.headers["traceparent"] == f"00-{CLIENT_TRACE}-{format(server.context.span_id, '016x')}-01"
    attributes = dict(server.attributes)
    assert attributes["http.route"] == "/v1/embeddings" and attributes["http.response.status_code"] == 200
    assert attributes["gateway.model"] == MINILM
    assert attributes["gateway.request_id"] == response.headers["x-request-id"]
    for stage in ("gateway.read_body", "gateway.quotas", "gateway.count_tokens"):
        assert named[stage].parent.span_id == server.context.span_id, stage
    assert named["gateway.read_body"].attributes["http.request.body.size"] > len(SECRET_TEXT)
    assert {span.context.trace_id for span in finished} == {server.context.trace_id}
    assert not [span.name for span in finished if SECRET_TEXT in json.dumps(dict(span.attributes))]


def test_a_traced_refusal_has_its_status_and_no_key_in_any_span(tmp_path, traced):
    provider, exporter = traced
    keys = tmp_path / "keys.txt"
    keys.write_text(key_line("sk-very-secret-4711", "reader", "inference", rps=1))

    async def scenario():
        options = {"telemetry": TelemetryOptions(URL), "tracer_provider": provider}
        async with inprocess_gateway(tmp_path, app_options=options, api_keys_file=keys) as (_app, client):
            headers = {"authorization": "Bearer sk-very-secret-4711"}
            answers = [await client.post("/v1/embeddings", json={"model": MINILM, "input": "x"}, headers=headers)
                       for _ in range(3)]
            answers.append(await client.post("/v1/embeddings", json={"model": MINILM, "input": "x"},
                                             headers={"authorization": "Bearer sk-wrong"}))
            return answers

    answers = asyncio.run(scenario())
    assert 429 in [a.status_code for a in answers] and answers[-1].status_code == 401
    provider.force_flush()
    finished = exporter.get_finished_spans()
    servers = [s for s in finished if s.kind == trace.SpanKind.SERVER]
    assert [s.attributes["http.response.status_code"] for s in servers] == [a.status_code for a in answers]
    assert all(s.attributes.get("gateway.key_id") == "reader" for s in servers[:3])
    refused = next(s for s in servers if s.attributes["http.response.status_code"] == 429)
    quota = next(s for s in finished if s.name == "gateway.quotas" and s.parent.span_id == refused.context.span_id)
    assert quota.attributes["gateway.refused"] is True
    dumped = json.dumps([dict(s.attributes) for s in finished] + [s.name for s in finished])
    assert "sk-very-secret" not in dumped and "sk-wrong" not in dumped


def test_the_triton_call_carries_the_w3c_context_of_its_client_span(traced):
    provider, exporter = traced
    seen = {}

    class Stub:
        async def ModelInfer(self, request, timeout=None, metadata=None):
            seen["metadata"] = metadata
            raise FakeRpcError()

    class FakeRpcError(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.INVALID_ARGUMENT

        def details(self):
            return f"input 0 is bad: {SECRET_TEXT}"

        def debug_error_string(self):
            return ""

    async def scenario():
        engine = TritonEngine("127.0.0.1:1")
        engine.stub = Stub()
        tracer = provider.get_tracer("test")
        spans.TRACER.set(tracer)
        try:
            with tracer.start_as_current_span("server"):
                with pytest.raises(Exception) as info:
                    await engine.infer("text_embedding", {"text": np.array([[b"x"]], np.object_)}, ["embedding"])
                return info.value
        finally:
            await engine.close()

    error = asyncio.run(scenario())
    assert error.status == 400
    provider.force_flush()
    call = by_name(exporter.get_finished_spans())["inference.GRPCInferenceService/ModelInfer"]
    (name, value), = seen["metadata"]
    context = call.context
    assert name == "traceparent" and value == "-".join(
        ["00", format(context.trace_id, "032x"), format(context.span_id, "016x"), format(context.trace_flags, "02x")])
    assert context.trace_flags.sampled
    assert call.kind == trace.SpanKind.CLIENT and call.attributes["triton.model_name"] == "text_embedding"
    assert call.status.status_code == trace.StatusCode.ERROR and call.attributes["gateway.error.code"] == "invalid_input"
    assert SECRET_TEXT not in json.dumps(dict(call.attributes)), "an error's message stays out of spans"


def test_an_unsampled_request_sends_triton_no_context():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")

    async def scenario():
        spans.TRACER.set(tracer)
        span = spans.start_call("ModelInfer", "m")
        return span, spans.grpc_metadata(span)

    span, metadata = asyncio.run(scenario())
    assert span is not None and not span.is_recording() and metadata is None


def test_coalesced_requests_each_have_a_wait_span_and_the_call_runs_in_the_leads_trace(traced):
    provider, exporter = traced
    tracer = provider.get_tracer("test")
    calls = []

    async def send(items):
        calls.append((items, trace.get_current_span().get_span_context().trace_id))
        await asyncio.sleep(0.05)
        return np.array([[len(item)] for item in items])

    async def request(coalescer, name, items):
        spans.TRACER.set(tracer)
        with tracer.start_as_current_span(name) as span:
            return await coalescer.run(items), span.get_span_context().trace_id

    async def scenario():
        coalescer = Coalescer(send, max_rows=8, max_calls=1)
        first = asyncio.create_task(request(coalescer, "a", ["a"]))
        await asyncio.sleep(0.01)  # a's call holds the only slot: b and c queue and go together
        rest = [asyncio.create_task(request(coalescer, n, [n * 2])) for n in ("b", "c")]
        return await first, await asyncio.gather(*rest)

    (_, trace_a), [(rows_b, trace_b), (rows_c, trace_c)] = asyncio.run(scenario())
    assert rows_b.tolist() == [[2]] and rows_c.tolist() == [[2]]
    assert [(items, trace_id) for items, trace_id in calls] == [(["a"], trace_a), (["bb", "cc"], trace_b)]
    provider.force_flush()
    waits = [s for s in exporter.get_finished_spans() if s.name == "gateway.coalesce.wait"]
    assert {s.context.trace_id for s in waits} == {trace_b, trace_c}, "a found a free slot: no wait"
    lead, other = sorted(waits, key=lambda s: not s.attributes["gateway.coalesce.leads"])
    assert lead.context.trace_id == trace_b and other.attributes["gateway.coalesce.requests"] == 2
    assert [link.context.span_id for link in other.links] == [lead.context.span_id]


# ---- logs ----------------------------------------------------------------------------------------

def test_access_lines_and_json_logs_carry_the_request_and_trace_ids_never_the_key(tmp_path, traced):
    provider, _exporter = traced
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)

    async def scenario():
        options = {"telemetry": TelemetryOptions(URL, access_log=True, json_logs=True), "tracer_provider": provider}
        async with inprocess_gateway(tmp_path, app_options=options) as (_app, client):
            return await client.post("/v1/embeddings", json={"model": MINILM, "input": SECRET_TEXT},
                                     headers={"x-request-id": "find-me-42", "authorization": "Bearer sk-x-4711"})

    try:
        response = asyncio.run(scenario())
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "gateway.access"]
    assert len(access) == 1, lines
    (line,) = access
    trace_id = response.headers["traceparent"].split("-")[1]
    assert line["request_id"] == "find-me-42" and line["trace_id"] == trace_id
    assert (line["method"], line["route"], line["status"]) == ("POST", "/v1/embeddings", 200)
    assert line["duration_ms"] > 0
    text = stream.getvalue()
    assert SECRET_TEXT not in text and "sk-x-4711" not in text
