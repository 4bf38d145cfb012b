"""Completion slots (issues 55 and 56): at most COMPLETIONS_SLOTS sequences of /v1/completions in flight to
Triton at once, the rest waiting in the gateway, each owner (an API key; without keys a client address) with
its share of the queue and served round-robin (gateway/triton/fair_queue.py).

Why in the gateway: a waiting sequence costs a coroutine here (kilobytes), and the order is the gateway's to
choose. Triton's side is a plain FIFO (the fronts' `max_in_flight` threads, then the generator's rows):
what the gateway sends it is at most COMPLETIONS_SLOTS, a little over the generator's active rows (16), so
the generator always has the next sequence at hand, and another key's sequence, once given the next free
slot, waits in the generator behind at most one batch of the heavy key's. A burst of streams (hundreds,
as load generators open) waits here in arrival order and is served, instead of 503 past the fronts' limit.

A sequence is refused only when the queue (COMPLETIONS_QUEUE) or its owner's share of it
(COMPLETIONS_QUEUE_KEY_SHARE) is full, 503 with Retry-After, or when it has waited QUEUE_TIMEOUT_S, 503."""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Hashable

from gateway.errors import Unavailable
from gateway.triton.fair_queue import FairQueue, QueueFull


def queue_refusal(full: QueueFull, what: str, limit_setting: str, share_setting: str) -> Unavailable:
    """The 503 of a full queue, naming which bound and its setting."""
    if full.whole:
        return Unavailable(f"{what}: {full.waiting} waiting, the queue's limit ({limit_setting}={full.bound}); "
                           "retry later", retry_after=2, code="overloaded")
    return Unavailable(f"{what}: this key (or client address) has {full.waiting} waiting, its share of the queue "
                       f"({share_setting}={full.bound}); retry when some are answered", retry_after=1,
                       code="overloaded")


def queue_timeout(what: str, waited_s: float) -> Unavailable:
    return Unavailable(f"{what}: waited {waited_s:.0f}s in the gateway's queue, its limit (QUEUE_TIMEOUT_S); "
                       "retry later", retry_after=2, code="queue_timeout")


class FairSlots:
    """`slots` holders at once; more wait (`hold(owner)`) in a FairQueue of `limit` with `share` per owner."""

    def __init__(self, slots: int, limit: int, share: int | None, timeout_s: float, name: str = "completions"):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, not {slots}")
        self.slots, self.timeout_s, self.name = slots, timeout_s, name
        self.queue: FairQueue[asyncio.Future] = FairQueue(limit, share)
        self.busy = 0
        # for the metrics: sequences that waited, and their waits' sum (a Prometheus summary's count and sum)
        self.waited = 0
        self.waited_seconds = 0.0

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @asynccontextmanager
    async def hold(self, owner: Hashable) -> AsyncIterator[None]:
        await self.acquire(owner)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, owner: Hashable) -> None:
        if self.busy < self.slots and not len(self.queue):
            self.busy += 1
            return
        granted = asyncio.get_running_loop().create_future()
        try:
            self.queue.put(owner, granted)
        except QueueFull as full:
            raise queue_refusal(full, f"'{self.name}' is over capacity", "COMPLETIONS_QUEUE",
                                "COMPLETIONS_QUEUE_KEY_SHARE") from None
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.shield(granted)
        except BaseException as exc:
            if granted.done():  # granted as the wait ended: the slot is this caller's to hand on
                self.release()
            else:
                self.queue.remove(owner, granted)
                granted.cancel()
            if isinstance(exc, TimeoutError):
                raise queue_timeout(f"'{self.name}' is over capacity", time.monotonic() - started) from None
            raise
        finally:
            self.waited += 1
            self.waited_seconds += time.monotonic() - started

    def release(self) -> None:
        self.busy -= 1
        while self.busy < self.slots and len(self.queue):
            _owner, granted = self.queue.pop()
            if granted.done():
                continue
            granted.set_result(None)
            self.busy += 1


class SlotEngine:
    """The Triton engine as /v1/completions' sequences see it: each `stream_infer` holds one of `slots`
    for its owner while it runs (gateway/completions/sequences.py calls one per sequence)."""

    def __init__(self, engine, slots: FairSlots, owner: Hashable):
        self.engine, self.slots, self.owner = engine, slots, owner

    async def stream_infer(self, *args, **kwargs):
        async with self.slots.hold(self.owner):
            async for response in self.engine.stream_infer(*args, **kwargs):
                yield response

    def __getattr__(self, name):
        return getattr(self.engine, name)


def completion_slots(state) -> FairSlots:
    """The app's completion slots (`state`: app.state, with its settings), made at first use."""
    slots = getattr(state, "completion_slots", None)
    if slots is None:
        settings = state.settings
        share = settings.completions_queue_key_share or max(1, settings.completions_queue // 4)
        slots = state.completion_slots = FairSlots(settings.completions_slots, settings.completions_queue, share,
                                                   settings.queue_timeout_s)
    return slots
