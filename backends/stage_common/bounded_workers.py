"""A thread pool that refuses work beyond its threads instead of queueing it without bound (the BLS
fronts of decoupled pipelines hand each request to a thread; over capacity the request gets
UNAVAILABLE at once)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from stage_common.errors import Overloaded


class BoundedWorkers:
    """`on_change(busy)` is told each new count of requests in flight (the fronts export it as a metric: the
    supervisor retires an old stub only once it has none, issue 35)."""

    def __init__(self, limit: int, name: str, setting: str = "max_in_flight",
                 on_change: Callable[[int], None] | None = None):
        self.limit, self.setting, self.on_change = limit, setting, on_change
        self._pool = ThreadPoolExecutor(limit, thread_name_prefix=name)
        self._lock, self._busy = threading.Lock(), 0

    def submit(self, fn, *args) -> None:
        """Run fn(*args) on a free thread, or raise Overloaded if all `limit` are busy."""
        with self._lock:
            if self._busy >= self.limit:
                raise Overloaded(f"{self._busy} requests in flight, the limit ({self.setting}={self.limit}): "
                                 f"retry later")
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
        return self._busy

    def _report(self, busy: int) -> None:
        if self.on_change is not None:
            try:
                self.on_change(busy)
            except Exception:  # noqa: BLE001 - a metric must never fail a request
                pass

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
