"""Image search collections (issue 11): create/list/describe/drop collections, upsert and delete points
(images or texts embedded through Triton with the collection's CLIP model, or raw vectors), search by
image, text or vector. Every bound is checked before anything is embedded or written."""
from __future__ import annotations

import time

import numpy as np
from fastapi import APIRouter

from gateway.dependencies import CollectionsDep, EmbedderDep, SettingsDep
from gateway.embedding.embed import Embedder
from gateway.embedding.images import image_bytes
from gateway.errors import BadRequest, Conflict, NotFound, responses
from gateway.middleware.strict_json import StrictJSONRoute
from gateway.schemas.collections import CreateCollection, PointIds, Points, Search
from gateway.search.collections import CollectionInfo, check_filter, check_ids, check_name
from gateway.settings import Settings

router = APIRouter(tags=["search"], route_class=StrictJSONRoute)
# the refusals that depend on the collections and models there are (the document lists them with these rules)
MISSING = (NotFound, "the collection does not exist")
OTHER_DIMENSION = (Conflict, "a vector's dimension is not the collection's")


def one_query(item, where: str) -> str:
    given = [k for k in ("image", "text", "vector") if getattr(item, k) is not None]
    if len(given) != 1:
        raise BadRequest(f"{where} needs exactly one of image, text, vector", param=where)
    return given[0]


def check_vector(vector: list[float], dimension: int, param: str) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float32)
    if array.shape != (dimension,):
        raise Conflict(f"{param} has dimension {array.size}; the collection's is {dimension}", param=param)
    if not np.isfinite(array).all() or not np.linalg.norm(array) > 0:
        raise BadRequest(f"{param} must be finite and non-zero", param=param)
    return array


async def embed(embedder: Embedder, settings: Settings, info: CollectionInfo, kinds: list[str], values: list,
                what: str) -> np.ndarray:
    """Vectors for a mix of images, texts and raw vectors: each kind embedded in one batched call."""
    out = np.zeros((len(values), info.dimension), dtype=np.float32)
    rows = {k: [i for i, kind in enumerate(kinds) if kind == k] for k in ("image", "text", "vector")}
    for i in rows["vector"]:
        out[i] = check_vector(values[i], info.dimension, f"{what}[{i}].vector" if what == "points" else "vector")
    images = [await image_bytes(values[i], settings, what=f"{what}[{i}].image" if what == "points" else "image")
              for i in rows["image"]]
    if images:
        out[rows["image"]] = await embedder.embed_images(info.model, images, info.pretrained)
    if rows["text"]:
        out[rows["text"]] = await embedder.embed_texts(info.model, [values[i] for i in rows["text"]], info.pretrained)
    return out


@router.put("/collections/{name}", responses=responses(
        (NotFound, "the model named is not loaded"),
        (Conflict, "the collection exists with other settings, or the model is not a CLIP model")))
async def create_collection(name: str, body: CreateCollection, service: CollectionsDep, embedder: EmbedderDep):
    check_name(name)
    service.check_shared(name, body.store)  # before the model: refused as asked, whatever it names
    spec = await embedder.model_spec(body.model, body.pretrained)
    if spec.kind != "clip" or not spec.image_model:
        raise Conflict(f"model '{body.model}' is not a CLIP model (load one with POST /load_clip_model)",
                       param="model")
    info = CollectionInfo(name=name, model=body.model, pretrained=body.pretrained, store=body.store,
                          distance=body.distance, dimension=spec.dimension)
    created = await service.create(info)
    return {**await service.describe(name), "created": created}


@router.get("/collections")
async def list_collections(service: CollectionsDep):
    return {"collections": [await service.describe(n) for n in sorted(service.infos)]}


@router.get("/collections/{name}", responses=responses(MISSING))
async def get_collection(name: str, service: CollectionsDep):
    return await service.describe(name)


@router.delete("/collections/{name}", responses=responses(MISSING))
async def delete_collection(name: str, service: CollectionsDep):
    await service.drop(name)
    return {"deleted": name}


@router.post("/collections/{name}/points", responses=responses(MISSING, OTHER_DIMENSION))
async def upsert_points(name: str, body: Points, service: CollectionsDep, embedder: EmbedderDep,
                        settings: SettingsDep):
    info = service.info(name)
    if not body.points:
        raise BadRequest("points is empty", param="points")
    if len(body.points) > settings.search_max_points:
        raise BadRequest(f"{len(body.points)} points, over the limit of {settings.search_max_points} per request "
                         "(SEARCH_MAX_POINTS)", param="points")
    ids = check_ids([p.id for p in body.points], "points.id")
    for i, point in enumerate(body.points):
        one_query(point, f"points[{i}]")
        for key in point.payload:
            if key.startswith("__"):
                raise BadRequest(f"points[{i}].payload key {key!r}: keys starting with '__' are reserved",
                                 param="payload")
    kinds = [one_query(p, "point") for p in body.points]
    vectors = await embed(embedder, settings, info, kinds, [getattr(p, k) for p, k in zip(body.points, kinds)],
                          "points")
    count = await service.upsert(name, ids, vectors, [p.payload for p in body.points])
    return {"upserted": len(ids), "count": count}


@router.delete("/collections/{name}/points", responses=responses(MISSING))
async def delete_points(name: str, body: PointIds, service: CollectionsDep, settings: SettingsDep):
    service.info(name)
    if len(body.ids) > settings.search_max_points:
        raise BadRequest(f"{len(body.ids)} ids, over the limit of {settings.search_max_points} per request "
                         "(SEARCH_MAX_POINTS)", param="ids")
    deleted = await service.delete_points(name, check_ids(body.ids, "ids"))
    return {"deleted": deleted, "count": (await service.describe(name))["count"]}


@router.post("/collections/{name}/search", responses=responses(MISSING, OTHER_DIMENSION))
async def search(name: str, body: Search, service: CollectionsDep, embedder: EmbedderDep, settings: SettingsDep):
    started = time.perf_counter()
    info = service.info(name)
    if not 1 <= body.limit <= settings.search_max_limit:
        raise BadRequest(f"limit must be between 1 and {settings.search_max_limit} (SEARCH_MAX_LIMIT)",
                         param="limit")
    check_filter(body.filter)
    kind = one_query(body, "search")
    vector = (await embed(embedder, settings, info, [kind], [getattr(body, kind)], "query"))[0]
    hits = await service.search(name, vector, body.limit, body.filter)
    return {"results": [{"id": h.id, "score": h.score, "payload": h.payload} for h in hits],
            "processingTimeMs": (time.perf_counter() - started) * 1000}
