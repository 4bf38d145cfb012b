"""The generator's own span (backends/stage_common/tracing.py): off without an OTLP endpoint (no SDK, no span,
~no cost), a traceparent taken from what Triton gives, and with the SDK's in-memory exporter a
`codegen_generator.sequence` span under the caller's span with gen_ai.* attributes and the engine's events,
never a token or an error's message. The fronts pass their request's traceparent to the generator as a BLS
request parameter; the generator turns it into that span (fake_pb_utils, no server)."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

import fake_pb_utils as pb
from stage_common.tracing import StageTracing, stage_traces_url, traceparent_of

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
REASONS = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "cancelled"}
WAIT = 60


def test_tracing_is_off_without_an_otlp_endpoint_and_when_switched_off():
    assert stage_traces_url({}) is None
    assert StageTracing.from_env("codegen_generator", {}) is None
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"}
    assert stage_traces_url(on) == "http://127.0.0.1:4318/v1/traces"
    whole = "http://127.0.0.1:9/t"
    assert stage_traces_url({**on, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": whole}) == whole
    assert stage_traces_url({**on, "OTEL_SDK_DISABLED": "true"}) is None
    assert stage_traces_url({**on, "OTEL_TRACES_EXPORTER": "none"}) is None


def test_a_sampled_traceparent_is_read_from_what_triton_gives_and_anything_else_is_none():
    assert traceparent_of(json.dumps({"traceparent": PARENT})) == PARENT  # InferenceTrace.get_context()
    assert traceparent_of(json.dumps({"traceparent": PARENT, "other": 1}).encode()) == PARENT  # parameters
    assert traceparent_of(PARENT.upper()) == PARENT and traceparent_of({"traceparent": PARENT}) == PARENT
    for nothing in (None, "", "{}", "{not json", "null", json.dumps({"traceparent": "00-zz"}), 5,
                    PARENT[:-2] + "00"):  # the last one: not sampled
        assert traceparent_of(nothing) is None, nothing


@pytest.fixture()
def exported():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing = StageTracing(None, "codegen_generator", exporter=exporter)
    yield tracing, exporter
    tracing.close()


def _event(name, **attributes):
    from gptj_generator.seam import GenerationEvent

    return GenerationEvent(name, time.time_ns(), attributes)


def _request():
    from gptj_generator.seam import GenerationRequest, SamplingParams

    return GenerationRequest([11, 12, 13], 8, SamplingParams(temperature=0.7, top_k=5, top_p=0.9))


def test_a_sequence_span_is_a_child_of_the_callers_span_with_gen_ai_attributes_and_the_engines_events(exported):
    tracing, exporter = exported
    listener = tracing.sequence(PARENT, _request(), "openvino", REASONS)
    listener(_event("queued", prompt_tokens=3, max_tokens=8))
    listener(_event("scheduled"))
    listener(_event("first_token"))
    assert exporter.get_finished_spans() == (), "the span ends with the sequence"
    listener(_event("finished", reason="eos", completion_tokens=5))
    tracing.provider.force_flush()
    (span,) = exporter.get_finished_spans()
    assert span.name == "codegen_generator.sequence"
    assert format(span.context.trace_id, "032x") == TRACE_ID and format(span.parent.span_id, "016x") == PARENT[36:52]
    attributes = dict(span.attributes)
    assert attributes["gen_ai.request.max_tokens"] == 8
    assert attributes["gen_ai.request.temperature"] == pytest.approx(0.7)
    assert attributes["gen_ai.request.top_p"] == pytest.approx(0.9) and attributes["gen_ai.request.top_k"] == 5
    assert attributes["gen_ai.usage.input_tokens"] == 3 and attributes["gen_ai.usage.output_tokens"] == 5
    assert list(attributes["gen_ai.response.finish_reasons"]) == ["stop"]  # the engine's eos, as OpenAI says it
    assert attributes["codegen.engine"] == "openvino"
    assert [e.name for e in span.events] == ["queued", "scheduled", "first_token", "finished"]
    assert span.resource.attributes["service.name"] == "triton-inference-server"
    assert span.end_time == span.events[-1].timestamp


def test_a_failed_sequence_records_the_errors_type_and_never_its_message_nor_any_token(exported):
    tracing, exporter = exported
    listener = tracing.sequence(PARENT, _request(), "torch", REASONS)
    listener(_event("queued", prompt_tokens=3, max_tokens=8))
    listener(_event("finished", error=repr(ValueError("prompt 'secret words' too long")), completion_tokens=0))
    tracing.provider.force_flush()
    (span,) = exporter.get_finished_spans()
    assert span.attributes["error.type"] == "ValueError" and span.status.status_code.name == "ERROR"
    dumped = json.dumps([dict(span.attributes), [(e.name, dict(e.attributes)) for e in span.events]])
    assert "secret" not in dumped


def test_no_traceparent_no_span(exported):
    tracing, exporter = exported
    assert tracing.sequence(None, _request(), "openvino", REASONS) is None


def test_the_generator_makes_the_span_under_the_traceparent_parameter_its_caller_sent(monkeypatch):
    """model.py's insertion: a request with the parameter gets a span; one without gets none."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from model_configs import load_python_model
    from stage_common import tracing

    exporter = InMemorySpanExporter()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    real = tracing.StageTracing.__init__
    monkeypatch.setattr(tracing.StageTracing, "__init__",
                        lambda self, url, scope, exporter_=None: real(self, url, scope, exporter=exporter))
    model = load_python_model("codegen_generator")
    try:
        def generation(parameters):
            return pb.InferenceRequest({"input_ids": np.array([[11, 12]], np.int32),
                                        "input_lengths": np.array([[2]], np.int32),
                                        "request_output_len": np.array([[3]], np.int32),
                                        "streaming": np.array([[False]])}, parameters=parameters)

        traced, untraced = generation({"traceparent": PARENT}), generation(None)
        model.execute([traced, untraced])
        assert traced.sender.answered.wait(WAIT) and untraced.sender.answered.wait(WAIT)
        model.tracing.provider.force_flush()
        (span,) = exporter.get_finished_spans()
        assert span.name == "codegen_generator.sequence" and format(span.context.trace_id, "032x") == TRACE_ID
        assert span.attributes["gen_ai.usage.input_tokens"] == 2
        assert span.attributes["codegen.engine"] == model.engine.name
    finally:
        model.finalize()


def test_with_tracing_off_the_generator_has_no_tracer_and_a_request_costs_about_nothing(monkeypatch):
    """Off: from_env is None, the SDK is not touched; the per-request cost is one `is None` test. Timed
    against a bare loop so that a regression (e.g. parsing the parameters first) would show."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing = StageTracing.from_env("codegen_generator")
    assert tracing is None
    rounds = 200_000
    started = time.perf_counter()
    for _ in range(rounds):
        if tracing is not None:
            raise AssertionError
    per_request_ns = (time.perf_counter() - started) / rounds * 1e9
    print(f"\ntracing off: {per_request_ns:.0f} ns per request (the generator's check)")
    assert per_request_ns < 5_000
