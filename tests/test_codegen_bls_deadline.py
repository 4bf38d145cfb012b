"""Every BLS call of the codegen fronts has a deadline, and a call its generator lost fails at once
(issue 35, item 3): stage_common/bls_deadline.py, the generator's probe=true, and codegen_collect's model.py
against a fake generator whose stub 'died' (its calls never answered, its probes answered by a new stub)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import fake_pb_utils as pb
from codegen_common.generation_params import GenerationParams
from model_configs import load_python_model
from stage_common.bls_deadline import CallLost, CallTimedOut, call_with_deadline
from stage_common.errors import Overloaded

WAIT = 60


def test_an_answer_or_its_error_comes_back_as_it_is():
    assert call_with_deadline(lambda: 42, "callee", 5) == 42
    with pytest.raises(KeyError):
        call_with_deadline(lambda: {}["x"], "callee", 5)


def test_a_call_never_answered_times_out_as_an_overload():
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(CallTimedOut, match="callee gave no answer in 0.3 s") as info:
        call_with_deadline(never.wait, "callee", 0.3)
    assert isinstance(info.value, Overloaded) and time.monotonic() - started < WAIT
    never.set()


def test_a_call_the_callee_no_longer_holds_fails_long_before_its_deadline():
    never, probes = threading.Event(), []
    started = time.monotonic()
    with pytest.raises(CallLost, match="lost the request"):
        call_with_deadline(never.wait, "callee", 600, probe=lambda: probes.append(1) or False, probe_every_s=0.05,
                           grace_s=0.05)
    assert time.monotonic() - started < WAIT and probes == [1]
    never.set()


def test_a_slow_call_the_callee_still_holds_is_waited_for_and_an_answer_in_the_grace_period_counts():
    def slow():
        time.sleep(0.5)
        return "done"

    probes = []
    assert call_with_deadline(slow, "callee", 30, probe=lambda: probes.append(1) or True, probe_every_s=0.05) == "done"
    assert len(probes) >= 2, "it kept asking while it waited"
    # the callee forgot the call because it just answered it: the answer on its way is taken
    assert call_with_deadline(slow, "callee", 30, probe=lambda: False, probe_every_s=0.2, grace_s=5) == "done"


# ---- the generator answers probes -----------------------------------------------------------------

def _pull(ids: list[int], max_tokens: int, key: str):
    return pb.InferenceRequest({"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
                                "request_output_len": np.array([[max_tokens]], np.int32), "pull": np.array([[True]])},
                               request_id=key)


def _probe(key: str):
    return pb.InferenceRequest({"probe": np.array([[True]])}, request_id=key)


def test_the_generator_answers_a_probe_for_a_request_it_holds_and_refuses_one_for_any_other():
    model = load_python_model("codegen_generator")
    try:
        held, known, unknown = _pull([11, 12], 400, "held"), _probe("held"), _probe("other")
        model.execute([held, known, unknown])
        assert known.sender.answered.wait(WAIT)
        assert known.sender.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)], "alive: an empty final answer"
        ((response, _),) = unknown.sender.sent
        assert response.error().code() == pb.TritonError.INVALID_ARG
        assert "no request in flight has request_id 'other'" in response.error().message()
        stop = pb.InferenceRequest({"stop": np.array([[True]])}, request_id="held")
        model.execute([stop])
    finally:
        model.finalize()


def test_the_generator_refuses_out_of_vocabulary_ids_alone_beside_good_requests():
    """Issue 35, item 1 through the model: INVALID_ARGUMENT for the bad request, the others are served."""
    model = load_python_model("codegen_generator")
    try:
        good = [_pull([11, 12, 13], 8, f"good{i}") for i in range(4)]
        bad = [_pull([11, 999_999], 8, "bad-high"), _pull([-1], 8, "bad-negative")]
        model.execute(good[:2] + bad + good[2:])
        for request in bad:
            ((response, flags),) = request.sender.sent
            assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            assert response.error().code() == pb.TritonError.INVALID_ARG
            assert "must lie in [0, " in response.error().message()
        for request in good:
            assert request.sender.answered.wait(WAIT)
            ((response, _),) = request.sender.sent
            assert not response.has_error()
        assert model.engine.restarts == 0, "the decode loop died"
    finally:
        model.finalize()


# ---- codegen_collect against a generator whose stub died ------------------------------------------

class FakeGenerator:
    """Generation calls are never answered (they were in flight on a stub that died); probes are answered
    by the stub a heal started, which does not know them, or (alive=True) by the stub that holds them."""

    def __init__(self, alive: bool = False):
        self.alive, self.calls, self.probes = alive, [], []
        self.release = threading.Event()

    def __call__(self, request, decoupled):
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        if "probe" in inputs:
            self.probes.append(request.request_id())
            if self.alive:
                return iter([])
            return iter([pb.InferenceResponse(error=pb.TritonError(
                f"no request in flight has request_id '{request.request_id()}'", pb.TritonError.INVALID_ARG))])
        self.calls.append(request.request_id())
        self.release.wait()
        ids = inputs["input_ids"].reshape(-1)
        return iter([pb.InferenceResponse([
            pb.Tensor("output_ids", np.array([[5, 6]], np.int32)),
            pb.Tensor("finish_reason", np.array([[b"length"]], np.object_)),
            pb.Tensor("completion_tokens", np.array([[2]], np.int32))])]) if len(ids) else iter([])


def _collect_request(rows: int = 2):
    params = GenerationParams(max_tokens=2).to_json().encode()
    return pb.InferenceRequest({"input_ids": np.array([[11, 12, 13]] * rows, np.int32),
                                "input_lengths": np.array([[3]] * rows, np.int32),
                                "generation_params": np.array([[params]] * rows, np.object_)})


@pytest.fixture
def collect(monkeypatch):
    model = load_python_model("codegen_collect")
    model.generator.probe_every_s = 0.1  # the config's 2 s, scaled down
    yield model
    model.finalize()


def test_a_collect_row_lost_with_its_generator_fails_at_once_and_frees_its_worker(collect, monkeypatch):
    generator = FakeGenerator()
    monkeypatch.setattr(pb, "bls_handler", generator)
    requests = [_collect_request() for _ in range(3)]
    started = time.monotonic()
    collect.execute(requests)
    for request in requests:
        assert request.sender.answered.wait(WAIT), "a request waited for a generator that died"
        ((response, _),) = request.sender.sent
        assert response.error().code() == pb.TritonError.UNAVAILABLE
        assert "lost the request" in response.error().message()
    assert time.monotonic() - started < WAIT and collect.generator.timeout_s == 600, "failed by probe, not deadline"
    deadline = time.monotonic() + WAIT
    while collect.workers._busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert collect.workers._busy == 0, "the lost calls still hold the front's workers"
    generator.release.set()


def test_a_slow_collect_row_the_generator_holds_is_answered(collect, monkeypatch):
    generator = FakeGenerator(alive=True)
    monkeypatch.setattr(pb, "bls_handler", generator)
    request = _collect_request(rows=1)
    collect.execute([request])
    time.sleep(0.5)
    assert not request.sender.answered.is_set() and generator.probes, "probed while it waited"
    generator.release.set()
    assert request.sender.answered.wait(WAIT)
    ((response, _),) = request.sender.sent
    assert not response.has_error() and response.output("output_ids").tolist() == [[5, 6]]
    assert response.output("finish_reason").reshape(-1)[0] == b"length"


def test_a_row_the_generator_refuses_fails_with_the_generators_own_error(collect, monkeypatch):
    refusal = pb.TritonError("the prompt has 3 tokens, but with max_tokens=2 ...", pb.TritonError.INVALID_ARG)
    monkeypatch.setattr(pb, "bls_handler", lambda request, decoupled: iter([pb.InferenceResponse(error=refusal)]))
    request = _collect_request(rows=2)
    collect.execute([request])
    assert request.sender.answered.wait(WAIT)
    ((response, _),) = request.sender.sent
    assert (response.error().message(), response.error().code()) == (refusal.message(), pb.TritonError.INVALID_ARG)


def test_a_collect_row_past_its_deadline_fails_with_unavailable(collect, monkeypatch):
    generator = FakeGenerator(alive=True)  # alive but never answering: a hang
    monkeypatch.setattr(pb, "bls_handler", generator)
    collect.generator.timeout_s = 0.5
    request = _collect_request(rows=1)
    collect.execute([request])
    assert request.sender.answered.wait(WAIT)
    ((response, _),) = request.sender.sent
    assert response.error().code() == pb.TritonError.UNAVAILABLE and "no answer in 0.5 s" in response.error().message()
    generator.release.set()


def test_a_generator_whose_stub_died_fails_the_row_with_unavailable_not_an_internal_error(collect, monkeypatch):
    """Triton's own answer for a call into a dead stub (before the supervisor's reload) is INTERNAL: the client
    gets UNAVAILABLE, the generator is being restarted (issue 48)."""
    dead = pb.TritonError("Failed to process the request(s) for model instance 'codegen_generator_0_0', message: "
                          "Stub process 'codegen_generator_0_0' is not healthy.", pb.TritonError.INTERNAL)
    monkeypatch.setattr(pb, "bls_handler", lambda request, decoupled: iter([pb.InferenceResponse(error=dead)]))
    request = _collect_request(rows=1)
    collect.execute([request])
    assert request.sender.answered.wait(WAIT)
    ((response, _),) = request.sender.sent
    assert response.error().code() == pb.TritonError.UNAVAILABLE and "being restarted" in response.error().message()


def test_the_calls_lost_with_a_dead_generator_count_as_stuck_until_they_return(collect, monkeypatch):
    """Each still holds a thread of the front's Triton-side pool: the supervisor replaces a front that has any."""
    generator = FakeGenerator()
    monkeypatch.setattr(pb, "bls_handler", generator)
    requests = [_collect_request(rows=1) for _ in range(3)]
    collect.execute(requests)
    assert all(request.sender.answered.wait(WAIT) for request in requests)
    assert collect.generator.stuck.count == 3
    generator.release.set()
    deadline = time.monotonic() + WAIT
    while collect.generator.stuck.count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert collect.generator.stuck.count == 0
