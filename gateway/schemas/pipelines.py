"""Bodies of the shipped pipelines' endpoints (/v1/ner, /v1/caption): one item a request; unknown fields
are refused."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gateway.schemas.images import Image


class NerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class CaptionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: Image
