"""Body caps before parsing (issue 25), as one ASGI middleware.

Each route's cap comes from its own limits (gateway/policy.py), never above MAX_BODY_BYTES. A body over
it is refused with 413 as soon as `Content-Length` shows it (nothing of the body is read), or as soon as
a chunked body passes the cap (the rest is never read: uvicorn stops reading the socket and closes the
connection after the answer). The whole body must arrive within BODY_TIMEOUT_S, or 408: a slow client
holds no request for long."""
from __future__ import annotations

import asyncio
import time

from gateway import errors
from gateway.policy import RouteTable, cap
from gateway.settings import Settings


class _Refused(Exception):
    def __init__(self, error: errors.ApiError):
        self.error = error


def too_large(size_text: str, limit: int, path: str) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge(f"the request body is {size_text}, over the limit of {limit} bytes for {path} "
                                  "(sized from the route's own limits and MAX_BODY_BYTES)", code="body_too_large")


def content_length(headers) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses it
    return None


class CapBodies:
    def __init__(self, app, routes: RouteTable, settings: Settings):
        self.app, self.routes, self.settings = app, routes, settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, policy = self.routes.resolve(scope)
        path = path or scope["path"]
        limit = cap(policy, self.settings)
        declared = content_length(scope["headers"])
        if declared is not None and declared > limit:
            # Connection: close: uvicorn then closes instead of waiting for a body nobody will read
            return await errors.send(send, too_large(f"{declared} bytes (Content-Length)", limit, path),
                                     {"Connection": "close"})

        received, body_done = 0, False
        deadline = time.monotonic() + self.settings.body_timeout_s
        refused: errors.ApiError | None = None
        started = False

        async def capped_receive():
            nonlocal received, body_done, refused
            if refused is not None:
                raise _Refused(refused)
            if body_done:  # after the body: only http.disconnect is left, wait as long as the route likes
                return await receive()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                refused = errors.RequestTimeout(f"the request body did not arrive within {self.settings.body_timeout_s:g} s "
                                                "(BODY_TIMEOUT_S)", code="body_timeout")
                raise _Refused(refused) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = too_large(f"over {limit} bytes (chunked)", limit, path)
                    raise _Refused(refused)
                body_done = not message.get("more_body", False)
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
        if refused is not None and not started:
            await errors.send(send, refused, {"Connection": "close"})
