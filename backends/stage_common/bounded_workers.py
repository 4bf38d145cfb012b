"""A thread pool with a bounded waiting line (the BLS fronts of decoupled pipelines hand each request to a
thread): `limit` requests run at once, up to `queue` more wait in arrival order, and past both a request gets
UNAVAILABLE at once (issue 55: a burst of hundreds of streams waits and is served instead of being refused past
the threads). A waiting request costs its queue entry (the request and its sender: kilobytes), not a thread;
one whose client left while it waited is dropped when its turn comes (`is_cancelled`). Fairness between
clients is the gateway's (its completion slots, gateway/triton/fair_slots.py): this line is a plain FIFO."""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from stage_common.errors import Overloaded


class BoundedWorkers:
    """`on_change(busy)` is told each new count of requests in flight, running or waiting (the fronts export it
    as a metric: the supervisor retires an old stub only once it has none, issue 35)."""

    def __init__(self, limit: int, name: str, setting: str = "max_in_flight",
                 on_change: Callable[[int], None] | None = None, queue: int = 0, queue_setting: str = "max_queued"):
        if limit < 1 or queue < 0:
            raise ValueError(f"{setting} must be >= 1 and {queue_setting} >= 0, not {limit} and {queue}")
        self.limit, self.queue, self.setting, self.queue_setting = limit, queue, setting, queue_setting
        self.on_change = on_change
        self._pool = ThreadPoolExecutor(limit, thread_name_prefix=name)  # its own queue is FIFO: arrival order
        self._lock, self._busy = threading.Lock(), 0

    def submit(self, fn, *args) -> None:
        """Run fn(*args) on the next free thread (now, or after those waiting), or raise Overloaded when `limit`
        run and `queue` wait already."""
        with self._lock:
            if self._busy >= self.limit + self.queue:
                # the supervisor's canary reads "requests in flight, the limit" as an answer (supervisor/canaries.py)
                raise Overloaded(f"{self._busy} requests in flight, the limit ({self.setting}={self.limit} running, "
                                 f"{self.queue_setting}={self.queue} waiting): retry later")
            self._busy += 1
            busy = self._busy
        self._report(busy)
        try:
            self._pool.submit(self._run, fn, args)
        except BaseException:
            self._done()
            raise

    def _run(self, fn, args) -> None:
        try:
            fn(*args)
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._busy -= 1
            busy = self._busy
        self._report(busy)

    @property
    def busy(self) -> int:
        """Requests running or waiting."""
        return self._busy

    @property
    def waiting(self) -> int:
        """Requests waiting for a thread."""
        return max(0, self._busy - self.limit)

    def _report(self, busy: int) -> None:
        if self.on_change is not None:
            try:
                self.on_change(busy)
            except Exception:  # noqa: BLE001 - a metric must never fail a request
                pass

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
