"""A thread pool that refuses work beyond its threads instead of queueing it without bound (the BLS
fronts of decoupled pipelines hand each request to a thread; over capacity the request gets
UNAVAILABLE at once)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from stage_common.errors import Overloaded


class BoundedWorkers:
    def __init__(self, limit: int, name: str, setting: str = "max_in_flight"):
        self.limit, self.setting = limit, setting
        self._pool = ThreadPoolExecutor(limit, thread_name_prefix=name)
        self._lock, self._busy = threading.Lock(), 0

    def submit(self, fn, *args) -> None:
        """Run fn(*args) on a free thread, or raise Overloaded if all `limit` are busy."""
        with self._lock:
            if self._busy >= self.limit:
                raise Overloaded(f"{self._busy} requests in flight, the limit ({self.setting}={self.limit}): "
                                 f"retry later")
            self._busy += 1
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

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
