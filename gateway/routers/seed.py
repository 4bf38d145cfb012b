"""The seed service's endpoints (seed 001), with its request and response shapes: load, infer, unload,
delete, list loaded models, and Triton's inference statistics."""
from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from gateway.dependencies import EmbedderDep, EngineDep, RegistryDep, SettingsDep
from gateway.embedding.embed import check_count
from gateway.embedding.inputs import texts_of
from gateway.embedding.images import image_bytes
from gateway.errors import BadRequest, Conflict, Forbidden, NotFound, responses
from gateway.middleware.strict_json import StrictJSONRoute
from gateway.modelgen import ModelSpec
from gateway.registry import ModelRegistry, model_id
from gateway.schemas.seed import InferRequest, LoadClip, LoadSentenceTransformer, ModelRef

router = APIRouter(tags=["models"], route_class=StrictJSONRoute)


def describe(spec: ModelSpec) -> dict:
    return {"model_name": spec.model_name, "pretrained": spec.pretrained, "kind": spec.kind, "dimension": spec.dimension,
            "runtime": spec.runtime}


def _label(name: str, pretrained: str | None) -> str:
    return name + (f" ({pretrained})" if pretrained else "")


# ?wait=all: answer once every live replica has the model ready (bounded by MODEL_WAIT_S); by default
# once the replica that took the call has it. The answer's "replicas" says where it is ready.
WAIT = Query("one", pattern="^(one|all)$", description="`all`: return once every live replica has the model ready")


async def _load(registry: ModelRegistry, name: str, pretrained: str | None, kind: str, replace: bool,
                wait: str) -> dict:
    spec, already = await registry.load(name, pretrained, kind, replace=replace)
    verb = "is already loaded" if already else ("replaced" if replace else "loaded")
    placement = await registry.placement(model_id(spec.model_name, spec.pretrained), wait_all=wait == "all")
    return {"message": f"Model {_label(name, pretrained)} {verb}.", "model": describe(spec), "replicas": placement}


# the refusals that depend on what is loaded, on disk or on the hub (the document lists them with these rules)
LOAD = responses((NotFound, "neither a folder under MODEL_ROOTS nor a model on the hub"),
                 (Forbidden, "outside MODEL_ROOTS, or a hub download the settings do not allow"),
                 (Conflict, "loaded (or shipped) as another kind of model, or being unloaded"))
SHIPPED = "the model is shipped with the server"


@router.post("/load_sentence_transformer_model", responses=LOAD)
async def load_sentence_transformer_model(body: LoadSentenceTransformer, registry: RegistryDep, wait: str = WAIT):
    return await _load(registry, body.model_name, None, "sentence_transformer", body.replace, wait)


@router.post("/load_clip_model", responses=LOAD)
async def load_clip_model(body: LoadClip, registry: RegistryDep, wait: str = WAIT):
    return await _load(registry, body.model_name, body.pretrained, "clip", body.replace, wait)


@router.post("/unload_model", responses=responses((NotFound, "the model is not loaded"), (Conflict, SHIPPED)))
async def unload_model(body: ModelRef, registry: RegistryDep):
    await registry.unload(body.model_name, body.pretrained)
    return {"message": f"Model {_label(body.model_name, body.pretrained)} unloaded."}


@router.post("/delete_model", responses=responses((NotFound, "the model has no generated files"),
                                                  (Conflict, SHIPPED)))
async def delete_model(body: ModelRef, registry: RegistryDep):
    await registry.delete(body.model_name, body.pretrained)
    return {"message": f"Model {_label(body.model_name, body.pretrained)} deleted."}


@router.get("/loaded_models")
async def loaded_models(registry: RegistryDep, settings: SettingsDep):
    where = await registry.ready_on()
    replica = settings.replica_id

    def placed(spec: ModelSpec) -> dict:  # "replicas": the live ones where it is ready
        return {**describe(spec), "replicas": where.get(model_id(spec.model_name, spec.pretrained), [replica])}
    # "reloading": held, but being loaded again into a restarted Triton server (503 until then);
    # "pending": registered in the cluster (REDIS_URL), not ready on this replica yet (a request waits for it)
    return {"models": [placed(spec) for spec in registry.loaded()],
            "reloading": [describe(spec) for spec in registry.reloading()],
            "pending": [{"model_name": r.model_name, "pretrained": r.pretrained, "kind": r.kind,
                         "replicas": where.get(r.id, [])} for r in await registry.pending()]}


@router.post("/infer", responses=responses(
        (NotFound, "the model named is not loaded"),
        (Conflict, "the model named does not embed images (or text), as the request asks")))
async def infer(body: InferRequest, embedder: EmbedderDep, settings: SettingsDep):
    started = time.perf_counter()
    if not body.text and not body.image:
        raise BadRequest("send at least one of text or image", param="text")
    images: list[bytes] = []
    if body.image:
        check_count(body.image, settings, "image")
        images = list(await asyncio.gather(*(image_bytes(v, settings, f"image[{i}]")
                                             for i, v in enumerate(body.image))))
    text_vectors = image_vectors = None
    if body.text:
        truncate = settings.truncate_default if body.truncate is None else body.truncate
        text_vectors = await embedder.embed_texts(body.model_name, texts_of(body.text, "text"), body.pretrained,
                                                  body.normalize, truncate, what="text")
    if images:
        image_vectors = await embedder.embed_images(body.model_name, images, body.pretrained, body.normalize)
    return JSONResponse({"text_embeddings": text_vectors.tolist() if text_vectors is not None else [],
                         "image_embeddings": image_vectors.tolist() if image_vectors is not None else [],
                         "processingTimeMs": round((time.perf_counter() - started) * 1000, 2)})  # see embeddings.py


@router.get("/metrics")
async def metrics(registry: RegistryDep, engine: EngineDep):
    """Triton's inference statistics for the models the gateway serves (ensembles and their steps)."""
    wanted = {name for spec in registry.loaded() for name in (spec.triton_models or spec.ensembles)}
    stats = await engine.statistics()
    return {"model_stats": [m for m in stats.get("model_stats", []) if m.get("name") in wanted]}
