"""The spans the gateway's code opens inside a request: stages (body read, quotas, token counting,
coalescing wait), the Triton call with its W3C context for the gRPC metadata, events and attributes.

Each helper first reads TRACER, a context variable the tracing middleware sets only for a request it
traces: with tracing off (or in an app without it) that read is all a helper costs (~50 ns) and nothing
is created. Span attributes name routes, models, ids, counts and sizes, never a key, a text, an image or
an error's message (a message can quote its input): a failure is recorded by its type and code."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, Iterator, Mapping

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER: ContextVar[trace.Tracer | None] = ContextVar("gateway_tracer", default=None)
GRPC_SERVICE = "inference.GRPCInferenceService"  # Triton's gRPC service: spans are named service/method
_NULL = nullcontext()
_W3C = TraceContextTextMapPropagator()  # traceparent / tracestate, what Triton reads from gRPC metadata


def failed(span: trace.Span, error: BaseException, code: str | None = None) -> None:
    """Marks `span` failed by the error's type (and the gateway's error code), never its message."""
    span.set_attribute("error.type", type(error).__name__)
    code = code or getattr(error, "code", None)
    if isinstance(code, str):
        span.set_attribute("gateway.error.code", code)
    span.set_status(Status(StatusCode.ERROR))


@contextmanager
def _current_child(tracer: trace.Tracer, name: str, attributes: Mapping[str, Any] | None) -> Iterator[trace.Span]:
    with tracer.start_as_current_span(name, attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            failed(span, exc)
            raise


def stage(name: str, attributes: Mapping[str, Any] | None = None):
    """`with stage("gateway.tokens"):` a child of the current span around the block, current inside it;
    a shared no-op context when the request is not traced."""
    tracer = TRACER.get()
    if tracer is None:
        return _NULL
    return _current_child(tracer, name, attributes)


def start(name: str, attributes: Mapping[str, Any] | None = None,
          kind: SpanKind = SpanKind.INTERNAL) -> trace.Span | None:
    """A child of the current span that the caller ends (`end`), not made current: for a span that
    outlives the block that opens it (a coalescing wait, a stream). None when not traced."""
    tracer = TRACER.get()
    if tracer is None:
        return None
    return tracer.start_span(name, kind=kind, attributes=attributes)


def end(span: trace.Span | None, error: BaseException | None = None,
        attributes: Mapping[str, Any] | None = None) -> None:
    if span is None:
        return
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        failed(span, error)
    span.end()


def start_call(method: str, model: str) -> trace.Span | None:
    """The client span of one gRPC call to Triton (OpenTelemetry's RPC conventions), or None."""
    return start(f"{GRPC_SERVICE}/{method}", {"rpc.system": "grpc", "rpc.service": GRPC_SERVICE,
                                              "rpc.method": method, "triton.model_name": model}, SpanKind.CLIENT)


def grpc_metadata(span: trace.Span | None) -> tuple[tuple[str, str], ...] | None:
    """`traceparent` (and `tracestate`) of `span` for the call's gRPC metadata, so Triton's spans join its
    trace; None when untraced or not sampled (Triton, started with rate=0, traces every request that
    carries a context, sampled or not: an unsampled one must carry none)."""
    if span is None or not span.get_span_context().trace_flags.sampled:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return tuple(carrier.items())


def event(name: str, attributes: Mapping[str, Any] | None = None) -> None:
    """An event on the current span (e.g. a stream's first token), when traced."""
    if TRACER.get() is not None:
        trace.get_current_span().add_event(name, attributes=attributes)


def note_model(body: Any) -> None:
    """The request's `model` (a JSON body's field) on the current span, when traced: a model's name,
    never any other part of the body."""
    if TRACER.get() is not None and isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str):
            trace.get_current_span().set_attribute("gateway.model", model[:256])


def traceparent(span: trace.Span) -> str | None:
    """The W3C `traceparent` header value of `span` (sampled spans only), for the response."""
    carrier: dict[str, str] = {}
    if span.get_span_context().trace_flags.sampled:
        _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def current_trace_id() -> str | None:
    """The current span's trace id as 32 hex digits (for log lines), or None outside a traced request."""
    if TRACER.get() is None:
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
