"""Request bodies of the embedding endpoints (OpenAI's and the seed's shapes). Unknown fields are
ignored, as OpenAI's API does; wrong types are a 400 in the gateway's error shape."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, Field


class EmbeddingsRequest(BaseModel):
    model: str = Field(description="a loaded model's name, e.g. sentence-transformers/all-MiniLM-L6-v2",
                       examples=["sentence-transformers/all-MiniLM-L6-v2"])
    input: Union[str, list[str]] = Field(description="a string or a list of strings", examples=["hello world"])
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="keep the first N values and re-normalize")
    user: str | None = None


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
    text: list[str] | None = None
    image: list[str] | None = Field(None, description="base64, data: URLs, or allowlisted http(s) URLs")
    normalize: bool = True
