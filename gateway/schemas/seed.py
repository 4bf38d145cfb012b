"""Bodies of the seed service's endpoints (seed 001): load, unload, delete, infer. Unknown fields are
ignored, as the seed did."""
from __future__ import annotations

from pydantic import BaseModel, Field

from gateway.schemas.text_input import TextListInput


class LoadSentenceTransformer(BaseModel):
    model_name: str = Field(description="hub id (org/name) or a folder under MODEL_ROOTS")
    replace: bool = Field(False, description="already loaded: read its files again and switch to them without "
                                             "downtime (the old one unloads once its requests are done)")


class LoadClip(BaseModel):
    model_name: str = Field(description="open_clip name (ViT-B-32), hub id, or a folder under MODEL_ROOTS")
    pretrained: str | None = Field(None, description="open_clip pretrained tag, e.g. laion2b_s34b_b79k")
    replace: bool = Field(False, description="already loaded: read its files again and switch to them without "
                                             "downtime (the old one unloads once its requests are done)")


class ModelRef(BaseModel):
    model_name: str
    pretrained: str | None = None


class InferRequest(BaseModel):
    model_name: str
    pretrained: str | None = None
    text: TextListInput | None = Field(None, description="a list of strings (token-id arrays are refused)")
    image: list[str] | None = Field(None, description="base64, data: URLs, or allowlisted http(s) URLs")
    normalize: bool = True
    truncate: bool | None = Field(None, description="embed the first tokens of a text over the model's maximum "
                                                    "sequence length instead of refusing it "
                                                    "(default: TRUNCATE_DEFAULT)")
