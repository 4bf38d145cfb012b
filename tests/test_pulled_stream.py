"""Pulled streams (gptj_generator/pulled_stream.py): every call gets exactly one answer, nothing is lost
or repeated, fetches wait for the loop, an abandoned stream frees its row; and through the real engine
the fetched ids equal a pushed stream's."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gptj_generator.pulled_stream import PulledStream, PulledStreams
from gptj_generator.seam import GenerationRequest
from model_configs import load_python_model
from stage_common.errors import BadInput
from test_codegen_engine import ENGINES, make_engine


class Senders:
    """Records every (sender, chunk) delivered; each sender must be answered exactly once."""

    def __init__(self):
        self.delivered: list[tuple[str, object]] = []
        self.arrived = threading.Condition()

    def __call__(self, sender, chunk) -> None:
        with self.arrived:
            assert sender not in [s for s, _ in self.delivered], f"{sender} answered twice"
            self.delivered.append((sender, chunk))
            self.arrived.notify_all()

    def wait_for(self, sender: str, timeout: float = 120):
        with self.arrived:
            assert self.arrived.wait_for(lambda: sender in [s for s, _ in self.delivered], timeout)
            return next(c for s, c in self.delivered if s == sender)


def test_the_first_call_waits_for_the_first_chunk_then_fetches_take_everything_since():
    out = Senders()
    stream = PulledStream(out, "first")
    assert out.delivered == []  # nothing released yet: the generation request waits
    stream.send([1, 2])
    assert out.wait_for("first").token_ids == [1, 2]
    stream.send([3])
    stream.send([4, 5])  # no fetch waiting: both are kept
    stream.fetch("f1")
    chunk = out.wait_for("f1")
    assert (chunk.token_ids, chunk.completion_tokens, chunk.last) == ([3, 4, 5], 5, False)
    stream.fetch("f2")  # parked until the loop releases more
    assert [s for s, _ in out.delivered] == ["first", "f1"]
    stream.finish("length", [6])
    chunk = out.wait_for("f2")
    assert (chunk.token_ids, chunk.finish_reason, chunk.completion_tokens, chunk.last) == ([6], "length", 6, True)


def test_an_end_with_no_new_ids_is_still_delivered_and_nothing_after_the_last():
    out = Senders()
    stream = PulledStream(out, "first")
    stream.send([1])
    stream.fetch("f1")
    stream.finish("stop", [])
    assert out.wait_for("f1").finish_reason == "stop"
    stream.finish("cancelled", [])  # a late stop of a finished stream changes nothing
    assert len(out.delivered) == 2


def test_an_error_ends_the_stream_with_that_error():
    out = Senders()
    stream = PulledStream(out, "first")
    stream.fail(RuntimeError("sampling failed"))
    chunk = out.wait_for("first")
    assert chunk.last and str(chunk.error) == "sampling failed"


def test_a_second_fetch_while_one_waits_is_refused():
    stream = PulledStream(Senders(), "first")
    with pytest.raises(BadInput, match="one chunk at a time"):
        stream.fetch("f1")


def test_a_stream_nobody_fetches_is_cancelled_then_forgotten():
    now = [0.0]
    out = Senders()
    stream = PulledStream(out, "first", abandon_after_s=60, clock=lambda: now[0])
    stream.send([1])
    out.wait_for("first")
    assert not stream.cancelled()
    now[0] = 61.0
    assert stream.cancelled()  # the engine frees the row
    stream.finish("cancelled", [])
    assert stream.abandoned()
    streams = PulledStreams()
    streams._streams["old"] = stream
    streams.open("new", PulledStream(out, "n"))  # opening purges what nobody will fetch
    assert len(streams) == 1


def test_streams_by_key():
    out = Senders()
    streams = PulledStreams()
    with pytest.raises(BadInput, match="request_id"):
        streams.open("", PulledStream(out, "x"))
    stream = PulledStream(out, "first")
    streams.open("k", stream)
    with pytest.raises(BadInput, match="already names an open stream"):
        streams.open("k", PulledStream(out, "y"))
    with pytest.raises(BadInput, match="no open stream"):
        streams.fetch("other", "f0")
    stream.send([1])
    streams.fetch("k", "f1")  # waits
    stream.finish("length", [])
    assert out.wait_for("f1").last
    with pytest.raises(BadInput, match="no open stream"):  # delivered the last chunk: gone
        streams.fetch("k", "f2")


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    engine = make_engine(request.param, max_batch_size=4)
    yield engine
    engine.close()


def pull_all(engine, ids: list[int], max_tokens: int, key: str) -> tuple[list[int], str]:
    """A caller's loop: the generation request, then one fetch after each answer, to the last."""
    out = Senders()
    stream = PulledStream(out, "call-0")
    engine.submit(GenerationRequest(ids, max_tokens, key=key), stream)
    got, n = [], 0
    while True:
        chunk = out.wait_for(f"call-{n}")
        assert chunk.error is None
        got += chunk.token_ids
        if chunk.last:
            return got, chunk.finish_reason
        n += 1
        stream.fetch(f"call-{n}")


