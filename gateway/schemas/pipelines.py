"""Bodies of the shipped pipelines' endpoints (/v1/ner, /v1/caption): one item a request; unknown fields
are refused."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class NerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class CaptionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str  # base64, a data: URL, or an allowlisted http(s) URL (as /v1/embeddings' images)
