"""What tracing costs the gateway's CPU per request when it is off, in this process (no sockets, no Triton):
POST /v1/embeddings through the whole middleware stack and route, the engine a fake answering at once
(bench/inprocess_gateway.py), timed in interleaved rounds:

- `without layer`: the app's stack below gateway/middleware/tracing.py's RequestTrace (auth.py then makes
  the request id itself, as before tracing existed),
- `off`: the whole stack as built with tracing off (RequestTrace: request id, x-request-id),
- `on, 100%`: tracing on, every request sampled, spans handed to the SDK's batch processor and exported to
  nowhere (an exporter that drops them: the SDK's CPU, not the network's).

The span helpers' own cost with tracing off is printed too (what engine, coalescing, tokens and the JSON
parse call per request). Figures: the median of `rounds` per-request means, in microseconds.

    python -m bench.tracing_overhead [--requests 2000] [--rounds 9]
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from bench import stats
from bench.inprocess_gateway import inprocess_gateway
from gateway.middleware.tracing import RequestTrace
from gateway.telemetry import spans
from gateway.telemetry.config import TelemetryOptions
from gateway.telemetry.setup import tracer_provider

MINILM = "sentence-transformers/all-MiniLM-L6-v2"  # the gateway's name for the shipped text_embedding
BODY = b'{"model": "%s", "input": "A sentence of about the usual length to embed here."}' % MINILM.encode()


class Dropped(SpanExporter):
    def export(self, spans_):
        return SpanExportResult.SUCCESS


async def per_request(stack, app, n: int) -> float:
    async def receive():
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(_message):
        pass

    start = time.perf_counter()
    for _ in range(n):
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"", "root_path": "",
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080), "app": app,
                 "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(BODY)).encode())]}
        await stack(scope, receive, send)
    return (time.perf_counter() - start) / n


async def measure(requests: int, rounds: int) -> dict[str, float]:
    figures: dict[str, list[float]] = {"without layer": [], "off": [], "on, 100%": []}
    provider = tracer_provider("http://127.0.0.1:9/v1/traces", {"OTEL_TRACES_SAMPLER": "always_on"}, exporter=Dropped())
    with tempfile.TemporaryDirectory() as off_dir, tempfile.TemporaryDirectory() as on_dir:
        async with inprocess_gateway(Path(off_dir), app_options={"telemetry": TelemetryOptions()}) as (off_app, _), \
                inprocess_gateway(Path(on_dir), app_options={"telemetry": TelemetryOptions("http://127.0.0.1:9"),
                                                              "tracer_provider": provider}) as (on_app, _):
            stacks, apps = {}, {"off": off_app, "on, 100%": on_app, "without layer": off_app}
            for name, app in (("off", off_app), ("on, 100%", on_app)):
                app.middleware_stack = app.build_middleware_stack()
                stacks[name] = app.middleware_stack
            layer = stacks["off"].app  # ReplicaId -> RequestTrace -> the rest
            assert isinstance(layer, RequestTrace)
            stacks["without layer"] = type(stacks["off"])(layer.app, stacks["off"].value.decode())
            for name, stack in stacks.items():
                await per_request(stack, apps[name], 200)  # warm: the model registry, caches
            for r in range(rounds):
                order = list(stacks) if r % 2 == 0 else list(stacks)[::-1]
                for name in order:
                    figures[name].append(await per_request(stacks[name], apps[name], requests))
    provider.shutdown()
    return {name: stats.median(values) * 1e6 for name, values in figures.items()}


def helpers_us(n: int = 100_000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        span = spans.start_call("ModelInfer", "text_embedding")
        spans.grpc_metadata(span)
        spans.end(span)
        with spans.stage("gateway.count_tokens"):
            pass
        spans.note_model({"model": MINILM})
        spans.event("first_token")
        spans.start("gateway.coalesce.wait")
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.requests, args.rounds))
    base = figures["without layer"]
    for name, us in figures.items():
        print(f"{name:14s} {us:8.1f} us per request ({us - base:+.1f} us)")
    print(f"span helpers, tracing off: {helpers_us():.2f} us per request (all of them once)")


if __name__ == "__main__":
    main()