def test_through_the_engine_fetched_ids_equal_a_pushed_stream(engine):
    from test_codegen_engine import Collector

    prompts = [[11, 12, 13], [40, 41], [7]]
    pushed = [Collector() for _ in prompts]
    for ids, sink in zip(prompts, pushed):
        engine.submit(GenerationRequest(ids, 24), sink)
    results = {}
    threads = [threading.Thread(target=lambda i=i, ids=ids: results.__setitem__(i, pull_all(engine, ids, 24, f"k{i}")))
               for i, ids in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, sink in enumerate(pushed):
        sink.wait()
        assert results[i] == (sink.ids, sink.reason)


def _pull_inputs(ids: list[int], max_tokens: int) -> dict:
    return {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
            "request_output_len": np.array([[max_tokens]], np.int32), "pull": np.array([[True]])}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def test_through_the_model_bad_pulls_and_fetches_fail_alone_beside_a_good_pull():
    """codegen_generator's model.py: an unknown fetch and a pull without request_id, in the same
    execute as a good pull, get INVALID_ARGUMENT; the good one's calls are each answered once (final
    flag) and carry the same ids as a pushed stream of the same prompt."""
    import fake_pb_utils as pb
    from test_codegen_engine import Collector

    model = load_python_model("codegen_generator")
    try:
        prompt = [11, 12, 13]
        good = pb.InferenceRequest(_pull_inputs(prompt, 12), request_id="good")
        unknown = pb.InferenceRequest({"fetch": np.array([[True]])}, request_id="nobody")
        no_id = pb.InferenceRequest(_pull_inputs(prompt, 12))
        assert model.execute([unknown, no_id, good]) is None
        for bad, message in ((unknown, "no open stream has request_id 'nobody'"), (no_id, "needs a request_id")):
            ((response, flags),) = bad.sender.sent
            assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            assert response.error().code() == pb.TritonError.INVALID_ARG and message in response.error().message()
        ids, call = [], good
        while True:
            assert call.sender.answered.wait(120), "a pulled call was not answered"
            ((response, flags),) = call.sender.sent  # exactly one response per call
            assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL and not response.has_error()
            ids += response.output("output_ids").reshape(-1).tolist()
            reason = _text(response.output("finish_reason").reshape(-1)[0])
            if reason:
                break
            call = pb.InferenceRequest({"fetch": np.array([[True]])}, request_id="good")
            model.execute([call])
        assert int(response.output("completion_tokens").reshape(-1)[0]) == len(ids)
        pushed = Collector()
        model.engine.submit(GenerationRequest(prompt, 12), pushed)
        pushed.wait()
        assert ids == pushed.ids and reason == {"eos": "stop"}.get(pushed.reason, pushed.reason)
    finally:
        model.finalize()


def test_waiting_for_a_row_is_not_abandonment():
    """Issue 35, item 6: the abandon clock started at creation, so a stream that had waited longer than
    abandon_after_s for a row was 'cancelled' right after its first chunk. Only the time since the caller's
    last answer counts."""
    now = [0.0]
    out = Senders()
    stream = PulledStream(out, "first", abandon_after_s=2, clock=lambda: now[0])
    now[0] = 5.25  # the first call waited for a row all along
    assert not stream.cancelled()
    stream.send([1])
    out.wait_for("first")
    assert not stream.cancelled(), "cut off right after its first chunk"
    now[0] = 6.0
    stream.fetch("f1")
    now[0] = 60.0  # a fetch parked for long (the loop is slow) is a caller waiting too
    assert not stream.cancelled()
    stream.send([2])
    assert out.wait_for("f1").token_ids == [2]
    now[0] = 61.9
    assert not stream.cancelled()
    now[0] = 62.1  # 2 s since its last answer and no fetch: the caller is gone
    assert stream.cancelled()


@pytest.mark.parametrize("kind", ENGINES)
def test_through_the_engine_a_long_wait_for_a_row_still_gets_every_token(kind):
    """Issue 35, item 6 in-process: one row, a long request holding it, and a pulled stream behind it with
    its abandon time scaled down below its wait: every token arrives and the reason is 'length'."""
    engine = make_engine(kind, max_batch_size=1, max_tokens_limit=1000, cancel_poll_seconds=0)
    try:
        from test_codegen_engine import Collector

        holder = Collector()
        # 1,000 tokens (the demo model runs to max_tokens after these ids): a hold several times abandon_s, so
        # that the wait stays over abandon_s even when this thread wakes late after the first token (on a loaded
        # CI box, half as many tokens once left the wait just under the abandon time)
        engine.submit(GenerationRequest([11, 12, 13], 1000), holder)
        holder.wait_tokens(1)
        out = Senders()
        abandon_s = 0.3
        stream = PulledStream(out, "call-0", abandon_after_s=abandon_s)
        queued = time.monotonic()
        engine.submit(GenerationRequest([7], 16), stream)
        holder.wait()
        assert holder.reason == "length" and len(holder.ids) == 1000, "the holder ended early: it held no row"
        got, n, waited = [], 0, 0.0
        while True:
            chunk = out.wait_for(f"call-{n}")
            waited = waited or time.monotonic() - queued
            assert chunk.error is None
            got += chunk.token_ids
            if chunk.last:
                break
            n += 1
            time.sleep(abandon_s / 4)  # a caller's round trip between two fetches, well inside abandon_after_s
            stream.fetch(f"call-{n}")
        assert waited > abandon_s, "the stream did not wait for a row longer than abandon_after_s"

        assert chunk.finish_reason in ("length", "eos") and chunk.finish_reason != "cancelled"
        assert chunk.completion_tokens == len(got) and (len(got) == 16 or chunk.finish_reason == "eos")
    finally:
        engine.close()
