"""What the codegen fronts read of the supervisor's state (issue 48): a generator being healed is not called."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import fake_pb_utils as pb
from model_configs import load_python_model
from stage_common.supervisor_view import STATE_VARIABLE, SupervisorView
from supervisor.state import STATE_FILE_VARIABLE, write_state


def test_the_view_follows_each_publication_and_ignores_a_stale_or_missing_one(tmp_path):
    path = tmp_path / "supervisor.json"
    view = SupervisorView(path)
    assert not view.healing("codegen_generator"), "nothing published yet"
    write_state(path, {"codegen_generator": "stub process 1 died"})
    assert view.healing("codegen_generator") and not view.healing("codegen_collect")
    write_state(path, {})
    assert not view.healing("codegen_generator"), "healed: the next publication clears it"
    write_state(path, {"codegen_generator": "hung"})
    assert not SupervisorView(path, stale_s=0.0).healing("codegen_generator"), "a stale listing is ignored"
    path.write_text("{not json")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not SupervisorView(path).healing("codegen_generator")
    assert not SupervisorView(None).healing("codegen_generator")


def test_the_fronts_and_the_launcher_name_the_same_variable():
    assert STATE_VARIABLE == STATE_FILE_VARIABLE


@pytest.fixture
def collect_with_state(tmp_path, monkeypatch):
    path = tmp_path / "supervisor.json"
    monkeypatch.setenv(STATE_VARIABLE, str(path))
    model = load_python_model("codegen_collect")
    yield model, path
    model.finalize()


def _request():
    return pb.InferenceRequest({"input_ids": np.array([[11, 12]], np.int32), "input_lengths": np.array([[2]], np.int32),
                                "generation_params": np.array([[b'{"max_tokens": 2}']], np.object_)})


def _generator(calls: list):
    def answer(request, decoupled):
        calls.append(request)
        return iter([pb.InferenceResponse([]), pb.InferenceResponse([
            pb.Tensor("output_ids", np.array([[5]], np.int32)),
            pb.Tensor("finish_reason", np.array([[b"length"]], np.object_)),
            pb.Tensor("completion_tokens", np.array([[1]], np.int32))])])
    return answer


def test_collect_never_calls_a_generator_the_supervisor_is_healing_and_refuses_if_the_heal_takes_too_long(
        collect_with_state, monkeypatch):
    model, path = collect_with_state
    calls = []
    monkeypatch.setattr(pb, "bls_handler", _generator(calls))
    model.generator.first_timeout_s = 0.3
    write_state(path, {"codegen_generator": "stub process 7 of 'codegen_generator_0_0' died"})
    request = _request()
    model.execute([request])
    assert request.sender.answered.wait(60)
    ((response, _),) = request.sender.sent
    assert response.error().code() == pb.TritonError.UNAVAILABLE and "being restarted" in response.error().message()
    assert calls == [], "a call into the dead stub would hold a Triton thread for good"


def test_a_request_that_comes_during_the_heal_waits_for_it_and_is_served(collect_with_state, monkeypatch):
    model, path = collect_with_state
    calls = []
    monkeypatch.setattr(pb, "bls_handler", _generator(calls))
    write_state(path, {"codegen_generator": "stub process 7 of 'codegen_generator_0_0' died"})
    request = _request()
    model.execute([request])
    time.sleep(0.5)
    assert calls == [] and not request.sender.answered.is_set(), "held while the generator is healed"
    write_state(path, {})  # healed
    assert request.sender.answered.wait(60)
    ((response, _),) = request.sender.sent
    assert not response.has_error() and response.output("output_ids").tolist() == [[5]] and len(calls) == 1
