"""The shipped `ner` and `food_captioning` pipelines over HTTP, one item a request: what the /ui page (and any
HTTP client) calls. Bounds are the gateway's (MAX_TEXT_BYTES, the image bounds) before Triton sees the
request, then the pipeline's own (its INVALID_ARGUMENT becomes a 400 with its message)."""
from __future__ import annotations

import json

from fastapi import APIRouter

from gateway.dependencies import EngineDep, SettingsDep
from gateway.embedding.embed import check_texts
from gateway.embedding.images import image_bytes
from gateway.middleware.strict_json import StrictJSONRoute
from gateway.schemas.pipelines import CaptionRequest, NerRequest
from gateway.triton.engine import string_rows

router = APIRouter(tags=["pipelines"], route_class=StrictJSONRoute)

NER_MODEL, CAPTION_MODEL = "ner", "food_captioning"


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@router.post("/v1/ner", summary="Named entities of a text (the ner pipeline)")
async def ner(body: NerRequest, engine: EngineDep, settings: SettingsDep) -> dict:
    check_texts([body.text], settings, "text")
    out = await engine.infer(NER_MODEL, {"text": string_rows([body.text])}, ["entities"])
    return {"model": NER_MODEL, "entities": json.loads(_text(out["entities"].reshape(-1)[0]))}


@router.post("/v1/caption", summary="Food-11 label, score and caption of an image (the food_captioning pipeline)")
async def caption(body: CaptionRequest, engine: EngineDep, settings: SettingsDep) -> dict:
    data = await image_bytes(body.image, settings)
    out = await engine.infer(CAPTION_MODEL, {"image": string_rows([data])}, ["label", "score", "caption"])
    return {"model": CAPTION_MODEL, "label": _text(out["label"].reshape(-1)[0]),
            "score": float(out["score"].reshape(-1)[0]), "caption": _text(out["caption"].reshape(-1)[0])}
