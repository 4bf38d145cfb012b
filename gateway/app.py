"""The FastAPI app: settings, the Triton engine, and every router. Each component that needs start-up
or shutdown work (model registry, collections) is opened in `lifespan`, in order, and closed in reverse."""
from __future__ import annotations

import logging
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from gateway import admission, errors, prometheus
from gateway.registry import ModelRegistry
from gateway.server_watch import ServerWatch
from gateway.routers import collections, completions, embeddings, health, models, seed
from gateway.search.collections import Collections
from gateway.settings import Settings
from gateway.triton_engine import TritonEngine


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with AsyncExitStack() as stack:
            app.state.engine = TritonEngine(settings.triton_grpc_url, settings.request_timeout_s)
            stack.push_async_callback(app.state.engine.close)
            app.state.models = ModelRegistry(settings, app.state.engine)
            stack.push_async_callback(app.state.models.close)
            await app.state.models.start()
            app.state.server_watch = ServerWatch(app.state.engine, app.state.models, app.state.admission).start()
            stack.push_async_callback(app.state.server_watch.close)
            app.state.collections = Collections(settings)
            stack.callback(app.state.collections.close)
            app.state.collections.start()
            yield

    app = FastAPI(title="Triton pipelines gateway", version="0.1.0", lifespan=lifespan,
                  description="Embeddings (OpenAI-compatible and seed-001 endpoints), runtime model management, "
                              "completions and image search, served by the Triton server beside it.")
    app.state.settings = settings
    errors.install(app)
    app.state.metrics = prometheus.install(app)
    app.state.admission = admission.Admission(drain_s=settings.drain_s)
    admission.install(app, app.state.admission)  # outside the metrics: refusals are cheap and not measured
    app.state.extra_model_ids = []  # other model families (completions) list their ids here
    for router in (health.router, models.router, embeddings.router, seed.router):
        app.include_router(router)
    app.include_router(completions.router)
    app.include_router(collections.router)
    app.state.extra_model_ids.append(settings.completions_model)  # served by codegen_stream
    return app


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
