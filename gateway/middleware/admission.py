"""Which requests the gateway admits, as one plain ASGI middleware: while Triton is down (or restarting)
every request but /health, the metrics and the docs gets a 503 with Retry-After (naming no internal
address: the server watch's log line does); while the gateway drains (SIGTERM) new requests get a 503
too, and those in flight may finish until the drain deadline (DRAIN_S). It runs after auth and audit
(gateway/middleware/__init__.py): a refusal here is still a 401 for an unknown key, and audited. At the
deadline a request without an answer yet gets a 503, and a server-sent-events stream still open gets a
final `data: {"error": ...}` event: no request is cut silently. While it drains, every response says
`Connection: close` (uvicorn then closes the connection after it), so that a client's pool opens its next
connection elsewhere instead of reusing one the gateway is about to end (issue 55)."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

from gateway import errors
from gateway.build_state import FAILED, BuildWatch

log = logging.getLogger("gateway.admission")
# never refused: a load balancer and an operator must see why the gateway refuses the rest
ALWAYS_OPEN = ("/health", "/metrics", "/docs", "/redoc", "/openapi.json")


@dataclass(eq=False)
class _InFlight:
    task: asyncio.Task | None
    started: bool = False  # the response's status line is sent
    sse: bool = False  # ... and it is an event stream
    cut: bool = False  # cancelled by the drain deadline


@dataclass
class Admission:
    drain_s: float = 25.0
    draining: bool = False
    server_problem: str | None = None  # set by gateway/triton/server_watch.py while Triton cannot serve
    server_retry_after: int = 2
    active: set = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    cut_count: int = 0  # requests the drain deadline answered with an error
    builds: BuildWatch | None = None  # the demo pipelines `make triton` builds meanwhile (gateway/build_state.py)

    def refusal(self) -> errors.Unavailable | None:
        if self.draining:
            return errors.Unavailable("the gateway is shutting down; retry on another replica", retry_after=5,
                                      code="shutting_down")
        if self.server_problem:  # the problem as the watch saw it names Triton's address: for the log only
            return errors.Unavailable("the inference server is not available now (restarting); retry later",
                                      retry_after=self.server_retry_after, code="server_unavailable")
        return None

    def building(self, path: str) -> errors.Unavailable | None:
        """A 503 for a route whose pipeline is not built yet (or failed to build): what is happening, its
        progress and the time left, and a Retry-After from that estimate."""
        build = self.builds.pending(path) if self.builds is not None else None
        if build is None:
            return None
        failed = build.state == FAILED
        return errors.Unavailable(build.describe() + ("; `make triton` again retries it" if failed else
                                                      "; it is served as soon as it is ready"),
                                  retry_after=build.retry_after_s(), code="model_build_failed" if failed
                                  else "model_building")

    async def drain(self) -> None:
        """Refuse new requests, let those in flight finish until `drain_s`, then answer the rest with an error."""
        self.draining = True
        log.warning("draining: %d requests in flight, deadline %.0fs (DRAIN_S)", len(self.active), self.drain_s)
        if self.active:
            self.idle.clear()
            try:
                await asyncio.wait_for(self.idle.wait(), self.drain_s)
            except asyncio.TimeoutError:
                pass
        left = list(self.active)
        for request in left:
            request.cut = True
            if request.task is not None:
                request.task.cancel()
        if left:
            self.cut_count += len(left)
            log.warning("drain deadline: %d requests still in flight end with an error", len(left))
            try:
                await asyncio.wait_for(self.idle.wait(), 5.0)
            except asyncio.TimeoutError:
                log.warning("%d requests did not end after the drain deadline", len(self.active))


CLOSE = (b"connection", b"close")


def _closing(message: dict) -> dict:
    """A response start with `Connection: close` added (unless it says so already)."""
    headers = list(message.get("headers", []))
    if not any(k.lower() == b"connection" and b"close" in v.lower() for k, v in headers):
        headers.append(CLOSE)
    return {**message, "headers": headers}


def _json_response(error: errors.ApiError, close: bool = False):
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    headers += [CLOSE] if close else []
    return ({"type": "http.response.start", "status": error.status, "headers": headers},
            {"type": "http.response.body", "body": body})


def deadline_error() -> errors.Unavailable:
    return errors.Unavailable("the gateway shut down before this request finished (drain deadline DRAIN_S); "
                              "retry on another replica", retry_after=5, code="shutting_down")


class Admit:
    """The ASGI middleware over an Admission (gateway/middleware/__init__.py puts it in the stack)."""

    def __init__(self, inner, admission: Admission):
        self.inner, self.admission = inner, admission

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(ALWAYS_OPEN):
            return await self.inner(scope, receive, send)
        admission = self.admission
        refusal = admission.refusal() or admission.building(scope["path"])
        if refusal is not None:
            for message in _json_response(refusal, close=admission.draining):
                await send(message)
            return
        request = _InFlight(asyncio.current_task())
        admission.active.add(request)

        async def send_tracked(message):
            if message["type"] == "http.response.start":
                request.started = True
                request.sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                  for k, v in message.get("headers", []))
                if admission.draining:  # this connection ends with the gateway: its client must not reuse it
                    message = _closing(message)
            await send(message)

        try:
            await self.inner(scope, receive, send_tracked)
        except asyncio.CancelledError:
            if not request.cut:
                raise
            # our own cancel (the drain deadline), not uvicorn's: answer instead of cutting the connection
            asyncio.current_task().uncancel()
            error = deadline_error()
            if not request.started:
                for message in _json_response(error, close=True):
                    await send(message)
            elif request.sse:
                await send({"type": "http.response.body", "body": f"data: {json.dumps(error.body())}\n\n".encode(),
                            "more_body": False})
            else:  # a plain body half sent cannot be turned into an error: end it
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            admission.active.discard(request)
            if not admission.active:
                admission.idle.set()
