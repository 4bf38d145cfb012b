"""The collections service: metadata (DATA_DIR/collections/collections.json, written durably), one store
per collection, opened at start-up, writes serialized per collection, store calls run off the event loop.
A collection whose files fail their checksums stays listed with the error naming the file."""
from __future__ import annotations

import asyncio
import logging
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gateway.errors import BadRequest, Conflict, NotFound, Unavailable
from gateway.search import durable
from gateway.search.faiss_store import FaissStore
from gateway.search.stores import FILTER_TYPES, Hit

log = logging.getLogger("gateway.search")
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
STORES = ("faiss", "qdrant")


def check_name(name: str, what: str = "collection name") -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BadRequest(f"{what} must be 1-64 characters of [A-Za-z0-9_-]", param="name")
    return name


def check_ids(ids: list, param: str = "id") -> list[str]:
    for i in ids:
        if not isinstance(i, str) or not ID_RE.fullmatch(i):
            raise BadRequest(f"point id {str(i)[:80]!r} must be 1-128 characters of [A-Za-z0-9_-]", param=param)
    return ids


def check_filter(filter: dict | None) -> dict | None:
    for key, value in (filter or {}).items():
        if type(value) not in FILTER_TYPES:
            raise BadRequest(f"filter value for {key!r} must be a string, integer or boolean", param="filter")
    return filter or None


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    model: str
    pretrained: str | None
    store: str
    distance: str
    dimension: int

    def settings_equal(self, other: "CollectionInfo") -> bool:
        return asdict(self) == asdict(other)


class Collections:
    def __init__(self, settings):
        self.settings = settings
        self.folder = Path(settings.collections_dir or Path(settings.data_dir) / "collections")
        self.meta_file = self.folder / "collections.json"
        self.infos: dict[str, CollectionInfo] = {}
        self.stores: dict = {}
        self.broken: dict[str, str] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self._meta_lock = asyncio.Lock()
        self._qdrant = None
        self._qdrant_lock = threading.Lock() if not settings.qdrant_url else None

    # ----- life cycle -----
    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.meta_file.exists():
            for name, data in durable.read_json(self.meta_file).items():
                self.infos[name] = CollectionInfo(**data)
        for name, info in self.infos.items():
            try:
                self.stores[name] = self._open_store(info)
            except Exception as exc:  # noqa: BLE001 - reported per collection, the others still open
                log.error("collection %s does not open: %s", name, exc)
                self.broken[name] = str(exc)

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        if self._qdrant is not None:
            self._qdrant.close()
            self._qdrant = None

    def qdrant(self):
        if self._qdrant is None:
            from gateway.search.qdrant_store import open_client

            self._qdrant = open_client(self.folder / "qdrant", self.settings.qdrant_url)
        return self._qdrant

    def _open_store(self, info: CollectionInfo):
        if info.store == "faiss":
            return FaissStore(self.folder / "faiss" / info.name, info.dimension,
                              ann_threshold=self.settings.faiss_ann_threshold)
        from gateway.search.qdrant_store import QdrantStore

        return QdrantStore(self.qdrant(), info.name, info.dimension, self._qdrant_lock)

    def _save_meta(self) -> None:
        durable.write_json(self.meta_file, {n: asdict(i) for n, i in self.infos.items()})

    # ----- collections -----
    def info(self, name: str) -> CollectionInfo:
        check_name(name)
        if name not in self.infos:
            raise NotFound(f"collection '{name}' does not exist", param="name")
        return self.infos[name]

    def describe(self, name: str) -> dict:
        info = self.info(name)
        body = asdict(info)
        if name in self.broken:
            body.update(count=None, error=self.broken[name])
        else:
            body["count"] = self.stores[name].count()
        return body

    def _store(self, name: str):
        self.info(name)
        if name in self.broken:
            raise Unavailable(f"collection '{name}' failed to open: {self.broken[name]}", retry_after=60)
        return self.stores[name]

    async def create(self, info: CollectionInfo) -> bool:
        """True if created, False if it already exists with the same settings (Conflict otherwise)."""
        async with self._meta_lock:
            old = self.infos.get(info.name)
            if old is not None:
                if not old.settings_equal(info):
                    raise Conflict(f"collection '{info.name}' exists with other settings: {asdict(old)}",
                                   param="name")
                return False
            store = await asyncio.to_thread(self._open_store, info)
            self.infos[info.name], self.stores[info.name] = info, store
            try:
                await asyncio.to_thread(self._save_meta)
            except BaseException:
                del self.infos[info.name], self.stores[info.name]
                raise
            return True

    async def drop(self, name: str) -> None:
        self.info(name)
        async with self._meta_lock, self._lock(name):
            info = self.infos.pop(name)
            await asyncio.to_thread(self._save_meta)
            store = self.stores.pop(name, None)
            self.broken.pop(name, None)
            if store is not None:
                await asyncio.to_thread(store.destroy)
            elif info.store == "faiss":
                import shutil

                shutil.rmtree(self.folder / "faiss" / name, ignore_errors=True)

    def _lock(self, name: str) -> asyncio.Lock:
        return self.locks.setdefault(name, asyncio.Lock())

    # ----- points -----
    async def upsert(self, name: str, ids: list[str], vectors: np.ndarray, payloads: list[dict]) -> int:
        store = self._store(name)
        async with self._lock(name):
            await asyncio.to_thread(store.upsert, ids, vectors, payloads)
            return store.count()

    async def delete_points(self, name: str, ids: list[str]) -> int:
        store = self._store(name)
        async with self._lock(name):
            return await asyncio.to_thread(store.delete, ids)

    async def search(self, name: str, vector: np.ndarray, limit: int, filter: dict | None) -> list[Hit]:
        store = self._store(name)
        return await asyncio.to_thread(store.search, vector, limit, filter)
