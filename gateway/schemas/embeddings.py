"""The body of POST /v1/embeddings (OpenAI's shape). Unknown fields are ignored, as OpenAI's API does."""
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
