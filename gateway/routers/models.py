"""GET /v1/models (OpenAI's list) and GET /v1/models/{id} (one of them, or a 404 in OpenAI's shape): every
model the gateway can serve now. Ids hold "/" (sentence-transformers/all-MiniLM-L6-v2), so the id is a path
parameter that takes the rest of the path: the `openai` SDK's models.retrieve("org/name") asks for
/v1/models/org/name.

While `make triton` builds the demo pipelines (gateway/build_state.py), each one not ready yet is listed too,
with `state` (`building` or `failed`), its progress and the seconds left; a served model says `"state":
"ready"`. OpenAI's clients ignore fields they do not know."""
from __future__ import annotations

import time

from fastapi import APIRouter

from gateway.build_state import PipelineBuild
from gateway.dependencies import AdmissionDep, ExtraModelIdsDep, RegistryDep, SettingsDep
from gateway.errors import NotFound
from gateway.registry import ModelRegistry, model_id

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


def model_object(id_: str, build: PipelineBuild | None = None) -> dict:
    return {"id": id_, "object": "model", "created": STARTED, "owned_by": "triton-pipelines",
            **(build.as_json() if build is not None else {"state": "ready"})}


def pending_builds(admission, settings) -> dict[str, PipelineBuild]:
    """The pipelines being built (or failed), by the id a client asks for: codegen by the completions model's."""
    builds = admission.builds.builds() if admission is not None and admission.builds is not None else {}
    ids = {"codegen": settings.completions_model}
    return {ids.get(name, name): build for name, build in builds.items() if build.state != "ready"}


def served_ids(registry: ModelRegistry, extra_ids: list[str]) -> list[str]:
    return [model_id(s.model_name, s.pretrained) for s in registry.loaded()] + extra_ids


@router.get("/v1/models")
async def list_models(registry: RegistryDep, extra_ids: ExtraModelIdsDep, admission: AdmissionDep,
                      settings: SettingsDep):
    pending = pending_builds(admission, settings)
    ids = served_ids(registry, extra_ids)
    return {"object": "list", "data": [model_object(i, pending.get(i)) for i in ids]
            + [model_object(i, build) for i, build in pending.items() if i not in ids]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, registry: RegistryDep, extra_ids: ExtraModelIdsDep, admission: AdmissionDep,
                         settings: SettingsDep):
    pending = pending_builds(admission, settings)
    if model not in served_ids(registry, extra_ids) and model not in pending:
        raise NotFound(f"the model '{model}' does not exist (GET /v1/models lists the models served)",
                       param="model", code="model_not_found")
    return model_object(model, pending.get(model))
