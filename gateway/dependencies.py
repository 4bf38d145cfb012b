"""The services the routers receive, as FastAPI dependencies: a route names what it needs by type
(`settings: SettingsDep`, `engine: EngineDep`, ...) and never reaches into app.state itself. This is the
one place that knows where the app keeps them: app.py's lifespan opens them (a test may put its own fakes
there), gateway/middleware/install adds the admission. The providers are `async def` although they do not
await: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per dependency and request
(~0.15 ms each, measured here)."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.embedding.embed import Embedder
from gateway.middleware.admission import Admission
from gateway.middleware.quotas import QuotaBook
from gateway.registry import ModelRegistry
from gateway.search.collections import Collections
from gateway.settings import Settings
from gateway.triton.engine import TritonEngine
from gateway.triton.server_watch import ServerWatch


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_engine(request: Request) -> TritonEngine:
    return request.app.state.engine


async def get_registry(request: Request) -> ModelRegistry:
    return request.app.state.models


async def get_opened_registry(request: Request) -> ModelRegistry | None:
    """The registry, or None before the lifespan opened it (/health still answers then)."""
    return getattr(request.app.state, "models", None)


async def get_collections(request: Request) -> Collections:
    return request.app.state.collections


async def get_embedder(request: Request) -> Embedder:
    state = request.app.state
    return Embedder(state.settings, state.models, state.engine, state.coalescers)


async def get_admission(request: Request) -> Admission | None:
    return getattr(request.app.state, "admission", None)


async def get_quotas(request: Request) -> QuotaBook | None:
    return getattr(request.app.state, "quotas", None)


async def get_server_watch(request: Request) -> ServerWatch | None:
    return getattr(request.app.state, "server_watch", None)


async def get_extra_model_ids(request: Request) -> list[str]:
    """Ids of other model families the app serves (completions), listed beside the registry's."""
    return list(getattr(request.app.state, "extra_model_ids", []))


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[TritonEngine, Depends(get_engine)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
OpenedRegistryDep = Annotated[ModelRegistry | None, Depends(get_opened_registry)]
CollectionsDep = Annotated[Collections, Depends(get_collections)]
EmbedderDep = Annotated[Embedder, Depends(get_embedder)]
AdmissionDep = Annotated[Admission | None, Depends(get_admission)]
ServerWatchDep = Annotated[ServerWatch | None, Depends(get_server_watch)]
QuotasDep = Annotated[QuotaBook | None, Depends(get_quotas)]
ExtraModelIdsDep = Annotated[list[str], Depends(get_extra_model_ids)]
