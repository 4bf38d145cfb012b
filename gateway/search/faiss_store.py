"""Faiss store: exact inner product (IndexIDMap2 over IndexFlatIP) on normalized vectors up to
`hnsw_threshold` points, IndexHNSWFlat above it. Row numbers are the Faiss ids; a side table maps them
to string ids. Deletes and replacements tombstone rows; a compaction rebuilds the index once dead rows
pass a fraction of the total (never on every delete). Every write is committed durably: new generation
files (vectors, points, index), then a manifest with their checksums replaced atomically."""
from __future__ import annotations

import contextlib
import json
import shutil
import threading
from pathlib import Path

import faiss
import numpy as np

from gateway.search import durable
from gateway.search.stores import Hit, matches, normalize_rows

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 40
# recall@10 >= 0.95 on 100k random 512-d vectors (bench/bench_search.py measures it)
HNSW_EF_SEARCH = 128
COMPACT_FRACTION = 0.2
COMPACT_MIN_DEAD = 256
# searches come one query per call from many threads (the gateway's to_thread): OpenMP teams per call
# thrash on a small box (seen: flat search at concurrency 16 at 7 searches/s); one thread per call
faiss.omp_set_num_threads(1)


class ReadWriteLock:
    """Many searches at once (Faiss releases the GIL), a write alone."""

    def __init__(self):
        self._cond, self._readers, self._writer = threading.Condition(), 0, False

    @contextlib.contextmanager
    def read(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._writer)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._writer and not self._readers)
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class FaissStore:
    def __init__(self, folder: Path, dimension: int, hnsw_threshold: int = 50_000,
                 ef_search: int = HNSW_EF_SEARCH):
        self.folder, self.dimension = Path(folder), dimension
        self.hnsw_threshold, self.ef_search = hnsw_threshold, ef_search
        self._lock = ReadWriteLock()
        self.vectors = np.zeros((0, dimension), dtype=np.float32)
        self.row_ids: list[str | None] = []  # None: tombstone
        self.row_of: dict[str, int] = {}
        self.payloads: dict[str, dict] = {}
        self.generation = 0
        self.index = None
        manifest = self.folder / "manifest.json"
        if manifest.exists():
            self._load(durable.read_json(manifest))
        else:
            self.index = self._new_index(0)

    # ----- index -----
    @property
    def hnsw(self) -> bool:
        return isinstance(self.index, faiss.IndexHNSWFlat)

    def _new_index(self, rows: int):
        if rows > self.hnsw_threshold:
            index = faiss.IndexHNSWFlat(self.dimension, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            index.hnsw.efSearch = self.ef_search
            return index
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dimension))

    def _add_rows(self, start: int, vectors: np.ndarray) -> None:
        if self.hnsw:
            self.index.add(vectors)  # sequential ids: row numbers
        else:
            self.index.add_with_ids(vectors, np.arange(start, start + len(vectors), dtype=np.int64))

    def _rebuild(self) -> None:
        """Drop tombstones and build the right kind of index for the live rows (compaction)."""
        alive = [r for r, i in enumerate(self.row_ids) if i is not None]
        self.vectors = np.ascontiguousarray(self.vectors[alive])
        self.row_ids = [self.row_ids[r] for r in alive]
        self.row_of = {i: r for r, i in enumerate(self.row_ids)}
        self.index = self._new_index(len(self.row_ids))
        if len(self.row_ids):
            self._add_rows(0, self.vectors)

    @property
    def dead(self) -> int:
        return len(self.row_ids) - len(self.row_of)

    # ----- writes -----
    def upsert(self, ids: list[str], vectors: np.ndarray, payloads: list[dict]) -> None:
        vectors = normalize_rows(vectors)
        if vectors.shape != (len(ids), self.dimension):
            raise ValueError(f"vectors shape {vectors.shape} != ({len(ids)}, {self.dimension})")
        last = {pid: k for k, pid in enumerate(ids)}  # a repeated id within one call: the last wins
        keep = sorted(last.values())
        ids, vectors, payloads = [ids[k] for k in keep], vectors[keep], [payloads[k] for k in keep]
        with self._lock.write():
            self._tombstone([i for i in ids if i in self.row_of])
            start = len(self.row_ids)
            self.vectors = np.concatenate([self.vectors, vectors]) if start else vectors.copy()
            self.row_ids.extend(ids)
            for k, pid in enumerate(ids):
                self.row_of[pid] = start + k
                self.payloads[pid] = payloads[k]
            if not self.hnsw and len(self.row_of) > self.hnsw_threshold:
                self._rebuild()
            else:
                self._add_rows(start, vectors)
            self._maybe_compact()
            self._commit()

    def _tombstone(self, ids: list[str]) -> None:
        rows = [self.row_of.pop(i) for i in ids]
        for r, i in zip(rows, ids):
            self.row_ids[r] = None
            self.payloads.pop(i, None)
        if rows and not self.hnsw:
            self.index.remove_ids(np.asarray(rows, dtype=np.int64))

    def _maybe_compact(self) -> None:
        if self.dead >= max(COMPACT_MIN_DEAD, COMPACT_FRACTION * len(self.row_ids)):
            self._rebuild()

    def delete(self, ids: list[str]) -> int:
        with self._lock.write():
            present = [i for i in dict.fromkeys(ids) if i in self.row_of]
            if present:
                self._tombstone(present)
                self._maybe_compact()
                self._commit()
            return len(present)

    # ----- reads -----
    def count(self) -> int:
        return len(self.row_of)

    def search(self, vector: np.ndarray, limit: int, filter: dict | None = None) -> list[Hit]:
        query = normalize_rows(vector)
        with self._lock.read():
            if not self.row_of:
                return []
            if filter:
                return self._exact(query, limit, [self.row_of[i] for i, p in self.payloads.items()
                                                   if matches(p, filter)])
            fetch = min(len(self.row_ids), limit + self.dead if not self.hnsw else limit + self.dead + limit)
            params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, fetch)) if self.hnsw else None
            scores, rows = self.index.search(query, fetch, params=params)
            hits = [(float(s), int(r)) for s, r in zip(scores[0], rows[0])
                    if r >= 0 and self.row_ids[r] is not None]
            return [self._hit(r, s) for s, r in hits[:limit]]

    def _exact(self, query: np.ndarray, limit: int, rows: list[int]) -> list[Hit]:
        if not rows:
            return []
        rows_arr = np.asarray(rows)
        scores = self.vectors[rows_arr] @ query[0]
        top = np.argsort(-scores, kind="stable")[:limit]
        return [self._hit(int(rows_arr[t]), float(scores[t])) for t in top]

    def exact_search(self, vector: np.ndarray, limit: int) -> list[Hit]:
        """Brute force over every live row: the reference for recall."""
        with self._lock.read():
            return self._exact(normalize_rows(vector), limit, list(self.row_of.values()))

    def _hit(self, row: int, score: float) -> Hit:
        pid = self.row_ids[row]
        return Hit(pid, score, self.payloads[pid])

    # ----- persistence -----
    def _commit(self) -> None:
        gen = self.generation + 1
        files = {}
        vec_name, pts_name = f"vectors-{gen}.npy", f"points-{gen}.json"
        files[vec_name] = durable.write_bytes(self.folder / vec_name, _npy(self.vectors))
        points = {"row_ids": self.row_ids, "payloads": self.payloads}
        files[pts_name] = durable.write_json(self.folder / pts_name, points)
        if self.hnsw:  # a flat index is rebuilt from the vectors in no time; HNSW is not
            idx_name = f"index-{gen}.faiss"
            files[idx_name] = durable.write_bytes(self.folder / idx_name,
                                                  faiss.serialize_index(self.index).tobytes())
        durable.write_json(self.folder / "manifest.json", {"generation": gen, "files": files})
        self.generation = gen
        for old in self.folder.iterdir():  # the previous generation is no longer referenced
            if old.name != "manifest.json" and old.name not in files:
                old.unlink(missing_ok=True)

    def _load(self, manifest: dict) -> None:
        gen, files = manifest["generation"], manifest["files"]
        read = {name: durable.read_checked(self.folder / name, sha) for name, sha in files.items()}
        import io

        self.vectors = np.load(io.BytesIO(read[f"vectors-{gen}.npy"]), allow_pickle=False)
        points = json.loads(read[f"points-{gen}.json"])
        self.row_ids, self.payloads = points["row_ids"], points["payloads"]
        self.row_of = {i: r for r, i in enumerate(self.row_ids) if i is not None}
        self.generation = gen
        idx = read.get(f"index-{gen}.faiss")
        if idx is not None:
            self.index = faiss.deserialize_index(np.frombuffer(idx, dtype=np.uint8))
            self.index.hnsw.efSearch = self.ef_search
        else:
            self.index = self._new_index(0)
            alive = np.asarray(sorted(self.row_of.values()), dtype=np.int64)
            if len(alive):
                self.index.add_with_ids(np.ascontiguousarray(self.vectors[alive]), alive)

    def close(self) -> None:
        pass  # every write is already on disk

    def destroy(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()
