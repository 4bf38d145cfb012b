"""The FastAPI app: settings, the Triton engine, and every router. Each component that needs start-up
or shutdown work (model registry, collections) is opened in `lifespan`, in order, and closed in reverse."""
from __future__ import annotations

import logging
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from gateway import docs_pages, errors, prometheus, ui
from gateway.registry import ModelRegistry
from gateway.routers import collections, completions, embeddings, health, models, pipelines, seed
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
            app.state.collections = Collections(settings)
            stack.callback(app.state.collections.close)
            app.state.collections.start()
            yield

    app = FastAPI(title="Triton pipelines gateway", version="0.1.0", lifespan=lifespan,
                  **docs_pages.fastapi_kwargs(),
                  description="Embeddings (OpenAI-compatible and seed-001 endpoints), runtime model management, "
                              "completions, image search, named entities and food photo captions, served by the "
                              "Triton server beside it. A browser page over this API is at /ui.")
    app.state.settings = settings
    docs_pages.install(app)  # /docs and /redoc with their assets from a package, not a CDN
    errors.install(app)
    app.state.metrics = prometheus.install(app)
    app.state.extra_model_ids = []  # other model families (completions) list their ids here
    for router in (health.router, models.router, embeddings.router, seed.router):
        app.include_router(router)
    app.include_router(completions.router)
    app.include_router(collections.router)
    app.include_router(pipelines.router)
    ui.install(app)  # /ui: static page over the public API
    app.state.extra_model_ids.append(settings.completions_model)  # served by codegen_stream
    return app


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
