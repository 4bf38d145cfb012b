"""The shared adapter: typed parameters and per-request error isolation."""
from __future__ import annotations

import re

import numpy as np
import time

import pytest

import fake_pb_utils as pb
from stage_common.errors import BadInput, check_token_rows, decode_utf8
from stage_common.isolation import each_alone_on_failure
from stage_common.params import config_param, runtime_params
from stage_common.triton_io import execute_batched, text_rows

CONFIG = {"name": "m", "parameters": {"n": {"string_value": "7"}, "flag": {"string_value": "off"},
                                      "x": {"string_value": "0.5"}, "bad": {"string_value": "seven"}}}


def test_runtime_params_default_to_onnx_when_built_and_refuse_unknown_runtimes():
    assert runtime_params({"name": "m"}, onnx_built=True) == ("onnx", 1)
    assert runtime_params({"name": "m"}, onnx_built=False) == ("torch", 1)
    old = {"name": "m", "parameters": {"torch_threads": {"string_value": "2"}}}
    assert runtime_params(old, onnx_built=True) == ("onnx", 2)
    both = {"name": "m", "parameters": {"threads": {"string_value": "3"}, "torch_threads": {"string_value": "2"},
                                        "runtime": {"string_value": "torch"}}}
    assert runtime_params(both, onnx_built=True) == ("torch", 3)
    with pytest.raises(ValueError, match="'runtime' must be onnx or torch, not 'tensorrt'"):
        runtime_params({"name": "m", "parameters": {"runtime": {"string_value": "tensorrt"}}}, onnx_built=True)


def test_config_param_casts_and_defaults():
    assert config_param(CONFIG, "n", int) == 7
    assert config_param(CONFIG, "flag", bool) is False
    assert config_param(CONFIG, "x", float) == 0.5
    assert config_param(CONFIG, "missing", int, 3) == 3


def test_config_param_errors_name_the_model_and_parameter():
    with pytest.raises(ValueError, match="model 'm' needs parameter 'missing'"):
        config_param(CONFIG, "missing", int)
    with pytest.raises(ValueError, match="parameter 'bad'"):
        config_param(CONFIG, "bad", int)


def test_decode_utf8_reports_the_offending_byte():
    assert decode_utf8("é".encode()) == "é"
    with pytest.raises(BadInput, match=r"not valid UTF-8 \(byte 3"):
        decode_utf8(b"caf\xe9")


def test_execute_batched_isolates_parse_and_compute_failures():
    def request(*texts):
        return pb.InferenceRequest({"text": np.array([[t] for t in texts], dtype=object)})

    def compute(batch):
        return [ValueError("boom") if rows == ["explode"] else [r.upper() for r in rows] for rows in batch]

    responses = execute_batched(
        [request(b"a", b"b"), request(b"\xff"), request(b"explode"), request(b"c")],
        parse=lambda r: text_rows(r, "text"), compute=compute,
        respond=lambda _rows, out: [pb.Tensor("out", np.array(out, dtype=object))])
    assert list(responses[0].output("out")) == ["A", "B"] and list(responses[3].output("out")) == ["C"]
    assert responses[1].error().code() == pb.TritonError.INVALID_ARG
    internal = responses[2].error()
    assert internal.code() == pb.TritonError.INTERNAL
    assert "boom" not in internal.message() and "internal error (id " in internal.message(), "no internals leak"


def test_execute_batched_turns_a_crashing_batch_into_errors_not_a_crash():
    def compute(_batch):
        raise RuntimeError("out of memory")

    responses = execute_batched([object(), object()], parse=lambda r: r, compute=compute, respond=None)
    assert all(r.error().code() == pb.TritonError.INTERNAL for r in responses)
    assert all("internal error (id " in r.error().message() and "memory" not in r.error().message() for r in responses)


class _Iterator:
    """Stands in for a BLS ResponseIterator (weak-referenceable)."""


class _Request:
    def __init__(self, cancelled: bool):
        self.cancelled, self.asked = cancelled, 0

    def is_cancelled(self) -> bool:
        self.asked += 1
        return self.cancelled


