"""What the codegen fronts pass as `trace=` to their BLS calls: codegen_stream's unary preprocessing call
carries the request's trace (`request.trace()`), so Triton traces it in the request's trace (a BLS call
without it is never traced); decoupled calls into the generator carry none, because a decoupled BLS call
given a trace crashes Triton 2.51 in OpenTelemetry mode (docs/observability.md, tests/test_tracing_server.py):
they carry the request's W3C traceparent as a request parameter instead."""
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


def test_codegen_stream_traces_its_preprocessing_and_not_its_decoupled_generator_calls(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(pb, "bls_handler", recorder)
    model = load_python_model("codegen_stream")
    try:
        request = pb.InferenceRequest({"text_input": np.array([[b"def f():"]], np.object_),
                                       "max_tokens": np.array([[2]], np.int32)})
        model.execute([request])
        assert request.sender.answered.wait(WAIT)
        assert not any(response is not None and response.has_error() for response, _ in request.sender.sent)
    finally:
        model.finalize()
    (preprocess, *generator) = [call for call in recorder.calls if "probe" not in call[3]]
    assert preprocess[0] == "codegen_preprocess" and preprocess[2] is request.trace()
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
