"""GET /v1/models (OpenAI's list): every model the gateway can serve now."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request

from gateway.registry import model_id

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


def model_ids(request: Request) -> list[str]:
    specs = request.app.state.models.loaded()
    ids = [model_id(s.model_name, s.pretrained) for s in specs]
    return ids + list(getattr(request.app.state, "extra_model_ids", []))


@router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list",
            "data": [{"id": i, "object": "model", "created": STARTED, "owned_by": "triton-pipelines"}
                     for i in model_ids(request)]}
