"""CPU work of request handlers (tokenizing for `usage`, base64 decoding, image header checks) off the
event loop: async handlers never block. A small thread pool does the work; a semaphore bounds how many
jobs may be queued for it, so a burst of large requests waits its turn (asynchronously, the loop free)
instead of piling an unbounded backlog into the pool."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

WORKERS = max(2, min(4, len(os.sched_getaffinity(0))))
QUEUE = 64  # jobs running or waiting for a worker; more callers wait on the loop, not in the pool

_pool: ThreadPoolExecutor | None = None
_slots: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = weakref.WeakKeyDictionary()


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="gateway-cpu")
    return _pool


async def run(fn: Callable[..., T], *args, **kwargs) -> T:
    """`fn(*args, **kwargs)` in the CPU pool; its exceptions are raised here unchanged."""
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:  # one per loop: tests run several loops in one process
        slots = _slots[loop] = asyncio.Semaphore(QUEUE)
    async with slots:
        # in the caller's context (as asyncio.to_thread does): its request id and trace span go along
        return await loop.run_in_executor(_executor(), contextvars.copy_context().run,
                                          functools.partial(fn, *args, **kwargs))
