"""gateway/triton/coalesce.py: concurrent requests share calls only while every slot is busy, each gets its own
rows, a bad row fails its own request alone, other failures reach every request, cancels are safe."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateway.triton.coalesce import Coalescer
from gateway.errors import BadRequest, Unavailable


class FakeSend:
    """Rows are 2-d: [value, call number]. `gate` holds every call until set; 'bad' items fail a call."""

    def __init__(self):
        self.calls: list[list] = []
        self.gate = asyncio.Event()
        self.slow = asyncio.Event()  # holds calls with a "slow..." item even once the gate is open

    async def __call__(self, items):
        self.calls.append(list(items))
        number = len(self.calls)
        await self.gate.wait()
        if any(str(item).startswith("slow") for item in items):
            await self.slow.wait()
        if "bad" in items:
            raise BadRequest("a bad row", code="invalid_input")
        if "down" in items:
            raise Unavailable("server gone", code="server_unavailable")
        return np.array([[len(str(item)), number] for item in items], dtype=np.float32)


async def queued_behind_a_busy_slot(batches: list[list], max_rows: int = 8, max_pending: int = 256):
    """(send, coalescer, first, queued): one slot, held by a first request ["a"] until `send.gate` opens, and a
    request per batch queued behind it (none of them sent yet)."""
    send = FakeSend()
    coalescer = Coalescer(send, max_rows=max_rows, max_calls=1, max_pending=max_pending)
    first = asyncio.create_task(coalescer.run(["a"]))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(coalescer.run(items)) for items in batches]
    await asyncio.sleep(0)
    return send, coalescer, first, queued


def test_a_lone_request_goes_at_once_alone():
    async def scenario():
        send = FakeSend()
        send.gate.set()
        coalescer = Coalescer(send, max_rows=8, max_calls=2)
        rows = await coalescer.run(["abc"])
        return send.calls, rows

    calls, rows = asyncio.run(scenario())
    assert calls == [["abc"]] and rows.tolist() == [[3, 1]]


def test_requests_queued_behind_busy_slots_share_the_next_call_and_get_their_own_rows():
    async def scenario():
        send, coalescer, first, others = await queued_behind_a_busy_slot(
            [["bb"], ["ccc", "dddd"], ["eeeee"], ["ff"]], max_rows=4)
        assert len(send.calls) == 1  # nothing more is sent while the only slot is busy
        send.gate.set()
        results = [await first] + [await task for task in others]
        return send.calls, results, coalescer

    calls, results, coalescer = asyncio.run(scenario())
    # up to max_rows (4) rows per call, in arrival order; a request is never split
    assert calls == [["a"], ["bb", "ccc", "dddd", "eeeee"], ["ff"]]
    assert [r.tolist() for r in results] == [[[1, 1]], [[2, 2]], [[3, 2], [4, 2]], [[5, 2]], [[2, 3]]]
    assert (coalescer.sent_calls, coalescer.sent_requests, coalescer.calls) == (3, 5, 0)


def test_a_request_larger_than_max_rows_goes_alone():
    async def scenario():
        send, _, first, (big, small) = await queued_behind_a_busy_slot([["b", "c", "d"], ["e"]], max_rows=2)
        send.gate.set()
        return send.calls, [(await t).shape[0] for t in (first, big, small)]

    calls, sizes = asyncio.run(scenario())
    assert calls == [["a"], ["b", "c", "d"], ["e"]] and sizes == [1, 3, 1]


def test_a_bad_row_fails_its_own_request_alone():
    async def scenario():
        send, _, first, shared = await queued_behind_a_busy_slot([["ok1"], ["bad"], ["ok22"]])
        send.gate.set()
        return send.calls, await asyncio.gather(first, *shared, return_exceptions=True)

    calls, (first, ok1, bad, ok22) = asyncio.run(scenario())
    assert calls[1] == ["ok1", "bad", "ok22"]  # the shared call, refused ...
    assert sorted(map(tuple, calls[2:])) == [("bad",), ("ok1",), ("ok22",)]  # ... then each request alone
    assert first.tolist() == [[1, 1]] and ok1[0, 0] == 3 and ok22[0, 0] == 4
    assert isinstance(bad, BadRequest)


def test_a_server_failure_reaches_every_request_of_the_call_and_the_slot_is_freed():
    async def scenario():
        send, coalescer, first, shared = await queued_behind_a_busy_slot([["down"], ["x"]])
        send.gate.set()
        results = await asyncio.gather(first, *shared, return_exceptions=True)
        after = await coalescer.run(["later"])  # the failed call gave its slot back
        return send.calls, results, after

    calls, (first, down, x), after = asyncio.run(scenario())
    assert calls[1] == ["down", "x"] and len(calls) == 3  # no retry alone for a server failure
    assert isinstance(down, Unavailable) and isinstance(x, Unavailable)
    assert after.tolist() == [[5, 3]]


def test_a_cancelled_request_does_not_disturb_the_others():
    async def scenario():
        send, coalescer, first, (queued_then_gone, kept) = await queued_behind_a_busy_slot([["gone"], ["kept"]])
        queued_then_gone.cancel()  # the client went away while queued: its rows are not sent
        await asyncio.sleep(0)
        send.gate.set()
        results = await asyncio.gather(first, kept)
        send.gate.clear()
        in_flight_then_gone = asyncio.create_task(coalescer.run(["late"]))
        await asyncio.sleep(0.01)
        assert send.calls[-1] == ["late"] and coalescer.calls == 1  # a free slot: its own call, in its task
        in_flight_then_gone.cancel()  # gone while its own call runs: the call is cancelled, the slot freed
        with pytest.raises(asyncio.CancelledError):
            await in_flight_then_gone
        send.gate.set()
        await asyncio.sleep(0.01)
        return send.calls, results, coalescer

    calls, (first, kept), coalescer = asyncio.run(scenario())
    assert ["gone"] not in calls and calls[1] == ["kept"]
    assert first.tolist() == [[1, 1]] and kept.tolist() == [[4, 2]]
    assert coalescer.calls == 0 and not coalescer.pending and not coalescer.tasks


def test_a_full_queue_refuses_at_once_and_the_queued_requests_still_succeed():
    async def scenario():
        send, coalescer, first, queued = await queued_behind_a_busy_slot([["b", "c"], ["d"]], max_pending=3)
        with pytest.raises(Unavailable, match="over capacity") as refused:
            await coalescer.run(["e"])  # 3 rows wait already: a 4th is over max_pending, refused before any call
        send.gate.set()
        results = await asyncio.gather(first, *queued)
        after = await coalescer.run(["f", "g", "h"])  # the queue drained: accepted again
        return refused.value, results, after, coalescer, send.calls

    refused, results, after, coalescer, calls = asyncio.run(scenario())
    assert refused.code == "overloaded" and refused.status == 503
    assert [r.shape[0] for r in results] == [1, 2, 1] and after.shape[0] == 3
    assert ["e"] not in calls and coalescer.pending_rows == 0


def test_limits_are_checked():
    with pytest.raises(ValueError):
        Coalescer(FakeSend(), max_rows=0, max_calls=1)
    with pytest.raises(ValueError):
        Coalescer(FakeSend(), max_rows=1, max_calls=0)
    with pytest.raises(ValueError):
        Coalescer(FakeSend(), max_rows=1, max_calls=1, max_pending=0)


def test_a_request_gone_while_its_shared_call_runs_leaves_the_others_their_rows():
    async def scenario():
        send, coalescer, first, (gone, kept) = await queued_behind_a_busy_slot([["slow1"], ["slow22"]])
        send.gate.set()
        await first
        await asyncio.sleep(0.01)
        assert send.calls[-1] == ["slow1", "slow22"]  # the shared call, in flight, held
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        send.slow.set()
        return await kept, coalescer

    kept, coalescer = asyncio.run(scenario())
    assert kept.tolist() == [[6, 2]] and coalescer.calls == 0
