"""Issue 56 item 8: a client cannot force tracing. An incoming `traceparent`'s sampled flag is honoured only
from TRACE_TRUSTED_SOURCES; from any other client the gateway's own sampler decides, and the client's span
context is kept as a link. The in-process client's address is 127.0.0.1."""
from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

from gateway.settings import Settings
from gateway.telemetry.config import TelemetryOptions
from gateway_helpers import MINILM
from inprocess_gateway import inprocess_gateway

URL = "http://127.0.0.1:4318/v1/traces"
CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
FORCED = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}


def provider_with(sampler):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def requests(tmp_path, provider, count: int, **settings):
    async def scenario():
        options = {"telemetry": TelemetryOptions(URL), "tracer_provider": provider}
        async with inprocess_gateway(tmp_path, app_options=options, **settings) as (_app, client):
            return [await client.post("/v1/embeddings", json={"model": MINILM, "input": "hi"}, headers=FORCED)
                    for _ in range(count)]

    return asyncio.run(scenario())


def server_spans(exporter):
    return [span for span in exporter.get_finished_spans() if span.name == "POST /v1/embeddings"]


def test_an_untrusted_clients_sampled_flag_does_not_force_a_trace(tmp_path):
    provider, exporter = provider_with(ParentBased(TraceIdRatioBased(0.0)))  # the gateway samples nothing
    try:
        answers = requests(tmp_path, provider, 5)
    finally:
        provider.shutdown()
    assert [a.status_code for a in answers] == [200] * 5
    assert exporter.get_finished_spans() == ()
    assert all("traceparent" not in a.headers for a in answers)  # nothing sampled: no trace is named


def test_an_untrusted_clients_trace_is_linked_not_continued(tmp_path):
    provider, exporter = provider_with(ParentBased(ALWAYS_ON))
    try:
        (answer,) = requests(tmp_path, provider, 1)
    finally:
        provider.shutdown()
    (server,) = server_spans(exporter)
    assert server.parent is None and format(server.context.trace_id, "032x") != CLIENT_TRACE
    (link,) = server.links
    assert (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")) == (CLIENT_TRACE,
                                                                                             CLIENT_SPAN)
    assert answer.headers["traceparent"].split("-")[1] == format(server.context.trace_id, "032x")


def test_a_trusted_sources_sampled_flag_is_honoured(tmp_path):
    provider, exporter = provider_with(ParentBased(TraceIdRatioBased(0.0)))
    try:
        requests(tmp_path, provider, 2, trace_trusted_sources=("127.0.0.0/8",))
    finally:
        provider.shutdown()
    spans = server_spans(exporter)
    assert len(spans) == 2
    assert {format(s.context.trace_id, "032x") for s in spans} == {CLIENT_TRACE}
    assert {format(s.parent.span_id, "016x") for s in spans} == {CLIENT_SPAN}


def test_trace_trusted_sources_are_addresses_or_networks():
    assert Settings.from_env({"TRACE_TRUSTED_SOURCES": "10.0.0.0/8, ::1"}).trace_trusted_sources == ("10.0.0.0/8",
                                                                                                      "::1")
    assert Settings.from_env({}).trace_trusted_sources == ()
    with pytest.raises(ValueError, match="TRACE_TRUSTED_SOURCES"):
        Settings.from_env({"TRACE_TRUSTED_SOURCES": "collector.local"})
