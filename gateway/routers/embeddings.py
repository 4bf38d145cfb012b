"""POST /v1/embeddings, OpenAI-compatible (the `openai` SDK works unchanged, base64 included)."""
from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.embedding import embed_texts, l2_normalize
from gateway import offload
from gateway.errors import BadRequest
from gateway.schemas import EmbeddingsRequest
from gateway.tokens import count_tokens
from gateway.strict_json import StrictJSONRoute

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
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request):
    texts = [body.input] if isinstance(body.input, str) else body.input
    state = request.app.state
    async with state.models.use(body.model) as spec:
        if body.dimensions is not None and not 0 < body.dimensions <= spec.dimension:
            raise BadRequest(f"dimensions must be between 1 and {spec.dimension} for {body.model}, "
                             f"not {body.dimensions}", param="dimensions", code="invalid_value")
        # counting tokens (~20 ms per 64 KiB text) runs in the CPU pool, off the loop, while Triton embeds
        vectors, tokens = await asyncio.gather(embed_texts(state, body.model, texts),
                                               offload.run(count_tokens, spec, texts))
    vectors = truncate_dimensions(vectors, body.dimensions)
    # a JSONResponse of plain lists: FastAPI's jsonable_encoder would walk every float again (~1.5 ms
    # per 384-float vector, as long as json.dumps itself)
    return JSONResponse({"object": "list",
                         "data": [{"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)}
                                  for i, v in enumerate(vectors)],
                         "model": body.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
