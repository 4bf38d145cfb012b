"""Per-key quotas (issue 25): requests per second and concurrent requests for every key (one ASGI
middleware), tokens per minute for completions (charged by the completions route from the request it
validated and resolved, never from the raw body: `QuotaBook.charge_tokens` before any work, and
`QuotaBook.charge_echo` for the prompt tokens an echo sends back, once the model has counted them).

Rates are counted by the `limits` library (moving windows) in the storage QUOTA_STORAGE names
(`memory://` by default: per gateway process; `redis://host:port`, the default when REDIS_URL is set,
shares them between replicas). Concurrency is counted in this process, or with REDIS_URL in Redis (one
sorted set per key: a request's entry expires after REQUEST_TIMEOUT_S should its replica die before
removing it). A store that fails or does not answer within QUOTA_STORE_TIMEOUT_S opens its breaker
(store_breaker.py): it is not asked again until a background probe gets an answer, and meanwhile every
limit (rates, tokens, concurrency) is counted in this process, a window per replica: a quota store outage
neither takes the service down nor slows it, nor lifts the limits (issue 43 items 6 and 7). Over quota: 429 with Retry-After and OpenAI's
x-ratelimit-{limit,remaining,reset}-{requests,tokens} headers (on the 429 only: reading the window for
every answer would double the limiter's cost per request). Requests without a key (open routes,
or a gateway without keys on loopback) are not counted."""
from __future__ import annotations

import itertools
import logging
import math
import time
import uuid
from dataclasses import dataclass

from fastapi import Request
from limits import RateLimitItem, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.middleware.auth import KEY_SCOPE
from gateway.middleware.store_breaker import StoreBreaker, StoreDown, store_gauge
from gateway.keys import ApiKey
from gateway.settings import Settings

log = logging.getLogger("gateway.quotas")


def reset_text(seconds: float) -> str:
    """OpenAI's reset format: "1s", "250ms", "1m30s"."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, secs = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def storage_uri(uri: str) -> str:
    return uri if uri.startswith("async+") else "async+" + uri


SWEEP_S = 0.5  # the in-process storage drops expired entries at most this often


class SweptMemoryStorage(MemoryStorage):
    """`limits`' in-process async storage, its sweep of expired entries run at most every SWEEP_S.

    The library starts a sweep task on every hit, and the sweep hands each key's moving-window list to a
    thread (`asyncio.to_thread`). Measured here: ~25 us of CPU per hit in a busy loop and ~120 us at c32's
    pace, against ~4 and ~35 us with the sweep throttled: most of what keys cost under load
    (bench/bench_security.py). Counting is unchanged: a hit reads only the entry at `limit - 1`, newest
    first, so entries past it are never read; between sweeps a key holds at most the hits admitted in
    its window plus SWEEP_S. The hook is the library's private `__schedule_expiry` (limits 5.x, pinned
    in requirements.txt); tests/test_security_unit.py fails should a release rename it."""

    _next_sweep = 0.0

    async def _MemoryStorage__schedule_expiry(self) -> None:
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            await super()._MemoryStorage__schedule_expiry()


def is_memory(uri: str) -> bool:
    return storage_uri(uri) in ("async+memory://", "async+memory:///")


def rate_storage(uri: str, timeout_s: float = 2.0):
    """`limits`' async storage; for Redis through redis-py (what gateway/registry/ uses; limits' default
    client, coredis, is not installed), with socket timeouts (redis-py has none by default)."""
    uri = storage_uri(uri)
    if uri.startswith(("async+redis://", "async+rediss://", "async+unix://")):
        return storage_from_string(uri, implementation="redispy", key_prefix="triton-pipelines-quota",
                                   socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    if is_memory(uri):
        return SweptMemoryStorage()
    return storage_from_string(uri)


# KEYS[1]: the key's set of requests in flight. ARGV: now, expiry of this entry, limit, entry.
# Returns the count before this request when admitted, -1 - count when over the limit.
ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[3]) then return -1 - n end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) - tonumber(ARGV[1])) + 1)
return n
"""


class LocalConcurrency:
    """Requests in flight per key, in this process."""

    def __init__(self):
        self.active: dict[str, int] = {}

    async def acquire(self, key_id: str, limit: int) -> tuple[bool, int, object]:
        """(admitted, requests in flight before this one, a ticket for release)."""
        active = self.active.get(key_id, 0)
        if active >= limit:
            return False, active, None
        self.active[key_id] = active + 1
        return True, active, key_id

    async def release(self, ticket) -> None:
        self.active[ticket] -= 1


