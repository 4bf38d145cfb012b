"""The FastAPI app: settings, the Triton engine, and every router. Each component that needs start-up
or shutdown work (model registry, collections) is opened in `lifespan`, in order, and closed in reverse."""
from __future__ import annotations

import inspect
import logging
import os
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import Depends, FastAPI

from gateway import admission, docs_pages, errors, prometheus, replica_id, ui
from gateway.audit import Audit, AuditLog
from gateway.auth import Authenticate, check_exposure
from gateway.body_budget import BodyBudget, budget_bytes
from gateway.body_limits import CapBodies
from gateway.openapi import honest_openapi
from gateway.policy import RouteTable
from gateway.quotas import QuotaBook, Quotas, charge_tokens
from gateway.cluster import make_registry
from gateway.server_watch import ServerWatch
from gateway.routers import collections, completions, embeddings, health, models, pipelines, seed
from gateway.search.collections import Collections
from gateway.settings import Settings
from gateway.triton_engine import TritonEngine


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    ring = check_exposure(settings)  # the keys, or None: open on loopback (an open non-loopback HOST is refused)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        routes.check_complete()
        async with AsyncExitStack() as stack:
            app.state.engine = TritonEngine(settings.triton_grpc_url, settings.request_timeout_s)
            stack.push_async_callback(app.state.engine.close)
            stack.push_async_callback(app.state.quotas.close)
            app.state.models = make_registry(settings, app.state.engine)  # shared through Redis with REDIS_URL
            stack.push_async_callback(app.state.models.close)
            await app.state.models.start()
            app.state.server_watch = ServerWatch(app.state.engine, app.state.models, app.state.admission).start()
            stack.push_async_callback(app.state.server_watch.close)
            app.state.collections = Collections(settings)
            stack.callback(app.state.collections.close)
            app.state.collections.start()
            yield

    app = FastAPI(title="Triton pipelines gateway", version="0.1.0", lifespan=lifespan,
                  **docs_pages.fastapi_kwargs(), **native_telemetry(),
                  description="Embeddings (OpenAI-compatible and seed-001 endpoints), runtime model management, "
                              "completions, image search, named entities and food photo captions, served by the "
                              "Triton server beside it. A browser page over this API is at /ui.")
    app.state.settings = settings
    docs_pages.install(app)  # /docs and /redoc with their assets from a package, not a CDN
    errors.install(app)
    # cross-cutting bounds, one ASGI middleware each, all reading gateway/policy.py; outermost first:
    # metrics, audit, auth, per-key quotas, body caps (add_middleware puts the last added outermost)
    routes = RouteTable(app)
    app.state.quotas = QuotaBook(settings)
    app.state.body_budget = BodyBudget(budget_bytes(settings))  # request-body bytes held, all requests together
    app.add_middleware(CapBodies, routes=routes, settings=settings, budget=app.state.body_budget)
    app.add_middleware(Quotas, book=app.state.quotas)
    app.add_middleware(Authenticate, routes=routes, ring=ring)
    app.add_middleware(Audit, routes=routes, audit_log=AuditLog(settings.data_dir / "audit.log"))
    app.state.metrics = prometheus.install(app)
    app.state.admission = admission.Admission(drain_s=settings.drain_s)
    admission.install(app, app.state.admission)  # outside the metrics: refusals are cheap and not measured
    app.state.extra_model_ids = []  # other model families (completions) list their ids here
    for router in (health.router, models.router, embeddings.router, seed.router):
        app.include_router(router)
    app.include_router(completions.router, dependencies=[Depends(charge_tokens)])  # tokens per minute per key
    app.include_router(collections.router)
    app.include_router(pipelines.router)
    ui.install(app)  # /ui: static page over the public API
    app.state.extra_model_ids.append(settings.completions_model)  # served by codegen_stream
    app.openapi = honest_openapi(app, settings)
    replica_id.install(app)  # x-replica-id on every response: outermost of all, even around the 500 handler
    return app


def native_telemetry() -> dict:
    """FastAPI's OpenTelemetry hooks (FastAPI >= 0.165) off unless FASTAPI_OTEL_AUTO_CONFIGURE=true: with them
    on, every request asks three global OTel providers whether they are configured (py-spy: ~2% of the
    gateway's CPU at c32), and the gateway's metrics are its own Prometheus ones (gateway/prometheus.py)."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    if os.environ.get("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true":
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
