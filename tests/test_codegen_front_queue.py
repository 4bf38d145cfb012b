"""codegen_stream's front (issue 55): requests past its threads wait in its bounded line instead of being refused;
one whose client left while it waited starts nothing (a bare final flag), one whose deadline passed while it
waited is answered UNAVAILABLE, and neither makes a BLS call."""
from __future__ import annotations

import threading

import numpy as np

import fake_pb_utils as pb
from model_configs import load_python_model
from stage_common.bounded_workers import BoundedWorkers

WAIT = 60


def _request(timeout_us: int = 0):
    return pb.InferenceRequest({"text_input": np.array([[b"def f():"]], np.object_),
                                "max_tokens": np.array([[2]], np.int32)}, timeout=timeout_us)


def test_waiting_requests_that_were_cancelled_or_expired_start_nothing(monkeypatch):
    gate, calls = threading.Event(), []

    def handler(request, decoupled):
        calls.append(request)
        gate.wait(WAIT)
        raise pb.TritonError("the first request's preprocessing fails once let go")

    monkeypatch.setattr(pb, "bls_handler", handler)
    model = load_python_model("codegen_stream")
    model.workers.shutdown()
    model.workers = BoundedWorkers(1, "test", queue=2)  # one thread: the others wait
    try:
        running, cancelled, expired = _request(), _request(), _request(timeout_us=1)
        model.execute([running, cancelled, expired])
        for _ in range(WAIT * 100):  # the first one holds the only thread
            if calls:
                break
            threading.Event().wait(0.01)
        cancelled.cancelled = True
        gate.set()
        assert all(r.sender.answered.wait(WAIT) for r in (running, cancelled, expired))
    finally:
        model.finalize()
    assert len(calls) == 1, "only the request that ran made a BLS call"
    assert cancelled.sender.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    (response, _flags), = expired.sender.sent
    assert response.has_error() and "deadline passed while it waited" in response.error().message()
