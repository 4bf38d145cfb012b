"""Body caps before parsing (issue 25), as one ASGI middleware.

Each route's cap comes from its own limits (gateway/middleware/policy.py), never above MAX_BODY_BYTES. A body over
it is refused with 413 as soon as `Content-Length` shows it (nothing of the body is read), or as soon as
a chunked body passes the cap (the rest is never read: uvicorn stops reading the socket and closes the
connection after the answer). The whole body must arrive within BODY_TIMEOUT_S, or 408: a slow client
holds no request for long. Bodies together hold at most BODY_BUFFER_BYTES, and the bodies of one API key
(without keys: of one client address) at most BODY_BUFFER_KEY_BYTES (gateway/middleware/body_budget.py),
counted as their bytes arrive: one that does not fit now gets 503 with Retry-After, before its first byte
over the budget is read, and before any of it when its `Content-Length` shows that it cannot fit now."""
from __future__ import annotations

import asyncio
import logging
import time

from gateway import errors
from gateway.middleware.auth import KEY_SCOPE
from gateway.middleware.body_budget import BodyBudget, budget_bytes, share_bytes
from gateway.middleware.log_fields import printable
from gateway.middleware.policy import RouteTable, cap
from gateway.settings import Settings

log = logging.getLogger("gateway.body_limits")


class _Refused(Exception):
    """Raised into the app by a read that must not go on: `error` is our answer (None: the client is gone)."""

    def __init__(self, error: errors.ApiError | None):
        self.error = error


def too_large(size_text: str, limit: int, path: str) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge(f"the request body is {size_text}, over the limit of {limit} bytes for {path} "
                                  "(sized from the route's own limits, MAX_BODY_BYTES, BODY_BUFFER_BYTES and "
                                  "BODY_BUFFER_KEY_BYTES)", code="body_too_large")


def budget_full(budget: BodyBudget, size: int, scope) -> errors.Unavailable:
    if budget.used + size <= budget.total:  # it is the owner's share that is full
        owner = "key" if scope.get(KEY_SCOPE) is not None else "client address"
        return errors.Unavailable(f"the request bodies this {owner} sends at once are at its share of {budget.share} "
                                  "bytes (BODY_BUFFER_KEY_BYTES); retry when one has been answered", retry_after=1,
                                  code="body_buffer_full")
    return errors.Unavailable(f"the request bodies the gateway holds are at its limit of {budget.total} bytes "
                              "(BODY_BUFFER_BYTES); retry later", retry_after=1, code="body_buffer_full")


def owner_of(scope) -> str | None:
    """Whose share a body counts against: the API key's id, else (a gateway without keys: no request with a
    body comes without a key to one with keys) the client's address."""
    key = scope.get(KEY_SCOPE)
    if key is not None:
        return key.key_id
    client = scope.get("client")
    return client[0] if client else None


def content_length(headers) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses it
    return None


class CapBodies:
    def __init__(self, app, routes: RouteTable, settings: Settings, budget: BodyBudget | None = None):
        self.app, self.routes, self.settings = app, routes, settings
        self.budget = budget if budget is not None else BodyBudget(budget_bytes(settings), share_bytes(settings))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, policy = self.routes.resolve(scope)
        path = path or scope["path"]
        budget, owner = self.budget, owner_of(scope)
        limit = min(cap(policy, self.settings), budget.share)  # a body over one owner's share never fits
        declared = content_length(scope["headers"])
        if declared is not None and declared > limit:
            # Connection: close: uvicorn then closes instead of waiting for a body nobody will read
            return await errors.send(send, too_large(f"{declared} bytes (Content-Length)", limit, path),
                                     {"Connection": "close"})
        if declared and not budget.fits(declared, owner):
            # checked, not taken: a declared body that never comes holds nothing (its bytes count as they arrive)
            log.info("503 %s: a body of %d bytes does not fit BODY_BUFFER_BYTES or BODY_BUFFER_KEY_BYTES now",
                     printable(path), declared)
            return await errors.send(send, budget_full(budget, declared, scope), {"Connection": "close"})

        held = 0  # bytes of the budget this request holds, given back when it ends
        received, body_done = 0, False
        deadline = time.monotonic() + self.settings.body_timeout_s
        refused: errors.ApiError | None = None
        failures: list[_Refused] = []  # raised into the app; their tracebacks are dropped at the end
        started = False

        def fail(error: errors.ApiError | None) -> _Refused:
            nonlocal refused
            refused = error
            failures.append(_Refused(error))
            return failures[-1]

        async def capped_receive():
            nonlocal received, body_done, held
            if failures:
                raise fail(refused)
            if body_done:  # after the body: only http.disconnect is left, wait as long as the route likes
                return await receive()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise fail(errors.RequestTimeout(f"the request body did not arrive within {self.settings.body_timeout_s:g} s "
                                                 "(BODY_TIMEOUT_S)", code="body_timeout")) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise fail(too_large(f"over {limit} bytes (chunked)", limit, path))
                if received > held:  # taken as they come
                    if not budget.take(received - held, owner):
                        log.info("503 %s: a body at %d bytes does not fit BODY_BUFFER_BYTES or BODY_BUFFER_KEY_BYTES "
                                 "now", printable(path), received)
                        raise fail(budget_full(budget, received - held, scope))
                    held = received
                body_done = not message.get("more_body", False)
            elif message["type"] == "http.disconnect":
                # ours instead of Starlette's ClientDisconnect, so that its traceback can be dropped (below);
                # the app's answer (a 400 nobody reads) still goes out, for the metrics
                raise fail(None)
            return message

        async def guarded_send(message):
            nonlocal started
            if refused is not None:
                return  # the app's answer to the failed read (FastAPI makes it a 400): ours goes instead
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, capped_receive, guarded_send)
        except _Refused:
            pass
        finally:
            if held:
                budget.give(held, owner)
            for failure in failures:
                # FastAPI turns a failed read into an HTTPException `from` ours, in a frame that keeps the
                # HTTPException: a reference cycle through our traceback to the frame of Starlette's
                # Request.body() and the chunks it had read (up to the cap), freed only by the cyclic
                # GC, long after this request (measured: 4 MiB of a refused body held until gc.collect())
                failure.__traceback__ = None
        if refused is not None and not started:
            await errors.send(send, refused, {"Connection": "close"})
