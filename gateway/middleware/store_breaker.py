"""A circuit breaker in front of the quota store (Redis, REDIS_URL / QUOTA_STORAGE): the store must not
become the single point of slowness (issue 43 item 6). A Redis that accepts connections and never answers
cost every keyed request 7 s, every time. With the breaker, the first call that fails or runs over
QUOTA_STORE_TIMEOUT_S opens it: from then on the store is not asked (callers count per replica, in
gateway/middleware/quotas.py), `/health` says so under `degraded`, the metric `gateway_quota_store_up` is 0,
and one warning is logged. A background task probes the store every QUOTA_STORE_RETRY_S; its first answer
closes the breaker (one more log line, the metric back to 1)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger("gateway.quotas")


class StoreDown(Exception):
    """The store was not asked (the breaker is open) or did not answer in time (it is open now)."""


def store_address(url: str) -> str:
    """host:port of a store URL, never its credentials."""
    parts = urlsplit(url)
    return f"{parts.hostname or parts.path}:{parts.port}" if parts.port else (parts.hostname or parts.path or url)


class StoreBreaker:
    def __init__(self, name: str, url: str, setting: str, probe: Callable[[], Awaitable[object]],
                 timeout_s: float, retry_s: float, gauge: Gauge | None = None):
        self.name, self.address, self.setting = name, store_address(url), setting
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self._probe = probe
        self.gauge = gauge.labels(name) if gauge is not None else None
        if self.gauge is not None:
            self.gauge.set(1)
        self.opened_at: float | None = None  # time.time() when it opened; None: closed
        self.cause = ""
        self._retry: asyncio.Task | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    async def ask(self, call: Callable[[], Awaitable]):
        """The store's answer to `call()`, or StoreDown without asking (open) or after it failed or ran
        over the timeout (which opens the breaker)."""
        if self.opened_at is not None:
            raise StoreDown(self.cause)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call()
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, the store did not answer
            self.trip(exc)
            raise StoreDown(self.cause) from None

    def trip(self, exc: BaseException) -> None:
        if self.opened_at is not None:
            return
        self.opened_at = time.time()
        self.cause = (f"no answer within {self.timeout_s:g}s (QUOTA_STORE_TIMEOUT_S)" if isinstance(exc, TimeoutError)
                      else f"{type(exc).__name__}: {exc}"[:200])
        if self.gauge is not None:
            self.gauge.set(0)
        log.warning("quota store %s (%s) failed: %s; it is not asked again until it answers (probed every %gs); "
                    "rate, token and concurrency limits are counted per replica meanwhile",
                    self.address, self.setting, self.cause, self.retry_s)
        self._retry = asyncio.get_running_loop().create_task(self._probe_until_answered())

    async def _probe_until_answered(self) -> None:
        while True:
            await asyncio.sleep(self.retry_s)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._probe()
                break
            except Exception:  # noqa: BLE001 - still down: try again later
                continue
        down_s = time.time() - (self.opened_at or time.time())
        self.opened_at, self._retry = None, None
        if self.gauge is not None:
            self.gauge.set(1)
        log.warning("quota store %s (%s) answers again after %.1fs: limits are shared between replicas again",
                    self.address, self.setting, down_s)

    def detail(self) -> str | None:
        """What /health says while the breaker is open; None while it is closed."""
        if self.opened_at is None:
            return None
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.opened_at))
        return (f"{self.address} ({self.setting}) not asked since {since} ({self.cause}); limits are counted per "
                f"replica until it answers (probed every {self.retry_s:g}s)")

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            try:
                await self._retry
            except asyncio.CancelledError:
                pass
            self._retry = None


def store_gauge(registry: CollectorRegistry | None) -> Gauge | None:
    if registry is None:
        return None
    return Gauge("gateway_quota_store_up", "1 while the quota store answers; 0 while its breaker is open "
                 "(limits counted per replica)", ["store"], registry=registry)
