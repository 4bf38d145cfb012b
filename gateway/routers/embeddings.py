"""POST /v1/embeddings, OpenAI-compatible (the `openai` SDK works unchanged, base64 included)."""
from __future__ import annotations

import asyncio
import base64

import numpy as np
import orjson
from fastapi import APIRouter
from fastapi.responses import Response

from gateway.dependencies import EmbedderDep
from gateway.embedding import offload
from gateway.embedding.embed import l2_normalize
from gateway.embedding.tokens import count_tokens
from gateway.errors import BadRequest
from gateway.middleware.strict_json import StrictJSONRoute
from gateway.schemas.embeddings import EmbeddingsRequest

router = APIRouter(tags=["openai"], route_class=StrictJSONRoute)
INLINE_COUNT_CHARS = 1024  # up to ~0.4 ms (ASCII) of tokenizing on the event loop; more goes to the CPU pool


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


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingsRequest, embedder: EmbedderDep):
    texts = [body.input] if isinstance(body.input, str) else body.input
    # one dependency on the hot path (each costs ~10 us): the registry is the embedder's
    async with embedder.models.use(body.model) as spec:
        if body.dimensions is not None and not 0 < body.dimensions <= spec.dimension:
            raise BadRequest(f"dimensions must be between 1 and {spec.dimension} for {body.model}, "
                             f"not {body.dimensions}", param="dimensions", code="invalid_value")
        if sum(map(len, texts)) <= INLINE_COUNT_CHARS:
            # a few sentences: counting (~45 us for 170 bytes) costs less than the pool's thread hop and
            # the two tasks of a gather (py-spy at c1: ~6% of the loop's time)
            vectors = await embedder.embed_texts(body.model, texts)
            tokens = count_tokens(spec, texts)
        else:
            # counting large texts (~23 ms per 64 KiB) runs in the CPU pool, off the loop, while Triton embeds
            vectors, tokens = await asyncio.gather(embedder.embed_texts(body.model, texts),
                                                   offload.run(count_tokens, spec, texts))
    vectors = truncate_dimensions(vectors, body.dimensions)
    # a Response object, not a dict: FastAPI's jsonable_encoder would walk every float again (~1.5 ms
    # per 384-float vector)
    return EmbeddingsResponse({"object": "list",
                         "data": [{"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)}
                                  for i, v in enumerate(vectors)],
                         "model": body.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
