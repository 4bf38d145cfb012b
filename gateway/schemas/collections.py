"""Bodies of the image search endpoints (/collections/...). Unknown fields are refused (extra="forbid"):
a misspelt field of a write must not be dropped silently."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.schemas.images import Image


class CreateCollection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    pretrained: str | None = None
    store: Literal["faiss", "qdrant"] = "faiss"
    distance: Literal["cosine"] = "cosine"


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Any
    image: Image | None = None
    text: str | None = None
    vector: list[float] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class Points(BaseModel):
    model_config = ConfigDict(extra="forbid")
    points: list[Point]


class PointIds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: list[Any]


class Search(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: Image | None = None
    text: str | None = None
    vector: list[float] | None = None
    limit: int = Field(10, description="1 to SEARCH_MAX_LIMIT (100)")  # checked by the route, naming the setting
    filter: dict[str, Any] | None = None
