"""Every BLS call of the codegen fronts has a deadline, and a call its generator lost fails at once
(issue 35, item 3): stage_common/bls_deadline.py, the generator's probe=true, and codegen_collect's model.py
against a fake generator whose stub 'died' (its calls never answered, its probes answered by a new stub)."""
from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

import fake_pb_utils as pb
from codegen_common.generation_params import GenerationParams
from model_configs import load_python_model
from stage_common.bls_deadline import CallLost, CallTimedOut, RequestDeadline, call_with_deadline, request_deadline_s
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


def _answer(collect, monkeypatch, generator, request=None, **client_settings):
    """codegen_collect's one response to `request` (one row) against `generator`, its client set as given."""
    monkeypatch.setattr(pb, "bls_handler", generator)
    for name, value in client_settings.items():
        setattr(collect.generator, name, value)
    request = request or _collect_request(rows=1)
    collect.execute([request])
    assert request.sender.answered.wait(WAIT)
    ((response, _),) = request.sender.sent
    return response


def test_a_collect_row_past_its_deadline_fails_with_unavailable(collect, monkeypatch):
    generator = FakeGenerator(alive=True)  # alive but never answering: a hang
    response = _answer(collect, monkeypatch, generator, timeout_s=0.5)
    # what is left of the 0.5 s when the call starts: 0.5, or 0.49 on a busy box
    assert response.error().code() == pb.TritonError.UNAVAILABLE and \
        re.search(r"no answer in 0\.(5|4\d) s", response.error().message()), response.error().message()
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


# ---- issue 48: the generator acknowledges a call at once; the request's own timeout bounds the wait ----------

def test_a_call_not_acknowledged_in_time_fails_within_seconds_not_at_its_deadline():
    never, first = threading.Event(), threading.Event()
    started = time.monotonic()
    with pytest.raises(CallTimedOut, match="did not take the request") as info:
        call_with_deadline(never.wait, "callee", 600, probe=lambda: True, probe_every_s=0.05, first=first,
                           first_deadline_s=0.3)
    assert isinstance(info.value, Overloaded) and time.monotonic() - started < WAIT
    never.set()


def test_an_acknowledged_call_is_waited_for_past_the_acknowledgement_deadline():
    first = threading.Event()

    def acknowledged_then_slow():
        first.set()
        time.sleep(0.6)
        return "done"

    assert call_with_deadline(acknowledged_then_slow, "callee", 30, probe=lambda: True, probe_every_s=0.05,
                              first=first, first_deadline_s=0.2) == "done"


def test_a_request_deadline_is_the_clients_timeout_when_shorter_than_the_fronts_longest_wait():
    assert request_deadline_s(0, 600) == 600  # no client timeout
    assert request_deadline_s(2_500_000, 600) == 2.5
    assert request_deadline_s(900_000_000, 600) == 600
    deadline = RequestDeadline(300_000, 600)
    assert 0 < deadline.left_s() <= 0.3


def test_the_generator_acknowledges_a_generation_and_a_fetch_it_was_asked_to_at_once():
    model = load_python_model("codegen_generator")
    ack = {"ack": np.array([[True]])}
    try:
        first = _pull([11, 12], 3, "acked")
        first._inputs.update({k: pb.Tensor(k, v) for k, v in ack.items()})
        model.execute([first])
        assert first.sender.answered.wait(WAIT)
        (ack_response, ack_flags), (chunk, chunk_flags) = first.sender.sent
        assert ack_flags == 0 and not ack_response.has_error() and ack_response.output_tensors() == []
        assert chunk_flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL and chunk.output("output_ids").size
        fetch = pb.InferenceRequest({"fetch": np.array([[True]]), **ack}, request_id="acked")
        model.execute([fetch])
        assert fetch.sender.answered.wait(WAIT)
        assert fetch.sender.sent[0][1] == 0 and fetch.sender.sent[0][0].output_tensors() == []
        unasked = _pull([11, 12], 2, "plain")
        model.execute([unasked])
        assert unasked.sender.answered.wait(WAIT)
        assert all(response.output_tensors() for response, _ in unasked.sender.sent), "no ack unless asked"
    finally:
        model.finalize()


