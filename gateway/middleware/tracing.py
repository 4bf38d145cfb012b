"""Each request's id, trace and access line, as the outermost ASGI layer (outside Starlette's
ServerErrorMiddleware, like replica_id.py, so an unexpected 500 has them too):

- `x-request-id` on every response: the client's own (auth.py's rule: the first of 1 to 128 bytes) or
  a new one, written into the request's headers so that auth.py and the audit line use the same; the
  context variable gateway.telemetry.context.REQUEST_ID carries it to error bodies and log lines.
- with tracing on (gateway/telemetry/config.py): the SERVER span of the request, named by the route
  template: a child of the client's W3C `traceparent` only when the client is one of
  TRACE_TRUSTED_SOURCES (its sampled flag then decides, under the parent-based sampler); from any other
  client a root span, which the gateway's own sampler keeps or drops, linked to the client's span context
  (a client cannot force traces by sending `-01`: issue 56); attributes: method, route,
  status, key id, model (gateway/telemetry/spans.py: note_model), request id; never the key, the body or
  the path's values. Child spans: the body read (here), the quota checks (`Stage` around Quotas), and
  those the code opens (token counting, coalescing wait, the Triton call). A sampled trace answers a
  `traceparent` header naming the server span.
- ACCESS_LOG=1: one line per request (method, route, status, ms, key id, request id, trace id).

With tracing and the access log off, all this adds is the request id (measured in
tests/test_tracing_unit.py: a few microseconds)."""
from __future__ import annotations

import logging
import os
import time

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.middleware.auth import KEY_SCOPE
from gateway.middleware.log_fields import printable
from gateway.middleware.quotas import Quotas
from gateway.server.proxy_protocol import is_trusted, trusted_networks
from gateway.telemetry import spans
from gateway.telemetry.context import REQUEST_ID

log = logging.getLogger("gateway.access")
HEADER = b"x-request-id"
TRACEPARENT = b"traceparent"
STAGE_SCOPE = "gateway.stage_span"
_W3C = TraceContextTextMapPropagator()


class _HeaderGetter:
    """ASGI headers (a list of (bytes, bytes)) for the W3C propagator."""

    @staticmethod
    def get(headers, key: str):
        name = key.encode("latin-1")
        values = [v.decode("latin-1") for k, v in headers if k == name]
        return values or None

    @staticmethod
    def keys(headers):
        return [k.decode("latin-1") for k, _ in headers]


def ensure_request_id(scope) -> bytes:
    """The request's id by auth.py's rule (`request_id`: the first x-request-id of 1 to 128 bytes); a new
    one (os.urandom: uuid4's bytes without its object, ~4x cheaper) is added to the request's headers,
    where auth.py finds it instead of making its own."""
    headers = scope["headers"]
    for name, value in headers:
        if name == HEADER and 0 < len(value) <= 128:
            return value
    rid = os.urandom(16).hex().encode()
    scope["headers"] = [*headers, (HEADER, rid)]
    return rid


def with_headers(message, rid: bytes, traceparent: bytes | None):
    """The response start `message` with x-request-id (unless an inner layer, auth.py, set it already) and
    traceparent; the message's own header list is not changed (it may be a response object's)."""
    headers = message.get("headers") or []
    for name, _ in headers:  # a plain loop: any() with a generator costs ~1 us more here
        if name == HEADER:
            extra = []
            break
    else:
        extra = [(HEADER, rid)]
    if traceparent is not None:
        extra.append((TRACEPARENT, traceparent))
    if extra:
        message["headers"] = [*headers, *extra]
    return message


def route_of(scope) -> str:
    return getattr(scope.get("route"), "path", None) or "unmatched"


def parent_of(scope, trusted: tuple) -> tuple[otel_context.Context, list[Link]]:
    """(the context the request's span starts in, its links). The client's `traceparent` is its parent only
    from a trusted source (scope["client"]: the real client, after a trusted proxy's PROXY header); from
    anyone else the span is a root, sampled by the gateway's sampler alone, and the client's span context is
    kept as a link, so its trace can still be found."""
    parent = _W3C.extract(scope["headers"], getter=_HeaderGetter)
    if is_trusted(scope.get("client"), trusted):
        return parent, []
    client_span = trace.get_current_span(parent).get_span_context()
    return otel_context.Context(), [Link(client_span)] if client_span.is_valid else []