class RedisConcurrency:
    """Requests in flight per key across replicas (REDIS_URL): one sorted set per key, entries expiring.
    While its breaker is open they are counted in this process (`local`)."""

    def __init__(self, url: str, prefix: str, expire_s: float, timeout_s: float = 2.0):
        import redis.asyncio as aioredis  # only with REDIS_URL

        self.redis = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.script = self.redis.register_script(ACQUIRE)
        self.prefix, self.expire_s = prefix + "inflight:", expire_s
        self.local = LocalConcurrency()  # while Redis does not answer
        self.breaker: StoreBreaker | None = None  # set by QuotaBook
        self._ids = itertools.count()
        self._me = uuid.uuid4().hex[:12]

    async def acquire(self, key_id: str, limit: int) -> tuple[bool, int, object]:
        entry, now = f"{self._me}:{next(self._ids)}", time.time()
        try:
            n = await self.breaker.ask(lambda: self.script(keys=[self.prefix + key_id],
                                                           args=[now, now + self.expire_s, limit, entry]))
        except StoreDown:  # counted locally (see the module docstring)
            return await self.local.acquire(key_id, limit)
        return (True, n, (key_id, entry)) if n >= 0 else (False, -1 - n, None)

    async def release(self, ticket) -> None:
        if isinstance(ticket, str):  # admitted by the local fallback
            return await self.local.release(ticket)
        try:
            await self.breaker.ask(lambda: self.redis.zrem(self.prefix + ticket[0], ticket[1]))
        except StoreDown:  # the entry expires by itself
            pass

    async def close(self) -> None:
        await self.redis.aclose()


@dataclass(frozen=True)
class Window:
    """One rate window of one key: the `limits` item, the identifier its headers are read by, and the
    storage key, built once per key (`limits` would rebuild the key string on every hit)."""
    item: RateLimitItem
    namespace: str
    storage_key: str
    kind: str  # "requests" or "tokens": the x-ratelimit-*-<kind> headers


@dataclass(frozen=True)
class KeyQuota:
    """What the Quotas middleware checks for a key: its concurrency limit (0: none) and its requests
    per second window (None: none)."""
    concurrency: int
    requests: Window | None


