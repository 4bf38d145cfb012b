"""Rows of concurrent requests to one ensemble sent to Triton together (issue 29).

Each Triton request costs the server a fixed amount beyond its rows: the gRPC call, the ensemble's
scheduling, one round trip through every Python stage's stub. Measured on a quiet 2-core box, direct
gRPC to `text_embedding`, alternating 3 x 2 rounds: 8-row requests at c4 gave 302 rows/s where 1-row
requests at c32 gave 286 (+6%), and the gateway makes one gRPC call instead of eight.

No timer and no added wait: at most `max_calls` calls per ensemble are in flight; a request that finds
a free slot goes at once, alone (c1 is unchanged). Requests that arrive while every slot is busy queue,
and the next free slot takes as many of them as fit in `max_rows`. A call that fails with the client's
fault (400) may have been failed by one request's row: each request of it is then sent again alone, so
that only that request fails. Every other failure (Triton gone, over capacity, timeout) is every
row's, and each request gets it.

The queue is a fair one (gateway/triton/fair_queue.py, issue 56): bounded (`max_pending` rows,
COALESCE_QUEUE_ROWS) and each owner (an API key; without keys a client address) at most `max_owner_pending`
of them (COALESCE_QUEUE_KEY_ROWS); a request over either gets a 503 `overloaded` at once. A call is filled
round-robin across owners, so another key's one-sentence request goes in the next call beside one batch of a
heavy key's, not behind its whole backlog. A waiting request leaves the queue when its own wait passes
`timeout_s` (503 `queue_timeout`) or when it is cancelled (its client left, issue 56): its rows are dropped
then, never sent."""
from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from gateway.errors import BadRequest
from gateway.telemetry import spans
from gateway.triton.fair_queue import FairQueue, QueueFull
from gateway.triton.fair_slots import queue_refusal, queue_timeout

Send = Callable[[list], Awaitable[np.ndarray]]  # items -> [len(items), ...] rows, in order


@dataclass(eq=False)
class _Job:
    items: list
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # a traced request's `gateway.coalesce.wait` span and its context, where the call that takes its rows
    # runs when it leads the batch (so Triton's spans join its trace); None when not traced
    wait: object = None
    context: contextvars.Context | None = None


