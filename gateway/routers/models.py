"""GET /v1/models (OpenAI's list): every model the gateway can serve now."""
from __future__ import annotations

import time

from fastapi import APIRouter

from gateway.dependencies import ExtraModelIdsDep, RegistryDep
from gateway.registry import model_id

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


@router.get("/v1/models")
async def list_models(registry: RegistryDep, extra_ids: ExtraModelIdsDep):
    ids = [model_id(s.model_name, s.pretrained) for s in registry.loaded()] + extra_ids
    return {"object": "list",
            "data": [{"id": i, "object": "model", "created": STARTED, "owned_by": "triton-pipelines"} for i in ids]}
