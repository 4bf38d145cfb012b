"""The FastAPI app: settings, the middleware (gateway/middleware/, in the order it runs), every router and
the pages. Each service that needs start-up or shutdown work (the Triton engine, the model registry, the
server watch, collections) is opened in `lifespan`, in order, and closed in reverse; routers receive them
through gateway/dependencies.py."""
from __future__ import annotations

import inspect
import os
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from gateway import errors, middleware
from gateway.middleware.auth import check_exposure
from gateway.pages import docs, ui
from gateway.pages.openapi import honest_openapi
from gateway.registry import make_registry
from gateway.routers import collections, completions, embeddings, health, models, pipelines, seed
from gateway.search.collections import Collections
from gateway.settings import Settings
from gateway.telemetry.config import TelemetryOptions
from gateway.telemetry.log_format import configure_logging  # noqa: F401 - `python -m gateway` calls it from here
from gateway.triton.domains import engines_for
from gateway.triton.server_watch import ServerWatch


def create_app(settings: Settings | None = None, telemetry: TelemetryOptions | None = None,
               tracer_provider=None) -> FastAPI:
    """`telemetry` defaults to the environment's (gateway/telemetry/config.py); `tracer_provider` to one
    exporting to its OTLP endpoint when tracing is on (tests pass their own)."""
    settings = settings or Settings.from_env()
    telemetry = telemetry or TelemetryOptions.from_env()
    ring = check_exposure(settings)  # the keys, or None: open on loopback (an open non-loopback HOST is refused)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        routes.check_complete()
        async with AsyncExitStack() as stack:
            app.state.engine = engines_for(settings)  # one engine per Triton server (failure domain)
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
            if app.state.tracer_provider is not None:  # the spans still queued are sent before the exit
                stack.callback(app.state.tracer_provider.shutdown)
            yield

    app = FastAPI(title="Triton pipelines gateway", version="0.1.0", lifespan=lifespan,
                  **docs.fastapi_kwargs(), **native_telemetry(),
                  description="Embeddings (OpenAI-compatible and seed-001 endpoints), runtime model management, "
                              "completions, image search, named entities and food photo captions, served by the "
                              "Triton server beside it. A browser page over this API is at /ui.")
    app.state.settings = settings
    app.state.telemetry = telemetry
    app.state.tracer_provider = tracer_provider or tracing_provider(telemetry)  # None: tracing off
    app.state.coalescers = {}  # the Coalescer of each ensemble, shared by the app's requests (gateway/embedding/)
    docs.install(app)  # /docs and /redoc with their assets from a package, not a CDN
    errors.install(app)
    routes = middleware.install(app, settings, ring)  # every bound around the routes, in order
    app.state.extra_model_ids = []  # other model families (completions) list their ids here
    for router in (health.router, models.router, embeddings.router, seed.router):
        app.include_router(router)
    app.include_router(completions.router)  # it charges a key's tokens per minute itself, once it has read the body
    app.include_router(collections.router)
    app.include_router(pipelines.router)
    ui.install(app)  # /ui: static page over the public API
    app.state.extra_model_ids.append(settings.completions_model)  # served by codegen_stream
    app.openapi = honest_openapi(app, settings)
    return app


def native_telemetry() -> dict:
    """FastAPI's OpenTelemetry hooks (FastAPI >= 0.165) off unless FASTAPI_OTEL_AUTO_CONFIGURE=true: with them
    on, every request asks three global OTel providers whether they are configured (py-spy: ~2% of the
    gateway's CPU at c32), and the gateway's metrics are its own Prometheus ones (gateway/middleware/metrics.py)."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    if os.environ.get("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true":
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def tracing_provider(telemetry: TelemetryOptions):
    """The OpenTelemetry SDK's provider when tracing is on (the SDK is imported only then), else None."""
    if telemetry.traces_url is None:
        return None
    from gateway.telemetry.setup import tracer_provider

    return tracer_provider(telemetry.traces_url)