class Coalescer:
    """One ensemble's calls: `await run(items)` answers this request's rows, sent with others' when busy."""

    def __init__(self, send: Send, max_rows: int, max_calls: int, max_pending: int = 256,
                 max_owner_pending: int | None = None, timeout_s: float | None = None, name: str = "model"):
        if max_rows < 1 or max_calls < 1 or max_pending < 1:
            raise ValueError(f"max_rows, max_calls and max_pending must be >= 1, not {max_rows}, {max_calls}, {max_pending}")
        self.send, self.max_rows, self.max_calls, self.max_pending = send, max_rows, max_calls, max_pending
        self.name, self.timeout_s = name, timeout_s
        self.pending: FairQueue[_Job] = FairQueue(max_pending, max_owner_pending)
        self.calls = 0
        self.tasks: set[asyncio.Task] = set()  # referenced until done: the loop keeps only weak ones
        self.sent_calls = self.sent_requests = 0  # counters for tests and benches

    @property
    def pending_rows(self) -> int:
        return self.pending.size

    async def run(self, items: list, owner=None) -> np.ndarray:
        """This request's rows; `owner`: whose share of the queue they count against (None: everyone's)."""
        if self.calls < self.max_calls and not self.pending:  # a free slot: this request's own call, in its task
            self.calls += 1
            self.sent_calls += 1
            self.sent_requests += 1
            try:
                return await self.send(items)
            finally:
                self.calls -= 1
                self._pump()
        job = _Job(list(items))
        try:
            self.pending.put(owner, job, len(job.items))
        except QueueFull as full:
            raise queue_refusal(full, f"model '{self.name}' is over capacity (rows)", "COALESCE_QUEUE_ROWS",
                                "COALESCE_QUEUE_KEY_ROWS") from None
        job.wait = spans.start("gateway.coalesce.wait")
        job.context = None if job.wait is None else contextvars.copy_context()
        self._pump()
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await asyncio.shield(job.future)
            except TimeoutError:
                if self._drop(owner, job):  # still queued: the wait is over
                    raise queue_timeout(f"model '{self.name}' is over capacity", self.timeout_s or 0) from None
                return await asyncio.shield(job.future)  # in a call already: its answer (Triton's deadline bounds it)
        except asyncio.CancelledError:
            # the client left (or a refusal cancelled the rest): rows still queued are dropped, never sent; rows
            # already in a call are its, and their answer is dropped
            self._drop(owner, job)
            if not job.future.done():
                job.future.cancel()
            raise

    def _drop(self, owner, job: _Job) -> bool:
        """Take a job out of the queue (True), or False when a call has it already."""
        if not self.pending.remove(owner, job):
            return False
        if job.wait is not None:
            spans.end(job.wait, attributes={"gateway.coalesce.cancelled": True})
        job.future.cancel()
        return True

    def _pump(self) -> None:
        while self.pending and self.calls < self.max_calls:
            # round-robin across owners (fair_queue.py), each call filled up to max_rows; a request is never split
            batch = [self.pending.pop()[1]]
            rows = len(batch[0].items)
            while self.pending and rows + self.pending.peek()[1] <= self.max_rows:
                job = self.pending.pop()[1]
                batch.append(job)
                rows += len(job.items)
            live = [job for job in batch if not job.future.done()]  # cancelled while queued: not sent
            lead = next((job for job in live if job.context is not None), None)  # a traced request's
            if lead is not None or any(job.wait is not None for job in batch):
                _waited(batch, live, lead, rows)
            if not live:
                continue
            self.calls += 1
            # the call runs in the lead's context; untraced, in a fresh one, not in the context of whichever
            # request's task is pumping now (its trace is not this call's)
            task = asyncio.get_running_loop().create_task(
                self._call(live), context=lead.context if lead is not None else contextvars.Context())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _call(self, batch: list[_Job]) -> None:
        try:
            self.sent_calls += 1
            self.sent_requests += len(batch)
            try:
                rows = await self.send([item for job in batch for item in job.items])
            except BadRequest:
                if len(batch) == 1:
                    raise
                # whose row was it? each request alone, concurrently (each in its own trace): only the faulty one fails
                loop = asyncio.get_running_loop()
                await asyncio.gather(*(loop.create_task(self._alone(job), context=job.context or contextvars.Context())
                                       for job in batch))
                return
            start = 0
            for job in batch:
                end = start + len(job.items)
                if not job.future.done():
                    job.future.set_result(rows[start:end])
                start = end
        except BaseException as exc:  # noqa: BLE001 - every request of the call gets the call's failure
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
        finally:
            self.calls -= 1
            self._pump()

    async def _alone(self, job: _Job) -> None:
        try:
            rows = await self.send(job.items)
        except Exception as exc:  # noqa: BLE001 - this request's own failure, answered to it
            if not job.future.done():
                job.future.set_exception(exc)
            return
        if not job.future.done():
            job.future.set_result(rows)


def _waited(batch: list[_Job], live: list[_Job], lead_job: _Job | None, rows: int) -> None:
    """Ends the traced jobs' wait spans as their call leaves: how many requests and rows it carries, and
    a link from each other request's wait to the lead's, whose trace holds the call and Triton's spans."""
    lead = lead_job.wait if lead_job is not None else None
    for job in batch:
        if job.wait is None:
            continue
        if job.wait is not lead and lead is not None:
            job.wait.add_link(lead.get_span_context(), {"gateway.coalesce.lead": True})
        spans.end(job.wait, attributes={"gateway.coalesce.requests": len(live), "gateway.coalesce.rows": rows,
                                        "gateway.coalesce.leads": job.wait is lead,
                                        "gateway.coalesce.cancelled": job not in live})
