"""The collections service: metadata (DATA_DIR/collections/collections.json, written durably), one store
per collection, opened at start-up, writes serialized per collection, store calls run off the event loop.
A collection whose files fail their checksums stays listed with the error naming the file.

A store's life cycle (create, write, drop) happens under its collection's lock, so a write never reaches a
dropped store. A drop is crash-safe: the Faiss folder is first renamed to a marked name (`<name>.dropped-*`,
never a collection name), then the metadata is saved, then the marked folder is removed. At start, a marked
folder is removed, and a listed collection whose folder was marked finishes its drop; a new collection never
opens files it finds on disk (they are left over from a crash: moved aside and removed)."""
from __future__ import annotations

import asyncio
import logging
import re
import shutil
import threading
import uuid
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
DROPPED = ".dropped-"  # a dropped collection's Faiss folder, renamed before anything is deleted


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
        marked = sorted(self._faiss_root.glob(f"*{DROPPED}*")) if self._faiss_root.is_dir() else []
        unfinished = {p.name.partition(DROPPED)[0] for p in marked}
        for name in [n for n, i in self.infos.items() if i.store == "faiss" and n in unfinished
                     and not (self._faiss_root / n).exists()]:
            log.warning("collection %s: finishing a drop a crash interrupted", name)
            del self.infos[name]
            self._save_meta()
        for path in marked:
            shutil.rmtree(path, ignore_errors=True)
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

    @property
    def _faiss_root(self) -> Path:
        return self.folder / "faiss"

    def _open_store(self, info: CollectionInfo, new: bool = False):
        if info.store == "faiss":
            if new:  # files of that name are a crash's leftovers (the metadata does not list it): never opened
                self._remove_faiss_folder(info.name)
            return FaissStore(self._faiss_root / info.name, info.dimension,
                              ann_threshold=self.settings.faiss_ann_threshold)
        from gateway.search.qdrant_store import QdrantStore

        # local mode's folder is this gateway's alone: a collection there that the metadata does not list is
        # a crash's leftover; a Qdrant server's collections may be someone else's and are left alone
        return QdrantStore(self.qdrant(), info.name, info.dimension, self._qdrant_lock,
                           fresh=new and not self.settings.qdrant_url)

    def _save_meta(self) -> None:
        durable.write_json(self.meta_file, {n: asdict(i) for n, i in self.infos.items()})

    def _mark_dropped(self, name: str) -> Path | None:
        """Rename the collection's Faiss folder to a marked name (durably); None if it has none."""
        folder = self._faiss_root / name
        if not folder.exists():
            return None
        marked = folder.with_name(f"{name}{DROPPED}{uuid.uuid4().hex[:8]}")
        folder.rename(marked)
        durable.fsync_dir(folder.parent)
        return marked

    def _remove_faiss_folder(self, name: str) -> None:
        marked = self._mark_dropped(name)
        if marked is not None:
            self._remove_marked(marked)

    @staticmethod
    def _remove_marked(marked: Path) -> None:
        try:
            shutil.rmtree(marked)
        except OSError as exc:  # marked: ignored on open, removed at the next start
            log.warning("could not remove %s (removed at the next start): %s", marked, exc)

    # ----- collections -----
    def info(self, name: str) -> CollectionInfo:
        check_name(name)
        if name not in self.infos:
            raise NotFound(f"collection '{name}' does not exist", param="name")
        return self.infos[name]

    async def describe(self, name: str) -> dict:
        info = self.info(name)
        body = asdict(info)
        if name in self.broken:
            body.update(count=None, error=self.broken[name])
        else:  # Qdrant's count waits for its lock (local mode) or is an HTTP call (QDRANT_URL): off the loop
            body["count"] = await asyncio.to_thread(self.stores[name].count)
        return body

    def _store(self, name: str):
        info = self.info(name)
        self.check_shared(name, info.store)
        if name in self.broken:
            raise Unavailable(f"collection '{name}' failed to open: {self.broken[name]}", retry_after=60)
        return self.stores[name]

    def check_shared(self, name: str, store: str) -> None:
        """With REDIS_URL (several replicas) a collection must live where every replica sees it: a Qdrant
        server (QDRANT_URL). A Faiss collection, or Qdrant's local mode, is one replica's alone."""
        if self.settings.redis_url and (store != "qdrant" or not self.settings.qdrant_url):
            where = "Faiss" if store == "faiss" else "Qdrant's local mode (no QDRANT_URL)"
            raise BadRequest(f"collection '{name}' is in {where}, which only this replica sees, and REDIS_URL "
                             "is set (several replicas serve as one): collections must be shared; set QDRANT_URL "
                             "to a Qdrant server and use \"store\": \"qdrant\"", param="store",
                             code="collection_not_shared")

    async def create(self, info: CollectionInfo) -> bool:
        """True if created, False if it already exists with the same settings (Conflict otherwise)."""
        self.check_shared(info.name, info.store)
        async with self._meta_lock:
            old = self.infos.get(info.name)
            if old is not None:
                if not old.settings_equal(info):
                    raise Conflict(f"collection '{info.name}' exists with other settings: {asdict(old)}",
                                   param="name")
                return False
            async with self._lock(info.name):
                store = await asyncio.to_thread(self._open_store, info, True)
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
            info = self.info(name)  # a drop that held the locks before this one may have taken it
            store = self.stores.get(name)
            if info.store == "faiss":  # mark first: a crash from here on never brings the points back
                if store is not None:
                    await asyncio.to_thread(store.close)
                marked = await asyncio.to_thread(self._mark_dropped, name)
            del self.infos[name]
            try:
                await asyncio.to_thread(self._save_meta)
            except BaseException as exc:
                # listed still, as on disk; its folder is marked: the next start finishes the drop
                self.infos[name] = info
                if info.store == "faiss":
                    self.stores.pop(name, None)
                    self.broken[name] = f"a drop failed half way ({exc!r}); the next start finishes it"
                raise
            self.stores.pop(name, None)
            self.broken.pop(name, None)
            if info.store == "faiss":
                if marked is not None:
                    await asyncio.to_thread(self._remove_marked, marked)
            elif store is not None:
                await asyncio.to_thread(store.destroy)

    def _lock(self, name: str) -> asyncio.Lock:
        return self.locks.setdefault(name, asyncio.Lock())

    # ----- points -----
    async def upsert(self, name: str, ids: list[str], vectors: np.ndarray, payloads: list[dict]) -> int:
        async with self._lock(name):  # the store is looked up under the lock: a drop cannot come between
            store = self._store(name)

            def write() -> int:
                store.upsert(ids, vectors, payloads)
                return store.count()

            return await asyncio.to_thread(write)

    async def delete_points(self, name: str, ids: list[str]) -> int:
        async with self._lock(name):
            store = self._store(name)
            return await asyncio.to_thread(store.delete, ids)

    async def search(self, name: str, vector: np.ndarray, limit: int, filter: dict | None) -> list[Hit]:
        store = self._store(name)
        return await asyncio.to_thread(store.search, vector, limit, filter)
