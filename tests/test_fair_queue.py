"""gateway/triton/fair_queue.py and fair_slots.py (issues 55 and 56): the queue's bounds refuse exactly past
their limit, owners are served round-robin, a waiting request leaves the queue when it is cancelled or its wait
passes its limit, and /v1/completions' sequences wait for a slot instead of being refused."""
from __future__ import annotations

import asyncio
import time

import pytest

from gateway.errors import Unavailable
from gateway.triton.fair_queue import FairQueue, QueueFull
from gateway.triton.fair_slots import FairSlots, SlotEngine


def test_the_queue_takes_exactly_its_limit_and_refuses_the_next_unit():
    queue = FairQueue(limit=5)
    for i in range(5):
        queue.put(f"owner{i % 2}", i)
    with pytest.raises(QueueFull) as full:
        queue.put("someone else", 5)
    assert full.value.whole and (full.value.waiting, full.value.bound) == (5, 5)
    assert (len(queue), queue.size) == (5, 5)
    queue.pop()
    queue.put("someone else", 5)  # one unit free again: taken


def test_an_owner_is_refused_past_its_share_while_others_still_fit():
    queue = FairQueue(limit=10, share=4)
    queue.put("heavy", "a", size=3)
    queue.put("heavy", "b", size=1)
    with pytest.raises(QueueFull) as full:
        queue.put("heavy", "c", size=1)
    assert not full.value.whole and (full.value.waiting, full.value.bound) == (4, 4)
    queue.put("light", "d", size=4)  # another owner's share is its own
    assert queue.held == {"heavy": 4, "light": 4} and queue.size == 8


def test_owners_are_served_round_robin_and_each_in_its_own_order():
    queue = FairQueue(limit=100)
    for i in range(6):
        queue.put("heavy", f"h{i}")
    queue.put("light", "l0")
    queue.put("light", "l1")
    queue.put("third", "t0")
    order = [queue.pop()[1] for _ in range(len(queue))]
    # the light key's first request waits behind one of the heavy key's, not behind its six
    assert order == ["h0", "l0", "t0", "h1", "l1", "h2", "h3", "h4", "h5"]
    assert queue.size == 0 and queue.held == {} and queue.peek() is None


def test_a_removed_item_gives_its_units_back():
    queue = FairQueue(limit=4, share=4)
    item = object()
    queue.put("a", item, size=3)
    assert queue.remove("a", item) and not queue.remove("a", item)
    assert (queue.size, queue.held, len(queue)) == (0, {}, 0)
    queue.put("a", "x", size=4)


def test_slots_refuse_exactly_past_the_queue_with_retry_after():
    async def scenario():
        slots = FairSlots(slots=2, limit=3, share=None, timeout_s=60)
        await slots.acquire("a")
        await slots.acquire("a")  # both slots held
        waiters = [asyncio.create_task(slots.acquire(owner)) for owner in ("a", "b", "c")]
        await asyncio.sleep(0)
        assert slots.waiting == 3
        with pytest.raises(Unavailable) as refused:
            await slots.acquire("d")
        slots.release()
        slots.release()
        slots.release()
        await asyncio.gather(*waiters)
        return slots, refused.value

    slots, refused = asyncio.run(scenario())
    assert refused.status == 503 and refused.headers()["Retry-After"] and refused.code == "overloaded"
    assert "COMPLETIONS_QUEUE=3" in refused.message
    assert (slots.busy, slots.waiting) == (2, 0)


def test_slots_go_round_robin_to_the_waiting_owners():
    async def scenario():
        slots = FairSlots(slots=1, limit=100, share=None, timeout_s=60)
        await slots.acquire("heavy")
        granted: list[str] = []

        async def one(owner: str, name: str):
            await slots.acquire(owner)
            granted.append(name)

        tasks = [asyncio.create_task(one("heavy", f"h{i}")) for i in range(4)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(one("light", "l0")))
        await asyncio.sleep(0)
        for _ in range(5):
            slots.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return granted

    assert asyncio.run(scenario()) == ["h0", "l0", "h1", "h2", "h3"]


