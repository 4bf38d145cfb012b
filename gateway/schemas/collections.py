"""Bodies of the image search endpoints (/collections/...). Unknown fields are refused (extra="forbid"):
a misspelt field of a write must not be dropped silently."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class CreateCollection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    pretrained: str | None = None
    store: Literal["faiss", "qdrant"] = "faiss"
    distance: Literal["cosine"] = "cosine"


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Any
    image: str | None = None
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
    image: str | None = None
    text: str | None = None
    vector: list[float] | None = None
    limit: int = 10
    filter: dict[str, Any] | None = None
