"""The gateway's own Prometheus metrics (Triton's stay on its metrics port): requests, latency and
errors per endpoint, labelled by the route template so that ids in paths do not explode the series."""
from __future__ import annotations

import time

from fastapi import FastAPI, Request, Response
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

    def observe(self, method: str, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(method, endpoint, str(status)).inc()
        if status >= 400:
            self.errors.labels(method, endpoint, str(status)).inc()
        self.latency.labels(method, endpoint).observe(seconds)

    def exposition(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def _endpoint(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def install(app: FastAPI) -> GatewayMetrics:
    metrics = GatewayMetrics()

    @app.middleware("http")
    async def _measure(request: Request, call_next):
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            metrics.observe(request.method, _endpoint(request), status, time.perf_counter() - start)

    @app.get("/metrics/prometheus", include_in_schema=False)
    async def _prometheus():
        return metrics.exposition()

    return metrics
