"""Faiss store: exact inner product (IndexIDMap2 over IndexFlatIP) on normalized vectors up to
`ann_threshold` live points; above it an approximate scan, IndexPQFastScan (4-bit product quantizer,
two dimensions per sub-quantizer), whose best `limit * rerank_factor` candidates are re-scored exactly
against the stored float vectors, so scores stay exact cosine similarities.

Why not HNSW: on 100k random normalized 512-d vectors (the bench's case, this 2-core box) IndexHNSWFlat
(M 32, efConstruction 100) took 78 s to build and reached recall@10 0.80 only at efSearch 1024 (8.9 ms
a query); the fast scan with exact re-ranking reaches 0.995 at 0.6 ms and trains and adds in 2.5 s.

Row numbers are the Faiss ids; a side table maps them to string ids. Deletes and replacements tombstone
rows; a compaction rebuilds the index once dead rows pass a fraction of the total (never on every delete).

Filters (exact match on payload values) read a payload index (payload_index.py: value -> rows), never
every payload. The matching rows are scored exactly when the collection is searched exactly (flat) or
when at most FILTER_EXACT_MAX rows match; otherwise approximate candidates are fetched in rounds, as many
as the matching share says will hold `limit * rerank_factor` matching ones, and those are re-scored
exactly, as an unfiltered search of a collection of the matching points would be. Either way the work
under the read lock is bounded by the matching rows or the candidates, not by the collection's size.

Durability: every acknowledged write is one fsync'd record of an append-only log (durable.AppendLog),
costing its own bytes only. A snapshot (vectors, points, approximate index) and a new empty log replace
the previous ones through an atomically replaced manifest after an index rebuild and whenever the log
outgrows the snapshot, so the bytes written stay proportional to the bytes ingested and reopening
replays a bounded log."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
import threading
from pathlib import Path

import faiss
import numpy as np

from gateway.search import durable
from gateway.search.payload_index import PayloadIndex
from gateway.search.stores import Hit, normalize_rows

log = logging.getLogger("gateway.search")

# candidates per requested result re-scored exactly: recall@10 0.944 / 0.977 / 0.995 at 10 / 16 / 32
# on 100k random 512-d vectors, p50 0.54 / 0.58 / 0.64 ms
RERANK_FACTOR = 32
PQ_BITS = 4  # the fast-scan kernels' code size
# faiss warns below 39 training points per centroid (2**PQ_BITS centroids per sub-quantizer)
TRAIN_MIN = 39 * 2 ** PQ_BITS
TRAIN_MAX = 32_768  # training time grows with the sample, codebook quality hardly does beyond it
# matching rows scored exactly at most (more: approximate candidates in rounds); exact scoring of 512-d
# vectors takes ~1.3 ms per 10k rows on 2 cores
FILTER_EXACT_MAX = 20_000
# a round of candidates that holds this share of the matching candidates wanted is enough (the first
# round is sized to hold all of them, so a second one is rare)
ROUND_ENOUGH = 0.75
COMPACT_FRACTION = 0.2
COMPACT_MIN_DEAD = 256
LOG_MIN_BYTES = 64 << 20  # below this a log replays in well under a second: no snapshot yet
MANIFEST = "manifest.json"


class ReadWriteLock:
    """Many searches at once (Faiss releases the GIL), a write alone. Writer-preferring: once a write
    waits, new searches wait behind it, so a steady stream of overlapping searches cannot starve it."""

    def __init__(self):
        self._cond, self._readers, self._writer = threading.Condition(), 0, False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
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
            self._writers_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._writer and not self._readers)
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class FaissStore:
    def __init__(self, folder: Path, dimension: int, ann_threshold: int = 50_000,
                 rerank_factor: int = RERANK_FACTOR, filter_exact_max: int = FILTER_EXACT_MAX):
        self.folder, self.dimension = Path(folder), dimension
        self.ann_threshold, self.rerank_factor = ann_threshold, rerank_factor
        self.filter_exact_max = filter_exact_max
        self.payload_index = PayloadIndex()
        self.examined = 0  # rows a filtered search read (a statistic: its work, bounded by the matching rows)
        self._lock = ReadWriteLock()  # searches against the in-memory state changing
        self._writer = threading.Lock()  # one write at a time; searches go on while it is logged
        self._buffer = np.zeros((0, dimension), dtype=np.float32)  # rows beyond len(row_ids): spare
        self.row_ids: list[str | None] = []  # None: tombstone
        self.row_of: dict[str, int] = {}
        self.payloads: dict[str, dict] = {}
        self.generation = 0
        self.index = self._flat_index()
        self._log: durable.AppendLog | None = None
        self._snapshot_bytes = 0
        if (self.folder / MANIFEST).exists():
            self._load(durable.read_json(self.folder / MANIFEST))
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._snapshot()

    # ----- index -----
    @property
    def approximate(self) -> bool:
        return isinstance(self.index, faiss.IndexPQFastScan)

    @property
    def vectors(self) -> np.ndarray:
        return self._buffer[:len(self.row_ids)]

    @property
    def dead(self) -> int:
        return len(self.row_ids) - len(self.row_of)

    def _flat_index(self):
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dimension))

    def _wants_ann(self, live: int) -> bool:
        return live > self.ann_threshold and live >= TRAIN_MIN

    def _ann_index(self, live_vectors: np.ndarray):
        # two dimensions per sub-quantizer: with four (half the code size) recall@10 fell from 1.0 to 0.92
        # at 100 candidates per result (100k random 512-d vectors)
        subquantizers = self.dimension // 2 if self.dimension % 2 == 0 else self.dimension
        index = faiss.IndexPQFastScan(self.dimension, subquantizers, PQ_BITS, faiss.METRIC_INNER_PRODUCT)
        # an evenly spread sample: the same rows give the same codebooks
        picks = np.linspace(0, len(live_vectors) - 1, min(len(live_vectors), TRAIN_MAX)).astype(np.int64)
        index.train(np.ascontiguousarray(live_vectors[picks]))
        return index

    def _add_rows(self, start: int, vectors: np.ndarray) -> None:
        if self.approximate:
            self.index.add(vectors)  # sequential ids: row numbers
        else:
            self.index.add_with_ids(vectors, np.arange(start, start + len(vectors), dtype=np.int64))

    def _rebuild(self) -> None:
        """Drop tombstones and build the right kind of index for the live rows (compaction)."""
        faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))  # a build uses every core (per calling thread)
        alive = [r for r, i in enumerate(self.row_ids) if i is not None]
        self._buffer = np.ascontiguousarray(self.vectors[alive])
        self.row_ids = [self.row_ids[r] for r in alive]
        self.row_of = {i: r for r, i in enumerate(self.row_ids)}
        self.payload_index.rebuild((r, self.payloads[i]) for r, i in enumerate(self.row_ids))
        self.index = self._ann_index(self._buffer) if self._wants_ann(len(alive)) else self._flat_index()
        if alive:
            self._add_rows(0, self._buffer)

    def _append_vectors(self, vectors: np.ndarray) -> None:
        """Into spare capacity, doubling it when full: a copy of everything per write would make
        ingest in small batches quadratic."""
        rows, needed = len(self.row_ids), len(self.row_ids) + len(vectors)
        if needed > len(self._buffer):
            grown = np.empty((max(needed, 2 * len(self._buffer)), self.dimension), dtype=np.float32)
            grown[:rows] = self._buffer[:rows]
            self._buffer = grown
        self._buffer[rows:needed] = vectors

    # ----- writes: log the record (durable), then apply it in memory -----
    def upsert(self, ids: list[str], vectors: np.ndarray, payloads: list[dict]) -> None:
        vectors = normalize_rows(vectors)
        if vectors.shape != (len(ids), self.dimension):
            raise ValueError(f"vectors shape {vectors.shape} != ({len(ids)}, {self.dimension})")
        last = {pid: k for k, pid in enumerate(ids)}  # a repeated id within one call: the last wins
        keep = sorted(last.values())
        ids, vectors, payloads = [ids[k] for k in keep], vectors[keep], [payloads[k] for k in keep]
        with self._writer:
            self._log_record({"op": "upsert", "ids": ids, "payloads": payloads}, vectors)
            self._after_write(self._apply_upsert(ids, vectors, payloads))

    def delete(self, ids: list[str]) -> int:
        with self._writer:
            present = [i for i in dict.fromkeys(ids) if i in self.row_of]
            if present:
                self._log_record({"op": "delete", "ids": present})
                self._after_write(self._apply_delete(present))
            return len(present)

    def _apply_upsert(self, ids: list[str], vectors: np.ndarray, payloads: list[dict]) -> bool:
        """True if the index was rebuilt."""
        with self._lock.write():
            self._tombstone([i for i in ids if i in self.row_of])
            start = len(self.row_ids)
            self._append_vectors(vectors)
            self.row_ids.extend(ids)
            for k, pid in enumerate(ids):
                self.row_of[pid] = start + k
                self.payloads[pid] = payloads[k]
                self.payload_index.add(start + k, payloads[k])
            if not self.approximate and self._wants_ann(len(self.row_of)):
                self._rebuild()
                return True
            self._add_rows(start, vectors)
            return self._maybe_compact()

    def _apply_delete(self, ids: list[str]) -> bool:
        with self._lock.write():
            self._tombstone(ids)
            return self._maybe_compact()

    def _tombstone(self, ids: list[str]) -> None:
        rows = [self.row_of.pop(i) for i in ids]
        for r, i in zip(rows, ids):
            self.row_ids[r] = None
            self.payload_index.remove(r, self.payloads.pop(i, {}))
        if rows and not self.approximate:  # the fast-scan index keeps dead rows; searches skip them
            self.index.remove_ids(np.asarray(rows, dtype=np.int64))

    def _maybe_compact(self) -> bool:
        if self.dead >= max(COMPACT_MIN_DEAD, COMPACT_FRACTION * len(self.row_ids)):
            self._rebuild()
            return True
        return False

    def _after_write(self, rebuilt: bool) -> None:
        # a rebuilt index is snapshotted at once: replaying the log would train it again, and a slow
        # reopen would follow; otherwise only once the log is as large as the snapshot
        if rebuilt or self._log.size() >= max(LOG_MIN_BYTES, self._snapshot_bytes):
            try:
                self._snapshot()
            except OSError:  # the write is in the log already: acknowledged all the same
                log.exception("%s: snapshot failed; the log keeps growing until one succeeds", self.folder)

    # ----- reads -----
    def count(self) -> int:
        return len(self.row_of)

    def search(self, vector: np.ndarray, limit: int, filter: dict | None = None) -> list[Hit]:
        # one query per call from many threads (the gateway's to_thread): OpenMP teams per call thrash on
        # a small box; the setting is per calling thread
        faiss.omp_set_num_threads(1)
        query = normalize_rows(vector)
        with self._lock.read():
            if not self.row_of:
                return []
            if filter:
                return self._filtered(query, limit, filter)
            if self.approximate:
                return self._exact(query, limit, self._candidates(query, limit))
            scores, rows = self.index.search(query, min(limit, len(self.row_of)))
            return [self._hit(int(r), float(s)) for s, r in zip(scores[0], rows[0]) if r >= 0]

    def _candidates(self, query: np.ndarray, limit: int) -> list[int]:
        """Live rows among the approximate best, about `limit * rerank_factor` of them whatever the
        share of tombstones."""
        wanted = math.ceil(limit * self.rerank_factor * len(self.row_ids) / len(self.row_of))
        _, rows = self.index.search(query, min(len(self.row_ids), wanted))
        return [int(r) for r in rows[0] if r >= 0 and self.row_ids[r] is not None]

    def _filtered(self, query: np.ndarray, limit: int, filter: dict) -> list[Hit]:
        """The best `limit` points whose payload matches `filter` (module docstring)."""
        postings = self.payload_index.postings(filter)
        matching = postings[0]
        if len(postings) > 1 and matching:  # C-level, over the smallest set
            self.examined += len(matching)
            matching = matching.intersection(*postings[1:])
        if not matching:
            return []
        if self.approximate and len(matching) > self.filter_exact_max:
            return self._exact(query, limit, self._matching_candidates(query, limit, matching))
        self.examined += len(matching)
        rows = np.fromiter(matching, dtype=np.int64, count=len(matching))
        rows.sort()  # ties in score: the earlier row first, as a scan of the points gave them
        return self._exact(query, limit, rows)

    def _matching_candidates(self, query: np.ndarray, limit: int, matching: set[int]) -> list[int]:
        """Matching rows among the approximate best: the first round fetches as many as the matching share
        says will hold `limit * rerank_factor` matching ones; a round that holds too few is followed by
        one four times larger, up to every row."""
        wanted, total = limit * self.rerank_factor, len(self.row_ids)
        fetch = min(total, math.ceil(wanted * total / len(matching)))
        while True:
            _, rows = self.index.search(query, fetch)
            candidates = rows[0].tolist()
            self.examined += len(candidates)
            found = [r for r in candidates if r in matching]  # live rows only: the index holds no dead one
            if len(found) >= ROUND_ENOUGH * wanted or fetch >= total:
                return found
            fetch = min(total, fetch * 4)

    def _exact(self, query: np.ndarray, limit: int, rows) -> list[Hit]:
        if len(rows) == 0:
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
    def _log_record(self, meta: dict, vectors: np.ndarray | None = None) -> None:
        """Body: JSON length (4 bytes), JSON (op, ids, payloads), then the float32 vectors."""
        header = json.dumps(meta).encode()
        body = len(header).to_bytes(4, "little") + header
        self._log.append(body if vectors is None else body + vectors.tobytes())

    def _replay(self, body: bytes) -> None:
        size = int.from_bytes(body[:4], "little")
        meta = json.loads(body[4:4 + size])
        if meta["op"] == "upsert":
            vectors = np.frombuffer(body, dtype=np.float32, offset=4 + size)
            self._apply_upsert(meta["ids"], vectors.reshape(len(meta["ids"]), self.dimension), meta["payloads"])
        else:
            self._apply_delete(meta["ids"])

    def compact(self) -> None:
        """Write a snapshot of the current state and start an empty log."""
        with self._writer:
            self._snapshot()

    def _snapshot(self) -> None:
        gen = self.generation + 1
        files = {f"vectors-{gen}.npy": _npy(self.vectors),
                 f"points-{gen}.json": json.dumps({"row_ids": self.row_ids, "payloads": self.payloads}).encode()}
        if self.approximate:  # a flat index is rebuilt from the vectors in no time; a trained one is not
            files[f"index-{gen}.faiss"] = faiss.serialize_index(self.index).tobytes()
        sums = {name: durable.write_bytes(self.folder / name, data) for name, data in files.items()}
        log_name = f"log-{gen}.wal"
        durable.create_empty(self.folder / log_name)
        durable.write_json(self.folder / MANIFEST, {"generation": gen, "files": sums, "log": log_name})
        self._open_log(log_name)
        self.generation, self._snapshot_bytes = gen, sum(len(data) for data in files.values())
        for old in self.folder.iterdir():  # the previous generation is no longer referenced
            if old.name not in {MANIFEST, log_name, *files}:
                old.unlink(missing_ok=True)

    def _open_log(self, name: str) -> None:
        if self._log is not None:
            self._log.close()
        self._log = durable.AppendLog(self.folder / name)

    def _load(self, manifest: dict) -> None:
        if "log" not in manifest:
            raise durable.CorruptFile(self.folder / MANIFEST, "written before the log format: index the "
                                      "collection again")
        gen, sums = manifest["generation"], manifest["files"]
        read = {name: durable.read_checked(self.folder / name, sha) for name, sha in sums.items()}
        self._buffer = np.load(io.BytesIO(read[f"vectors-{gen}.npy"]), allow_pickle=False)
        points = json.loads(read[f"points-{gen}.json"])
        self.row_ids, self.payloads = points["row_ids"], points["payloads"]
        self.row_of = {i: r for r, i in enumerate(self.row_ids) if i is not None}
        self.payload_index.rebuild((r, self.payloads[i]) for i, r in self.row_of.items())
        self.generation, self._snapshot_bytes = gen, sum(len(data) for data in read.values())
        index = read.get(f"index-{gen}.faiss")
        if index is not None:
            self.index = faiss.deserialize_index(np.frombuffer(index, dtype=np.uint8))
        else:
            alive = np.asarray(sorted(self.row_of.values()), dtype=np.int64)
            if len(alive):
                self.index.add_with_ids(np.ascontiguousarray(self.vectors[alive]), alive)
        self._open_log(manifest["log"])
        for body in self._log.read():
            self._replay(body)

    def close(self) -> None:
        if self._log is not None:  # every acknowledged write is already on disk
            self._log.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()
