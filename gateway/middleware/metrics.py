"""The gateway's own Prometheus metrics (Triton's stay on its metrics port): requests, latency and
errors per endpoint, labelled by the route template so that ids in paths do not explode the series."""
from __future__ import annotations

import time

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class GatewayMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("gateway_requests", "HTTP requests answered", ["method", "endpoint", "status"],
                                registry=self.registry)
        self.errors = Counter("gateway_errors", "HTTP requests answered with a 4xx or 5xx", ["method", "endpoint", "status"],
                              registry=self.registry)
        self.latency = Histogram("gateway_request_duration_seconds", "time to the response's first byte",
                                 ["method", "endpoint"], buckets=BUCKETS, registry=self.registry)
        self._series: dict[tuple[str, str, int], tuple] = {}  # bounded: endpoints are route templates

    def observe(self, method: str, endpoint: str, status: int, seconds: float) -> None:
        series = self._series.get((method, endpoint, status))
        if series is None:  # labels() takes a lock and builds a key per call: once per series, not per request
            labels = (method, endpoint, str(status))
            series = self._series[(method, endpoint, status)] = (
                self.requests.labels(*labels), self.errors.labels(*labels) if status >= 400 else None,
                self.latency.labels(method, endpoint))
        requests, errors, latency = series
        requests.inc()
        if errors is not None:
            errors.inc()
        latency.observe(seconds)

    def exposition(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class Measure:
    """Plain ASGI middleware (Starlette's BaseHTTPMiddleware cost ~1 ms of CPU per request here)."""

    def __init__(self, inner, metrics: GatewayMetrics):
        self.inner, self.metrics = inner, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        start, observed, metrics = time.perf_counter(), False, self.metrics

        def observe(status: int) -> None:
            nonlocal observed
            if not observed:
                observed = True
                route = scope.get("route")
                metrics.observe(scope["method"], getattr(route, "path", None) or "unmatched", status,
                                time.perf_counter() - start)

        async def send_measured(message):
            if message["type"] == "http.response.start":
                observe(message["status"])  # time to the response's first byte
            await send(message)

        try:
            await self.inner(scope, receive, send_measured)
        finally:
            observe(500)  # no response started: the app failed


def add_route(app: FastAPI, metrics: GatewayMetrics) -> None:
    """GET /metrics/prometheus: the exposition of `metrics` (open: gateway/middleware/policy.py)."""
    @app.get("/metrics/prometheus", include_in_schema=False)
    async def _prometheus():
        return metrics.exposition()