class RequestTrace:
    def __init__(self, app, tracer: trace.Tracer | None = None, access_log: bool = False, trusted: tuple = ()):
        self.app, self.tracer, self.access_log = app, tracer, access_log
        self.trusted = trusted  # TRACE_TRUSTED_SOURCES, as networks

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = ensure_request_id(scope)
        REQUEST_ID.set(raw.decode("latin-1"))  # the request's own task: nothing to reset
        if self.tracer is None and not self.access_log:
            async def send_with_id(message):
                if message["type"] == "http.response.start":
                    with_headers(message, raw, None)
                await send(message)

            return await self.app(scope, receive, send_with_id)
        return await self._observed(scope, receive, send, raw)

    async def _observed(self, scope, receive, send, raw: bytes):
        rid = raw.decode("latin-1")
        start, status, tracer = time.perf_counter(), 500, self.tracer
        span = token = body = None
        if tracer is not None:
            parent, links = parent_of(scope, self.trusted)
            span = tracer.start_span(scope["method"], context=parent, kind=SpanKind.SERVER, links=links,
                                     attributes={"http.request.method": scope["method"],
                                                 "url.scheme": scope.get("scheme", "http"), "gateway.request_id": rid})
            here = trace.set_span_in_context(span, parent)
            token = otel_context.attach(here)
            spans.TRACER.set(tracer)
            body = BodyRead(receive, tracer, here)
            receive = body.receive
        value = spans.traceparent(span) if span is not None else None
        parent_header = value.encode("latin-1") if value else None

        async def send_observed(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                with_headers(message, raw, parent_header)
            await send(message)

        error = None
        try:
            await self.app(scope, receive, send_observed)
        except BaseException as exc:
            error = exc
            raise
        finally:
            key = scope.get(KEY_SCOPE)
            key_id = key.key_id if key is not None else None
            route = route_of(scope)
            if self.access_log:
                ms = (time.perf_counter() - start) * 1000
                log.info("%s %s %d %.1f ms key=%s request=%s%s", scope["method"], route, status, ms, key_id or "-",
                         printable(rid), f" trace={value[3:35]}" if value else "",
                         extra={"fields": {"method": scope["method"], "route": route, "status": status,
                                           "duration_ms": round(ms, 3), "key_id": key_id}})
            if span is not None:
                body.close()
                self._finish(span, scope, route, status, key_id, error)
                otel_context.detach(token)

    @staticmethod
    def _finish(span, scope, route: str, status: int, key_id: str | None, error: BaseException | None) -> None:
        span.update_name(f"{scope['method']} {route}")
        span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if key_id is not None:
            span.set_attribute("gateway.key_id", key_id)
        if error is not None:
            spans.failed(span, error)
        elif status >= 500:  # a 4xx is the client's: the server span stays unset (HTTP conventions)
            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class BodyRead:
    """The `gateway.read_body` span: from the first receive() of the body to its last chunk (size only)."""

    def __init__(self, receive, tracer: trace.Tracer, parent):
        self._receive, self.tracer, self.parent = receive, tracer, parent
        self.span, self.size, self.done = None, 0, False

    async def receive(self):
        if self.done:
            return await self._receive()
        if self.span is None:
            self.span = self.tracer.start_span("gateway.read_body", context=self.parent)
        message = await self._receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if not message.get("more_body", False):
                self._end(complete=True)
        else:  # http.disconnect before the body's end
            self._end(complete=False)
        return message

    def _end(self, complete: bool) -> None:
        self.done = True
        if self.span is not None:
            self.span.set_attribute("http.request.body.size", self.size)
            if not complete:
                self.span.set_attribute("gateway.body.complete", False)
            self.span.end()

    def close(self) -> None:
        """The request ended (a refusal, a cap) before the body did."""
        if not self.done:
            self._end(complete=False)


class Stage:
    """`gateway.quotas`: a span from entering the wrapped middleware to its call of the next layer (or
    to its own answer, a 429). `Stage(name, opens=True)` goes just outside it, `Stage(name, opens=False)`
    just inside; installed only on a traced app."""

    def __init__(self, app, name: str, opens: bool):
        self.app, self.name, self.opens = app, name, opens

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self.opens:
            span = scope.pop(STAGE_SCOPE, None)
            spans.end(span)
            return await self.app(scope, receive, send)
        span = scope[STAGE_SCOPE] = spans.start(self.name)
        try:
            await self.app(scope, receive, send)
        finally:
            if scope.pop(STAGE_SCOPE, None) is not None:  # the wrapped layer answered itself
                spans.end(span, attributes={"gateway.refused": True})


def install(app, outermost_first: list) -> None:
    """RequestTrace outside everything the app builds (its tracer from app.state.tracer_provider, None:
    off) and, when traced, the quota stage around Quotas in `outermost_first` (edited in place)."""
    provider, options = app.state.tracer_provider, app.state.telemetry
    tracer = provider.get_tracer("gateway") if provider is not None else None
    if tracer is not None:
        at = next(i for i, (middleware, _) in enumerate(outermost_first) if middleware is Quotas)
        outermost_first.insert(at + 1, (Stage, {"name": "gateway.quotas", "opens": False}))
        outermost_first.insert(at, (Stage, {"name": "gateway.quotas", "opens": True}))
    build = app.build_middleware_stack
    trusted = trusted_networks(app.state.settings.trace_trusted_sources)
    app.build_middleware_stack = lambda: RequestTrace(build(), tracer, options.access_log, trusted)