class AcknowledgingGenerator(FakeGenerator):
    """Acknowledges each generation call at once (its first response), then answers (or never does, if its
    stub died: `release` unset) on its own: the front's wait no longer blocks in exec."""

    def __call__(self, request, decoupled):
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        if "probe" in inputs:
            return super().__call__(request, decoupled)
        assert inputs.get("ack") is not None and inputs["ack"].reshape(-1)[0], "the front asks for the ack"
        self.calls.append(request.request_id())
        release = self.release

        def responses():
            yield pb.InferenceResponse([])
            release.wait()
            yield pb.InferenceResponse([pb.Tensor("output_ids", np.array([[5, 6]], np.int32)),
                                        pb.Tensor("finish_reason", np.array([[b"length"]], np.object_)),
                                        pb.Tensor("completion_tokens", np.array([[2]], np.int32))])
        return responses()


def test_a_collect_row_reads_past_the_generators_acknowledgement(collect, monkeypatch):
    generator = AcknowledgingGenerator(alive=True)
    monkeypatch.setattr(pb, "bls_handler", generator)
    collect.generator.first_timeout_s = 0.2
    request = _collect_request(rows=2)
    collect.execute([request])
    time.sleep(0.5)  # past the acknowledgement's deadline: acknowledged, so still waited for
    assert not request.sender.answered.is_set()
    generator.release.set()
    assert request.sender.answered.wait(WAIT)
    ((response, _),) = request.sender.sent
    assert not response.has_error() and response.output("output_ids").tolist() == [[5, 6], [5, 6]]


def test_a_collect_row_the_generator_never_acknowledges_fails_within_the_acknowledgement_deadline(collect, monkeypatch):
    generator = FakeGenerator(alive=True)  # holds the call (probes say so) but never answers it: no ack either
    response = _answer(collect, monkeypatch, generator, first_timeout_s=0.3)
    assert response.error().code() == pb.TritonError.UNAVAILABLE
    assert "did not take the request" in response.error().message()
    generator.release.set()


def test_a_collect_row_waits_no_longer_than_its_clients_timeout(collect, monkeypatch):
    generator = AcknowledgingGenerator(alive=True)  # acknowledged, then slow
    request = _collect_request(rows=1)
    request._timeout = 400_000  # the client's own timeout: 0.4 s (generator_timeout_s stays 600)
    started = time.monotonic()
    response = _answer(collect, monkeypatch, generator, request)
    assert response.error().code() == pb.TritonError.UNAVAILABLE and "no answer in 0.4 s" in response.error().message()
    assert time.monotonic() - started < WAIT and collect.generator.timeout_s == 600
    generator.release.set()


@pytest.mark.parametrize("lengths", [[0], [4], [3, 3]])
def test_collect_refuses_rows_that_do_not_agree_itself_before_any_generator_call(collect, monkeypatch, lengths):
    calls = []
    monkeypatch.setattr(pb, "bls_handler", lambda request, decoupled: calls.append(request) or iter([]))
    request = _collect_request(rows=1)
    request._inputs["input_lengths"] = pb.Tensor("input_lengths", np.array([[n] for n in lengths], np.int32))
    collect.execute([request])
    assert request.sender.answered.wait(WAIT)
    ((response, _),) = request.sender.sent
    assert response.error().code() == pb.TritonError.INVALID_ARG and calls == []