def test_a_waiter_past_its_deadline_or_cancelled_leaves_the_queue():
    async def scenario():
        slots = FairSlots(slots=1, limit=10, share=None, timeout_s=0.05)
        await slots.acquire("a")
        with pytest.raises(Unavailable) as late:
            await slots.acquire("b")
        slow = FairSlots(slots=1, limit=10, share=None, timeout_s=60)
        await slow.acquire("a")
        waiter = asyncio.create_task(slow.acquire("b"))
        await asyncio.sleep(0)
        assert slow.waiting == 1
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        return slots, slow, late.value

    slots, slow, late = asyncio.run(scenario())
    assert late.code == "queue_timeout" and late.status == 503
    assert (slots.waiting, slots.busy) == (0, 1) and (slow.waiting, slow.busy) == (0, 1)


class BurstEngine:
    """stream_infer of a fake codegen_stream that refuses past `capacity` calls in flight, as the front did."""

    def __init__(self, capacity: int):
        self.capacity, self.in_flight, self.most = capacity, 0, 0

    async def stream_infer(self, model, inputs):
        if self.in_flight >= self.capacity:
            raise Unavailable(f"model '{model}' is over capacity, retry later")
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            yield "piece"
        finally:
            self.in_flight -= 1


def test_a_burst_of_streams_waits_for_slots_and_every_one_completes():
    """Issue 55: 256 concurrent streams through 32 slots in front of a server that takes 64 at once."""
    async def scenario():
        engine = SlotEngine(BurstEngine(capacity=64), FairSlots(32, 4096, 1024, 60), owner="one client")

        async def stream():
            return [piece async for piece in engine.stream_infer("codegen_stream", {})]

        results = await asyncio.gather(*(stream() for _ in range(256)), return_exceptions=True)
        return results, engine.engine.most

    results, most = asyncio.run(scenario())
    assert [r for r in results if not isinstance(r, list)] == [] and most <= 32


def test_the_fronts_workers_queue_a_burst_in_arrival_order_and_refuse_exactly_past_it():
    """backends/stage_common/bounded_workers.py: `limit` threads, `queue` more waiting, the next one refused."""
    import threading

    from stage_common.bounded_workers import BoundedWorkers
    from stage_common.errors import Overloaded

    gate, ran = threading.Event(), []
    workers = BoundedWorkers(1, "test", queue=3)  # one thread: the order it runs them in is the queue's
    try:
        for i in range(4):
            workers.submit(lambda i=i: (gate.wait(30), ran.append(i)))
        assert (workers.busy, workers.waiting) == (4, 3)
        with pytest.raises(Overloaded, match="requests in flight, the limit .*max_queued=3"):
            workers.submit(ran.append, 4)
        gate.set()
        until = time.monotonic() + 30
        while workers.busy and time.monotonic() < until:
            time.sleep(0.01)
        assert ran == [0, 1, 2, 3]  # every waiting one served, in arrival order
    finally:
        workers.shutdown()


def test_another_clients_completion_is_served_beside_a_64_sequence_request():
    """Issue 56, item 4, in process: one client's 8 prompts x n 8 no longer hold every completion slot; another
    client's short completion waits its turn for the next slot and is answered before the heavy one."""
    import httpx

    from gateway.app import create_app
    from gateway.settings import Settings
    from test_completions_unit import FakeEngine

    class FrontEngine(FakeEngine):
        """codegen_stream as it was: 64 streams at once, the next one refused."""

        async def stream_infer(self, model, inputs, timeout_s=None):
            if self.active >= 64:
                raise Unavailable(f"model '{model}' is over capacity, retry later", code="overloaded")
            async for response in super().stream_infer(model, inputs, timeout_s):
                yield response

    async def scenario():
        app = create_app(Settings())
        app.state.engine = FrontEngine(delay=0.02)
        finished: list[str] = []

        def client(address: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 5000)),
                                     base_url="http://127.0.0.1", timeout=60)

        async def post(http: httpx.AsyncClient, name: str, **body):
            response = await http.post("/v1/completions", json={"model": "codegen", **body})
            finished.append(name)
            return response

        async with client("10.0.0.1") as heavy_client, client("10.0.0.2") as light_client:
            heavy = asyncio.create_task(post(heavy_client, "heavy", prompt=[f"p{i}" for i in range(8)], n=8,
                                             max_tokens=20, seed=1))
            await asyncio.sleep(0.1)  # the heavy request's sequences hold what they can
            light = await post(light_client, "light", prompt="q", max_tokens=2, seed=2)
            heavy = await heavy
        return heavy, light, finished

    heavy, light, finished = asyncio.run(scenario())
    assert light.status_code == 200, light.text
    assert heavy.status_code == 200 and len(heavy.json()["choices"]) == 64
    assert finished == ["light", "heavy"]
