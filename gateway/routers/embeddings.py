"""POST /v1/embeddings, OpenAI-compatible (the `openai` SDK works unchanged, base64 included). A client that
leaves stops its embeddings (issue 56): its rows still queued in the Coalescer are dropped and no further batch
of it is sent. Its rows count against its owner's share of the Coalescer's queue (the API key's, or without
keys the client address's: gateway/triton/fair_queue.py)."""
from __future__ import annotations

import base64

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.dependencies import EmbedderDep
from gateway.embedding.embed import check_texts, l2_normalize
from gateway.embedding.inputs import texts_of
from gateway.errors import BadRequest, Conflict, NotFound, responses
from gateway.middleware.body_limits import owner_of
from gateway.middleware.strict_json import StrictJSONRoute
from gateway.client_gone import CLIENT_GONE, ClientGone, until_disconnected
from gateway.schemas.embeddings import EmbeddingsRequest

router = APIRouter(tags=["openai"], route_class=StrictJSONRoute)


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Matryoshka truncation: the first N values, re-normalized; 400 when N is out of range."""
    if dimensions is None:
        return vectors
    if not 0 < dimensions <= vectors.shape[1]:
        raise BadRequest(f"dimensions must be between 1 and {vectors.shape[1]} for this model, not {dimensions}",
                         param="dimensions", code="invalid_value")
    return l2_normalize(vectors[:, :dimensions])


def encode(vector: np.ndarray, encoding_format: str):
    """base64 of the little-endian float32 bytes, or the float32 row itself: orjson writes its floats
    straight from numpy (shortest form that reads back as the same float32), no Python list between."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
    return np.ascontiguousarray(vector, dtype=np.float32)


class EmbeddingsResponse(Response):
    """JSON through orjson with numpy arrays allowed: ~20 us for a 384-float vector where json.dumps of
    vector.tolist() took ~250 us (py-spy: JSON encoding was ~11% of the gateway's CPU under load)."""
    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


@router.post("/v1/embeddings", responses=responses(
        (NotFound, "the model named is not loaded"),
        (Conflict, "the model named does not embed text, or `dimensions` is over its own dimension")))
async def embeddings(body: EmbeddingsRequest, request: Request, embedder: EmbedderDep):
    texts = texts_of(body.input)  # token ids: a 400 naming the fix
    check_texts(texts, embedder.settings)
    truncate = embedder.settings.truncate_default if body.truncate is None else body.truncate
    # one dependency on the hot path (each costs ~10 us): the registry is the embedder's
    async with embedder.models.use(body.model) as spec:
        if body.dimensions is not None and body.dimensions > spec.dimension:  # 1..MAX_DIMENSIONS: the schema's
            raise Conflict(f"dimensions must be between 1 and {spec.dimension} for {body.model}, "
                           f"not {body.dimensions}", param="dimensions", code="invalid_value")
        try:
            vectors, tokens = await until_disconnected(
                request, embedder.embed_measured(spec, texts, truncate, owner=owner_of(request.scope)))
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
    tokens = tokens or 0
    vectors = truncate_dimensions(vectors, body.dimensions)
    # a Response object, not a dict: FastAPI's jsonable_encoder would walk every float again (~1.5 ms
    # per 384-float vector)
    return EmbeddingsResponse({"object": "list",
                         "data": [{"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)}
                                  for i, v in enumerate(vectors)],
                         "model": body.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