def test_acknowledged_calls_lost_with_a_dead_generator_hold_no_triton_thread_so_are_not_counted_stuck(collect,
                                                                                                    monkeypatch):
    """Triton's pool thread waits only for a call's first response: after the ack, a lost call keeps just its
    own thread in the stub, which the supervisor's replacement rule need not count (issue 48)."""
    generator = AcknowledgingGenerator()  # acknowledges, then its stub "dies": probes say the call is lost
    monkeypatch.setattr(pb, "bls_handler", generator)
    requests = [_collect_request(rows=1) for _ in range(3)]
    collect.execute(requests)
    for request in requests:
        assert request.sender.answered.wait(WAIT)
        ((response, _),) = request.sender.sent
        assert response.error().code() == pb.TritonError.UNAVAILABLE and "lost the request" in response.error().message()
    assert collect.generator.stuck.count == 0
    generator.release.set()


def test_a_call_never_acknowledged_that_the_callee_does_not_hold_fails_without_the_grace_period():
    """Nothing of a call the callee never took can be on its way (a call sent to a stub that had just died)."""
    never, first, probes = threading.Event(), threading.Event(), []
    started = time.monotonic()
    with pytest.raises(CallLost, match="lost the request"):
        call_with_deadline(never.wait, "callee", 600, probe=lambda: probes.append(time.monotonic()) or False,
                           probe_every_s=30, grace_s=30, first=first, first_deadline_s=60, first_probe_every_s=0.1)
    assert time.monotonic() - started < 15, "probed soon and failed without the 30 s grace"
    never.set()


@pytest.mark.parametrize("params", [b"{", b"[]", b'{"max_tokens": "2"}', b'{"unknown": 1}', b'{"stop": "x"}',
                                    b'{"temperature": NaN}', b"\xff"])
def test_collect_refuses_hand_made_generation_params_alone_and_serves_its_batch_mates(collect, monkeypatch, params):
    """codegen_collect can be called directly: a generation_params row that is not the stages' JSON is the
    caller's fault (INVALID_ARGUMENT, before any generator call), and the requests beside it are served."""
    generator = AcknowledgingGenerator(alive=True)
    generator.release.set()
    monkeypatch.setattr(pb, "bls_handler", generator)
    bad, rows_bad, good = _collect_request(rows=1), _collect_request(rows=1), _collect_request(rows=1)
    bad._inputs["generation_params"] = pb.Tensor("generation_params", np.array([[params]], np.object_))
    rows_bad._inputs["input_lengths"] = pb.Tensor("input_lengths", np.array([[0]], np.int32))
    collect.execute([bad, rows_bad, good])
    for request in (bad, rows_bad, good):
        assert request.sender.answered.wait(WAIT)
    for request in (bad, rows_bad):
        ((response, _),) = request.sender.sent
        assert response.error().code() == pb.TritonError.INVALID_ARG
    ((response, _),) = good.sender.sent
    assert not response.has_error() and response.output("output_ids").tolist() == [[5, 6]]
    assert len(generator.calls) == 1, "only the good request reached the generator"


def test_a_call_its_callee_has_not_seen_yet_is_not_lost_while_young():
    """Before its first answer a call may still be on its way to the callee (a later probe can overtake it under
    CPU pressure): a "no" then fails it only once it is unseen_after_s old."""
    first = threading.Event()

    def slow_to_arrive():
        time.sleep(0.4)
        first.set()
        return "done"
    probes = []
    assert call_with_deadline(slow_to_arrive, "callee", 30, probe=lambda: probes.append(1) or False,
                              first=first, first_deadline_s=10, first_probe_every_s=0.05, unseen_after_s=2) == "done"
    assert len(probes) >= 3, "it was asked, and its no did not count"
    never, started = threading.Event(), time.monotonic()
    with pytest.raises(CallLost):
        call_with_deadline(never.wait, "callee", 600, probe=lambda: False, first=threading.Event(),
                           first_deadline_s=60, first_probe_every_s=0.05, unseen_after_s=0.5)
    assert 0.5 <= time.monotonic() - started < WAIT, "lost at unseen_after_s, not before, not at the deadline"
