"""A stage's own OpenTelemetry spans, joined to the request's trace by the W3C `traceparent` its caller passes
as a request parameter.

Why a parameter: Triton 2.51 traces a BLS call only when it is given `trace=request.trace()`, and that trace is
freed with the request once `execute` returns: a call made later, from a worker thread, crashes the server
(SIGSEGV in TRITONSERVER_ServerInferAsync; docs/observability.md). So a front passes the context of its own request
(`traceparent_of(request.trace())`) as the BLS request's `traceparent` parameter, and the callee (the
generator) opens a span of its own under it with the OpenTelemetry SDK, exported over OTLP/HTTP like Triton's.

Off unless the stub's environment names an OTLP/HTTP endpoint (the OTEL_* variables the launcher passes):
`StageTracing.from_env()` is then None, the SDK is never imported and a request costs one `is None` test.
A request that carries no sampled `traceparent` gets no span either (Triton's rate=0: only what the gateway
sampled is traced). Never in a span: token ids, text, or an error's message (it can quote the input).
Triton-free: the adapters hand in plain values."""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

TRACEPARENT = "traceparent"  # the BLS request parameter (and the W3C header) that carries the context
SERVICE = "triton-inference-server"  # the stages run inside Triton: their spans belong to its service
_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def stage_traces_url(env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL from OpenTelemetry's standard variables, or None (off; also when the SDK or
    the traces exporter is switched off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or \
            env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    whole, base = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip(), \
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return whole or (f"{base.rstrip('/')}/v1/traces" if base else None)


def traceparent_of(context: Any) -> str | None:
    """A sampled W3C traceparent from what Triton gives: InferenceTrace.get_context()'s JSON object (or a
    bare traceparent), a request's parameters JSON, or a dict of them; None if there is none or it is not
    sampled."""
    if isinstance(context, bytes):
        context = context.decode(errors="replace")
    if isinstance(context, str):
        text = context.strip()
        try:
            context = json.loads(text) if text.startswith("{") else {TRACEPARENT: text}
        except ValueError:
            return None
    value = context.get(TRACEPARENT) if isinstance(context, dict) else None
    if not isinstance(value, str) or not _TRACEPARENT.match(value.strip().lower()):
        return None
    value = value.strip().lower()
    return value if int(value[-2:], 16) & 1 else None


def request_traceparent(trace) -> str | None:
    """The traceparent of a Triton request's own trace (`request.trace()`), or None (not traced, or a stub
    without get_context): what a front passes on to its callees."""
    try:
        return traceparent_of(trace.get_context()) if trace is not None else None
    except Exception:  # noqa: BLE001 - tracing must never fail a request
        return None


class StageTracing:
    """One stub's tracer provider (a BatchSpanProcessor exporting to `traces_url`, or `exporter` in tests)."""

    def __init__(self, traces_url: str | None, scope: str, exporter=None):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = TracerProvider(resource=Resource.create({SERVICE_NAME: SERVICE}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=traces_url)))
        self.scope = scope  # the model: the instrumentation scope and the span names' prefix
        self.tracer = self.provider.get_tracer(scope)
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_env(cls, scope: str, env: Mapping[str, str] | None = None) -> "StageTracing | None":
        url = stage_traces_url(os.environ if env is None else env)
        return cls(url, scope) if url else None

    def start_span(self, name: str, traceparent: str, attributes: dict):
        """A span under `traceparent` (the caller's span), started now."""
        parent = self._propagator.extract({TRACEPARENT: traceparent})
        return self.tracer.start_span(name, context=parent, attributes=attributes)

    def sequence(self, traceparent: str | None, request, engine: str,
                 finish_reasons: Mapping[str, str]) -> Callable | None:
        """The `on_event` listener of one generation request (gptj_generator/seam.py's GenerationRequest and
        GenerationEvent, duck-typed): a `<model>.sequence` span with gen_ai.* attributes, one span event per
        engine event, ended at `finished`. None (no span) without a sampled traceparent."""
        if traceparent is None:
            return None
        sampling, model = request.sampling, self.scope
        span = self.start_span(f"{model}.sequence", traceparent, {
            "gen_ai.operation.name": "text_completion", "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": int(request.max_tokens),
            "gen_ai.request.temperature": float(sampling.temperature),
            "gen_ai.request.top_p": float(sampling.top_p), "gen_ai.request.top_k": int(sampling.top_k),
            "gen_ai.usage.input_tokens": len(request.input_ids), "codegen.engine": engine})
        return SequenceEvents(span, finish_reasons)

    def close(self) -> None:
        """Export what is left (finalize: the stub is about to exit)."""
        self.provider.shutdown()


class SequenceEvents:
    """Turns a generation's events into its span's events; `finished` sets the usage and the finish reason
    (or the error's type, never its message) and ends the span."""

    NUMBERS = ("prompt_tokens", "max_tokens", "completion_tokens")  # the only event attributes copied

    def __init__(self, span, finish_reasons: Mapping[str, str]):
        self.span, self.finish_reasons = span, finish_reasons

    def __call__(self, event) -> None:
        attributes = {k: int(v) for k, v in event.attributes.items() if k in self.NUMBERS}
        self.span.add_event(event.name, attributes, timestamp=event.time_ns)
        if event.name != "finished":
            return
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("gen_ai.usage.output_tokens", int(event.attributes.get("completion_tokens", 0)))
        if "error" in event.attributes:
            self.span.set_attribute("error.type", str(event.attributes["error"]).split("(", 1)[0])
            self.span.set_status(Status(StatusCode.ERROR))
        else:
            reason = str(event.attributes.get("reason", ""))
            self.span.set_attribute("gen_ai.response.finish_reasons", [self.finish_reasons.get(reason, reason)])
        self.span.end(end_time=event.time_ns)
