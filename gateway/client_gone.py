"""A client that leaves: the work of its request is cancelled as soon as its connection closes (the completions
and embeddings routes), so an abandoned request stops costing the shared batch and queues."""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import Request

T = TypeVar("T")
CLIENT_GONE = 499  # nginx's "client closed request": logged, never received by anyone


class ClientGone(Exception):
    pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled as soon as the client's connection closes. The body is read by now, so the next
    ASGI message is `http.disconnect`: wait for it beside the work. (Not `request.is_disconnected()`:
    its zero-timeout receive loses the message under an `@app.middleware("http")` middleware.)"""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if watch.result().get("type") == "http.disconnect":
            raise ClientGone()
        return await task  # not a disconnect (nothing else is expected): just finish the work
    finally:
        for pending in (task, watch):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
