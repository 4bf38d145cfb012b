"""Qdrant store: the same client calls against local mode (`QdrantClient(path=...)`, one client for all
collections of a folder: local mode locks it) or a Qdrant server/cluster (`QdrantClient(url=QDRANT_URL)`).
String ids become deterministic uuid5 point ids; the original id is kept in the payload under ID_KEY.
Payload filters are Qdrant's own Filter/FieldCondition."""
from __future__ import annotations

import contextlib
import threading
import uuid

import numpy as np
from qdrant_client import QdrantClient, models

from gateway.search.stores import Hit, normalize_rows

ID_KEY = "__id"  # reserved payload key (user payload keys starting with "__" are refused)
NAMESPACE = uuid.UUID("6f1d3a5e-3c1b-4d8e-9a47-0c2f7e5b9d10")


def point_id(pid: str) -> str:
    return str(uuid.uuid5(NAMESPACE, pid))


def open_client(path=None, url: str | None = None) -> QdrantClient:
    return QdrantClient(url=url) if url else QdrantClient(path=str(path))


def to_filter(filter: dict | None) -> models.Filter | None:
    if not filter:
        return None
    return models.Filter(must=[models.FieldCondition(key=k, match=models.MatchValue(value=v))
                               for k, v in filter.items()])


class QdrantStore:
    def __init__(self, client: QdrantClient, collection: str, dimension: int,
                 lock: threading.Lock | None = None, fresh: bool = False):
        # local mode is plain Python over one SQLite file: the service serializes its calls with `lock`
        self.client, self.collection, self.dimension = client, collection, dimension
        self.lock = lock or contextlib.nullcontext()
        with self.lock:
            self._create(fresh)

    def _create(self, fresh: bool) -> None:
        """`fresh`: a collection of that name is a leftover (a drop a crash cut short): replaced, not reused."""
        client, collection, dimension = self.client, self.collection, self.dimension
        if fresh and client.collection_exists(collection):
            client.delete_collection(collection)
        if not client.collection_exists(collection):
            client.create_collection(collection, vectors_config=models.VectorParams(
                size=dimension, distance=models.Distance.COSINE))

    def upsert(self, ids: list[str], vectors: np.ndarray, payloads: list[dict]) -> None:
        vectors = normalize_rows(vectors)
        points = [models.PointStruct(id=point_id(pid), vector=vec.tolist(), payload={**payload, ID_KEY: pid})
                  for pid, vec, payload in zip(ids, vectors, payloads)]
        with self.lock:
            for start in range(0, len(points), 1024):
                self.client.upsert(self.collection, points=points[start:start + 1024], wait=True)

    def delete(self, ids: list[str]) -> int:
        pids = [point_id(i) for i in dict.fromkeys(ids)]
        with self.lock:
            present = len(self.client.retrieve(self.collection, ids=pids, with_payload=False, with_vectors=False))
            if present:
                self.client.delete(self.collection, points_selector=models.PointIdsList(points=pids), wait=True)
        return present

    def search(self, vector: np.ndarray, limit: int, filter: dict | None = None) -> list[Hit]:
        with self.lock:
            result = self.client.query_points(self.collection, query=normalize_rows(vector)[0].tolist(),
                                              limit=limit, query_filter=to_filter(filter), with_payload=True)
        hits = []
        for p in result.points:
            payload = dict(p.payload or {})
            pid = payload.pop(ID_KEY)
            hits.append(Hit(pid, float(p.score), payload))
        return hits

    def count(self) -> int:
        with self.lock:
            return self.client.count(self.collection, exact=True).count

    def close(self) -> None:
        pass  # the client is shared by the service, which closes it

    def destroy(self) -> None:
        with self.lock:
            self.client.delete_collection(self.collection)
