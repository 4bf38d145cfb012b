"""GET /v1/models (OpenAI's list) and GET /v1/models/{id} (one of them, or a 404 in OpenAI's shape): every
model the gateway can serve now. Ids hold "/" (sentence-transformers/all-MiniLM-L6-v2), so the id is a path
parameter that takes the rest of the path: the `openai` SDK's models.retrieve("org/name") asks for
/v1/models/org/name."""
from __future__ import annotations

import time

from fastapi import APIRouter

from gateway.dependencies import ExtraModelIdsDep, RegistryDep
from gateway.errors import NotFound
from gateway.registry import ModelRegistry, model_id

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


def model_object(id_: str) -> dict:
    return {"id": id_, "object": "model", "created": STARTED, "owned_by": "triton-pipelines"}


def served_ids(registry: ModelRegistry, extra_ids: list[str]) -> list[str]:
    return [model_id(s.model_name, s.pretrained) for s in registry.loaded()] + extra_ids


@router.get("/v1/models")
async def list_models(registry: RegistryDep, extra_ids: ExtraModelIdsDep):
    return {"object": "list", "data": [model_object(i) for i in served_ids(registry, extra_ids)]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, registry: RegistryDep, extra_ids: ExtraModelIdsDep):
    if model not in served_ids(registry, extra_ids):
        raise NotFound(f"the model '{model}' does not exist (GET /v1/models lists the models served)",
                       param="model", code="model_not_found")
    return model_object(model)