def test_each_alone_on_failure_fails_only_the_item_that_breaks_the_shared_call():
    calls = []

    def compute(batch):
        calls.append(list(batch))
        if "poison" in batch:
            raise ValueError("cannot compute poison")
        return [item.upper() for item in batch]

    assert each_alone_on_failure(compute, ["a", "b"]) == ["A", "B"] and calls == [["a", "b"]]
    calls.clear()
    results = each_alone_on_failure(compute, ["a", "poison", "c"])
    assert results[0] == "A" and results[2] == "C" and isinstance(results[1], ValueError)
    assert calls == [["a", "poison", "c"], ["a"], ["poison"], ["c"]]
    with pytest.raises(ValueError):  # alone already: its own error, as it is
        each_alone_on_failure(compute, ["poison"])


def test_bls_iterators_are_dropped_only_after_the_stubs_round_trip():
    """A live request's is_cancelled() round trip comes after the stub's queued cleanups, so the last
    references go then (with the GIL); a cancelled request's answer may come from a cache, so its
    iterators wait for the next request's round trip."""
    import gc
    import weakref

    from stage_common.bls_iterators import IteratorRelease

    release = IteratorRelease()
    first, second = _Iterator(), _Iterator()
    refs = [weakref.ref(first), weakref.ref(second)]
    cancelled = _Request(cancelled=True)
    release.after_cleanup(cancelled, [first])
    del first
    gc.collect()
    assert cancelled.asked == 1 and refs[0]() is not None, "dropped without a confirmed round trip"
    live = _Request(cancelled=False)
    release.after_cleanup(live, [second])
    del second
    gc.collect()
    assert live.asked == 1 and refs[0]() is None and refs[1]() is None


def test_check_token_rows_refuses_what_would_break_a_shared_forward():
    ids, mask = np.array([[1, 2, 3], [4, 5, 0]]), np.array([[1, 1, 1], [1, 1, 0]])
    check_token_rows(ids, mask, 10, 3)  # fine
    check_token_rows(ids, mask, None, None)  # nothing known: only the shapes
    for bad_ids, bad_mask, vocab, positions, words in [
            (ids, mask[:, :2], 10, 3, "differ in shape"), (ids[0], mask[0], 10, 3, "[rows, tokens]"),
            (ids, np.array([[1, 1, 1], [0, 0, 0]]), 10, 3, "at least one token"),
            (ids, mask, 5, 3, "[0, 5)"), (-ids, mask, 10, 3, "[0, 10)"), (ids, mask, 10, 2, "3, over the limit of 2")]:
        with pytest.raises(BadInput, match=re.escape(words)):
            check_token_rows(bad_ids, bad_mask, vocab, positions)


def test_only_documented_finish_reasons_reach_a_client():
    """Issue 35, item 6: the generator's "cancelled" (a row it dropped) must not reach a codegen client as a
    finish_reason: the fronts fail such a request with a retryable error instead."""
    from stage_common.errors import Overloaded, check_finish_reason

    for reason in ("stop", "length"):
        check_finish_reason(reason)
    for reason in ("cancelled", ""):
        with pytest.raises(Overloaded, match="ended the request early"):
            check_finish_reason(reason)


def test_another_stages_error_reaches_the_client_as_that_stage_sent_it():
    """A BLS front passes on the error another stage answered (StageError) with its message and code; a
    fault of its own stays INTERNAL with an id only."""
    from stage_common.errors import StageError
    from stage_common.triton_io import error_response

    refused = pb.TritonError("max_tokens must be between 1 and 512, got 900", pb.TritonError.INVALID_ARG)
    error = error_response(StageError(refused)).error()
    assert (error.message(), error.code()) == (refused.message(), pb.TritonError.INVALID_ARG)
    own = error_response(RuntimeError("a secret detail")).error()
    assert own.code() == pb.TritonError.INTERNAL and "secret" not in own.message()


def test_bounded_workers_report_each_count_of_requests_in_flight():
    """Issue 35, item 5: the fronts publish this count; the supervisor retires an old stub only at 0."""
    import threading

    from stage_common.bounded_workers import BoundedWorkers

    seen, release = [], threading.Event()
    workers = BoundedWorkers(2, "t", on_change=seen.append)
    workers.submit(release.wait)
    workers.submit(release.wait)
    assert workers.busy == 2
    release.set()
    deadline = time.monotonic() + 30
    while workers.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen[:2] == [1, 2] and seen[-1] == 0 and workers.busy == 0
    workers.shutdown()
