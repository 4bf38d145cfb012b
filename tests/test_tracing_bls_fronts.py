"""What the codegen fronts pass as `trace=` to their BLS calls: nothing, ever. Their calls run on worker threads
after `execute` returned, when Triton 2.51 has already released the request and its trace; a BLS call given
`trace=request.trace()` then spawns a child of freed memory and crashes the server (Signal 11 in
TRITONSERVER_ServerInferAsync: docs/observability.md, tests/test_tracing_server.py). Every call that should join
the trace (codegen_stream's preprocessing call, the first call of each generation) carries the request's W3C
traceparent as a request parameter instead, a string the stub copied."""
from __future__ import annotations

import json

import numpy as np

import fake_pb_utils as pb
from codegen_common.generation_params import GenerationParams
from model_configs import load_python_model
from test_codegen_bls_deadline import _collect_request

WAIT = 60


def _answer(ids=(5, 6), reason=b"length", count=2):
    return pb.InferenceResponse([pb.Tensor("output_ids", np.array([list(ids)], np.int32)),
                                 pb.Tensor("finish_reason", np.array([[reason]], np.object_)),
                                 pb.Tensor("completion_tokens", np.array([[count]], np.int32))])


class Recorder:
    """Answers every BLS call at once and keeps (model, request id, trace passed, inputs) of each."""

    def __init__(self):
        self.calls = []

    def __call__(self, request, decoupled):
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        self.calls.append((request.model_name, request.request_id(), request.passed_trace, set(inputs),
                           request.parameters()))
        if "probe" in inputs:
            return iter([])
        if request.model_name.endswith("preprocess"):
            params = GenerationParams(max_tokens=2).to_json().encode()
            return pb.InferenceResponse([pb.Tensor("input_ids", np.array([[11, 12]], np.int32)),
                                         pb.Tensor("input_lengths", np.array([[2]], np.int32)),
                                         pb.Tensor("generation_params", np.array([[params]], np.object_))])
        return iter([_answer()])


def test_codegen_collect_passes_no_trace_to_its_decoupled_generator_calls(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(pb, "bls_handler", recorder)
    model = load_python_model("codegen_collect")
    try:
        request = _collect_request(3)
        model.execute([request])
        assert request.sender.answered.wait(WAIT)
        ((response, _),) = request.sender.sent
        assert not response.has_error()
    finally:
        model.finalize()
    assert len([call for call in recorder.calls if "probe" not in call[3]]) == 3
    assert all(trace is None for _, _, trace, _, _ in recorder.calls)


def test_codegen_stream_passes_no_trace_to_any_call(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(pb, "bls_handler", recorder)
    model = load_python_model("codegen_stream")
    try:
        request = _traced(pb.InferenceRequest({"text_input": np.array([[b"def f():"]], np.object_),
                                               "max_tokens": np.array([[2]], np.int32)}))
        model.execute([request])
        assert request.sender.answered.wait(WAIT)
        assert not any(response is not None and response.has_error() for response, _ in request.sender.sent)
    finally:
        model.finalize()
    (preprocess, *generator) = [call for call in recorder.calls if "probe" not in call[3]]
    assert preprocess[0] == "codegen_preprocess" and preprocess[2] is None
    assert json.loads(preprocess[4]) == {"traceparent": TRACEPARENT}, "the preprocessing's span joins the trace"
    assert generator and all(name == "codegen_generator" and trace is None for name, _, trace, _, _ in generator)


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _traced(request):
    request._trace = pb.InferenceTrace(json.dumps({"traceparent": TRACEPARENT}))  # what a traced request gives
    return request


def _generator_parameters(recorder):
    return [json.loads(params) for name, _, _, inputs, params in recorder.calls
            if name == "codegen_generator" and "probe" not in inputs]


def test_codegen_collect_passes_its_requests_traceparent_to_every_generator_call_as_a_parameter(monkeypatch):
    """Instead of trace= (which crashes 2.51): the generator makes its span under it (stage_common/tracing.py)."""
    recorder = Recorder()
    monkeypatch.setattr(pb, "bls_handler", recorder)
    model = load_python_model("codegen_collect")
    try:
        traced = _traced(_collect_request(2))
        model.execute([traced])
        assert traced.sender.answered.wait(WAIT)
        assert _generator_parameters(recorder) == [{"traceparent": TRACEPARENT}] * 2
        recorder.calls.clear()
        untraced = _collect_request(1)
        model.execute([untraced])
        assert untraced.sender.answered.wait(WAIT)
        assert _generator_parameters(recorder) == [{}], "an untraced request's call carries no parameter"
    finally:
        model.finalize()


def test_codegen_stream_passes_its_traceparent_on_the_generation_call_only(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(pb, "bls_handler", recorder)
    model = load_python_model("codegen_stream")
    try:
        request = _traced(pb.InferenceRequest({"text_input": np.array([[b"def f():"]], np.object_),
                                               "max_tokens": np.array([[2]], np.int32)}))
        model.execute([request])
        assert request.sender.answered.wait(WAIT)
    finally:
        model.finalize()
    first, *fetches = _generator_parameters(recorder)
    assert first == {"traceparent": TRACEPARENT} and all(p == {} for p in fetches)


def test_codegen_preprocess_makes_its_span_under_the_callers_traceparent():
    """What codegen_stream's preprocessing call carries instead of trace=: the span it turns into."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from stage_common.tracing import StageTracing

    model = load_python_model("codegen_preprocess")
    exporter = InMemorySpanExporter()
    model.tracing = StageTracing(None, "codegen_preprocess", exporter=exporter)
    try:
        traced = pb.InferenceRequest({"text_input": np.array([[b"def f():"]], np.object_)},
                                     parameters={"traceparent": TRACEPARENT})
        untraced = pb.InferenceRequest({"text_input": np.array([[b"x = 1"]], np.object_)})
        assert not any(r.has_error() for r in model.execute([traced, untraced]))
    finally:
        model.finalize()  # exports what is left
    (span,) = exporter.get_finished_spans()
    assert span.name == "codegen_preprocess.encode"
    assert format(span.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert format(span.parent.span_id, "016x") == TRACEPARENT.split("-")[2]
    assert span.attributes["codegen.batch_requests"] == 2
