"""The OpenTelemetry SDK of one gateway: a TracerProvider with the environment's resource
(OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) and sampler (OTEL_TRACES_SAMPLER/_ARG, the SDK's default
parentbased_always_on), exporting through a BatchSpanProcessor (OTEL_BSP_*) to OTLP/HTTP. Imported only
when tracing is on: an untraced gateway loads no SDK. The provider is the app's, not the process-wide
global one, so in-process apps (the tests) stay apart and FastAPI's own hooks stay off (gateway/app.py)."""
from __future__ import annotations

import os
from typing import Mapping

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from gateway.telemetry.config import DEFAULT_SERVICE

INSTRUMENTATION = "gateway"  # the instrumentation scope of every span the gateway opens


def tracer_provider(traces_url: str, env: Mapping[str, str] | None = None,
                    exporter: SpanExporter | None = None) -> TracerProvider:
    """`exporter` defaults to OTLP/HTTP at `traces_url` (headers, timeout, compression from the env)."""
    env = os.environ if env is None else env
    named = {} if env.get("OTEL_SERVICE_NAME", "").strip() else {SERVICE_NAME: DEFAULT_SERVICE}
    provider = TracerProvider(resource=Resource.create(named))  # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=traces_url)))
    return provider