class QuotaBook:
    """The limiter and the limits of each key (its own from the keys file, else the defaults), and the
    breakers of the stores they are counted in (none for `memory://`)."""

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None):
        self.settings = settings
        timeout_s = settings.quota_store_timeout_s
        self.limiter = MovingWindowRateLimiter(rate_storage(settings.quota_storage, timeout_s))
        self.local = MovingWindowRateLimiter(SweptMemoryStorage())  # rates while the store's breaker is open
        self.concurrency = (RedisConcurrency(settings.redis_url, settings.redis_prefix, settings.request_timeout_s,
                                             timeout_s) if settings.redis_url else LocalConcurrency())
        self.breakers: list[StoreBreaker] = []
        self.rate_breaker = self._breakers(settings, store_gauge(registry))
        self._windows: dict[tuple[str, str, int, str], Window] = {}
        self._quotas: dict[str, KeyQuota] = {}  # by key id; the keys file is read once, at start

    def _breakers(self, settings: Settings, gauge) -> StoreBreaker | None:
        """One breaker per store: REDIS_URL's (concurrency; rates too when QUOTA_STORAGE is the same store)
        and QUOTA_STORAGE's when it is another one. Returns the rates' breaker (None: memory://)."""
        def breaker(name, url, setting, probe):
            made = StoreBreaker(name, url, setting, probe, settings.quota_store_timeout_s,
                                settings.quota_store_retry_s, gauge)
            self.breakers.append(made)
            return made

        async def check_rates():
            if not await self.limiter.storage.check():
                raise ConnectionError("no answer to PING")

        if isinstance(self.concurrency, RedisConcurrency):
            self.concurrency.breaker = breaker("redis", settings.redis_url, "REDIS_URL", self.concurrency.redis.ping)
            if storage_uri(settings.quota_storage) == storage_uri(settings.redis_url):
                return self.concurrency.breaker
        if is_memory(settings.quota_storage):
            return None
        return breaker("quota_storage", settings.quota_storage, "QUOTA_STORAGE", check_rates)

    def degraded(self) -> dict[str, str]:
        """For /health: what the open breakers say (empty while every store answers)."""
        details = [d for d in (b.detail() for b in self.breakers) if d]
        return {"quota_store": "; ".join(details)} if details else {}

    async def close(self) -> None:
        for breaker in self.breakers:
            await breaker.close()
        if isinstance(self.concurrency, RedisConcurrency):
            await self.concurrency.close()

    def limit(self, key: ApiKey, name: str) -> int:
        return key.limits.get(name, getattr(self.settings, f"quota_{name}"))

    def window(self, key: ApiKey, per: str, amount: int, kind: str) -> Window:
        found = self._windows.get((key.key_id, per, amount, kind))
        if found is None:
            item = (RateLimitItemPerSecond if per == "second" else RateLimitItemPerMinute)(amount)
            namespace = f"{kind}:{key.key_id}"
            found = self._windows[(key.key_id, per, amount, kind)] = Window(item, namespace, item.key_for(namespace),
                                                                             kind)
        return found

    def quota(self, key: ApiKey) -> KeyQuota:
        found = self._quotas.get(key.key_id)
        if found is None:
            rps = self.limit(key, "requests_per_second")
            found = self._quotas[key.key_id] = KeyQuota(self.limit(key, "concurrency"),
                                                        self.window(key, "second", rps, "requests") if rps else None)
        return found

    async def hit(self, key: ApiKey, per: str, amount: int, kind: str, cost: int = 1) -> tuple[bool, dict[str, str]]:
        return await self.take(self.window(key, per, amount, kind), cost)

    async def take(self, window: Window, cost: int = 1) -> tuple[bool, dict[str, str]]:
        """(allowed, headers), from the store, or from this process's window while its breaker is open."""
        if self.rate_breaker is not None:
            try:
                return await self.rate_breaker.ask(lambda: self._take(self.limiter, window, cost))
            except StoreDown:
                return await self._take(self.local, window, cost)
        return await self._take(self.limiter, window, cost)

    @staticmethod
    async def _take(limiter: MovingWindowRateLimiter, window: Window, cost: int) -> tuple[bool, dict[str, str]]:
        """What the limiter's `hit` does (one moving-window entry in the storage), with the key string
        built once. The window's state (one more storage call) is read for a refusal only: the headers go
        on 429s, which keeps an allowed request at one call to the storage."""
        item = window.item
        if await limiter.storage.acquire_entry(window.storage_key, item.amount, item.get_expiry(), cost):
            return True, {}
        stats = await limiter.get_window_stats(item, window.namespace)
        wait, kind = max(0.0, stats.reset_time - time.time()), window.kind
        return False, {f"x-ratelimit-limit-{kind}": str(item.amount),
                       f"x-ratelimit-remaining-{kind}": str(stats.remaining),
                       f"x-ratelimit-reset-{kind}": reset_text(wait), "Retry-After": str(max(1, math.ceil(wait)))}

    async def charge_tokens(self, request: Request, cost: int) -> None:
        """A completion's token budget (max_tokens x n x prompts: ResolvedCompletion.budget) against the key's
        tokens per minute; POST /v1/completions calls it with the request it resolved, before any work."""
        key: ApiKey | None = request.scope.get(KEY_SCOPE)
        tpm = self.limit(key, "tokens_per_minute") if key is not None else 0
        if not tpm:
            return
        allowed, headers = await self.hit(key, "minute", tpm, "tokens", cost)
        if not allowed:
            log.info("429 key %s: %d tokens over %d tokens/min", key.key_id, cost, tpm)
            raise errors.TooManyRequests(f"key '{key.key_id}' is over its limit of {tpm} tokens per minute "
                                         f"(this request may use {cost}: max_tokens x n x prompts)", headers,
                                         code="rate_limit_exceeded")

    async def charge_echo(self, request: Request, cost: int) -> None:
        """The prompt tokens a completion with echo sends back (prompt tokens x n: every choice repeats its
        prompt; all a score-only request sends), counted by the model, so charged once it has run and before
        any of the answer leaves (issue 56). Refused, the answer is not given, and what is left of the key's
        window is taken: its next requests are refused before they run, until the window moves on."""
        key: ApiKey | None = request.scope.get(KEY_SCOPE)
        tpm = self.limit(key, "tokens_per_minute") if key is not None else 0
        if not tpm or cost <= 0:
            return
        window = self.window(key, "minute", tpm, "tokens")
        allowed, headers = await self.take(window, cost)
        if allowed:
            return
        left = int(headers.get("x-ratelimit-remaining-tokens", 0))
        if left > 0:
            await self.take(window, left)
        log.info("429 key %s: %d echoed prompt tokens over %d tokens/min", key.key_id, cost, tpm)
        raise errors.TooManyRequests(f"key '{key.key_id}' is over its limit of {tpm} tokens per minute "
                                     f"(this request echoes {cost} prompt tokens: prompt tokens x n)", headers,
                                     code="rate_limit_exceeded")


class Quotas:
    """Requests per second and concurrency per key."""

    def __init__(self, app, book: QuotaBook):
        self.app, self.book = app, book

    async def __call__(self, scope, receive, send):
        key: ApiKey | None = scope.get(KEY_SCOPE) if scope["type"] == "http" else None
        if key is None:
            return await self.app(scope, receive, send)
        book = self.book
        quota = book.quota(key)
        # concurrency first: a request refused for it must not use up one of the key's requests per second
        ticket = None
        if quota.concurrency:
            admitted, active, ticket = await book.concurrency.acquire(key.key_id, quota.concurrency)
            if not admitted:
                log.info("429 key %s: %d requests in flight", key.key_id, active)
                return await errors.send(send, errors.TooManyRequests(
                    f"key '{key.key_id}' has {active} requests in flight, its limit", {"Retry-After": "1"},
                    code="concurrency_limit_exceeded"))
        try:
            if quota.requests is not None:
                allowed, headers = await book.take(quota.requests)
                if not allowed:
                    rps = quota.requests.item.amount
                    log.info("429 key %s: over %d requests/s", key.key_id, rps)
                    return await errors.send(send, errors.TooManyRequests(
                        f"key '{key.key_id}' is over its limit of {rps} requests per second", headers,
                        code="rate_limit_exceeded"))
            await self.app(scope, receive, send)
        finally:
            if ticket is not None:
                await book.concurrency.release(ticket)

