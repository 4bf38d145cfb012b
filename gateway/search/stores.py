"""The vector store interface both implementations follow, and the pieces they share: cosine scores
over L2-normalized vectors, exact-match payload filters."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

# payload values a filter may match exactly (Qdrant's MatchValue takes these)
FILTER_TYPES = (str, int, bool)


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    payload: dict


class VectorStore(Protocol):
    dimension: int

    def upsert(self, ids: list[str], vectors: np.ndarray, payloads: list[dict]) -> None:
        """Insert or replace (same id) points; durable when it returns."""

    def delete(self, ids: list[str]) -> int:
        """Remove the points that exist; returns how many did. Durable when it returns."""

    def search(self, vector: np.ndarray, limit: int, filter: dict | None = None) -> list[Hit]:
        """The `limit` nearest points by cosine similarity, best first, payload matching `filter` exactly."""

    def count(self) -> int: ...

    def close(self) -> None: ...

    def destroy(self) -> None:
        """Close and remove every persisted file."""


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def matches(payload: dict, filter: dict | None) -> bool:
    """Exact match on every key; bool and int are distinct (True does not match 1)."""
    if not filter:
        return True
    for key, value in filter.items():
        if key not in payload:
            return False
        got = payload[key]
        if type(got) is not type(value) or got != value:
            return False
    return True
