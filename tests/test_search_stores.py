"""Both vector stores through the same tests (add, replace, delete, filter, reopen, same exact top-k),
Faiss approximate-index recall against exact search, compaction, and checksummed persistence (snapshot
files and the append-only log: torn tails, corruption, replay, snapshot compaction)."""
from __future__ import annotations

import numpy as np
import pytest

from gateway.search import faiss_store
from gateway.search.durable import RECORD_HEADER, CorruptFile
from gateway.search.faiss_store import FaissStore
from gateway.search.stores import normalize_rows

DIM = 16


class QdrantFactory:
    """Qdrant local mode: one client per folder (it locks the folder), reopened like the service does."""

    def __init__(self, folder):
        self.folder, self.client = folder, None

    def __call__(self, dimension=DIM):
        from gateway.search.qdrant_store import QdrantStore, open_client

        if self.client is None:
            self.client = open_client(self.folder / "qdrant")
        return QdrantStore(self.client, "points", dimension)

    def reopen(self, dimension=DIM):
        self.client.close()
        self.client = None
        return self(dimension)

    def close(self):
        if self.client is not None:
            self.client.close()


class FaissFactory:
    def __init__(self, folder):
        self.folder = folder

    def __call__(self, dimension=DIM):
        return FaissStore(self.folder / "faiss", dimension)

    reopen = __call__

    def close(self):
        pass


@pytest.fixture(params=["faiss", "qdrant"])
def make(request, tmp_path):
    factory = (FaissFactory if request.param == "faiss" else QdrantFactory)(tmp_path)
    yield factory
    factory.close()


def vectors(n, dim=DIM, seed=0):
    return normalize_rows(np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32))


def ids_of(hits):
    return [h.id for h in hits]


def test_add_search_scores_are_cosine_best_first(make):
    store = make()
    v = vectors(50)
    store.upsert([f"p{i}" for i in range(50)], v * 3.0, [{"i": i} for i in range(50)])  # not normalized on input
    assert store.count() == 50
    hits = store.search(v[7], 5)
    assert hits[0].id == "p7" and hits[0].payload == {"i": 7}
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    expected = np.sort(v @ v[7])[::-1][:5]
    np.testing.assert_allclose([h.score for h in hits], expected, atol=1e-5)


def test_replace_same_id_and_delete(make):
    store = make()
    v = vectors(20)
    store.upsert([f"p{i}" for i in range(20)], v, [{"v": 1}] * 20)
    store.upsert(["p3"], v[10:11], [{"v": 2}])
    assert store.count() == 20
    hits = store.search(v[10], 2)
    assert set(ids_of(hits)) == {"p3", "p10"} and {h.payload["v"] for h in hits} == {1, 2}
    assert "p3" not in ids_of(store.search(v[3], 20)[:1])
    assert store.delete(["p10", "p3", "nope"]) == 2
    assert store.count() == 18
    assert not {"p3", "p10"} & set(ids_of(store.search(v[10], 18)))
    assert store.delete(["p3"]) == 0


def test_filter_is_exact_match(make):
    store = make()
    v = vectors(60)
    payloads = [{"colour": ["red", "green", "blue"][i % 3], "n": i % 2, "flag": bool(i % 2)} for i in range(60)]
    store.upsert([f"p{i}" for i in range(60)], v, payloads)
    hits = store.search(v[0], 100, {"colour": "green", "n": 1})
    assert hits and all(h.payload["colour"] == "green" and h.payload["n"] == 1 for h in hits)
    assert sorted(ids_of(hits)) == sorted(f"p{i}" for i in range(60) if i % 3 == 1 and i % 2 == 1)
    assert store.search(v[0], 5, {"colour": "purple"}) == []
    assert all(h.payload["flag"] is True for h in store.search(v[0], 100, {"flag": True}))


def test_reopen_gives_the_same_results(make):
    store = make()
    v = vectors(200, seed=1)
    store.upsert([f"p{i}" for i in range(200)], v, [{"i": i} for i in range(200)])
    store.delete([f"p{i}" for i in range(0, 200, 7)])
    queries = vectors(10, seed=2)
    before = [[(h.id, round(h.score, 5)) for h in store.search(q, 10)] for q in queries]
    store.close()
    again = make.reopen()
    assert again.count() == 200 - len(range(0, 200, 7))
    assert [[(h.id, round(h.score, 5)) for h in again.search(q, 10)] for q in queries] == before


def test_both_stores_give_the_same_exact_top_k(tmp_path):
    v, queries = vectors(500, seed=3), vectors(20, seed=4)
    ids = [f"p{i}" for i in range(500)]
    faiss_store, qdrant = FaissFactory(tmp_path)(), QdrantFactory(tmp_path)
    try:
        q_store = qdrant()
        for store in (faiss_store, q_store):
            store.upsert(ids, v, [{}] * 500)
        for q in queries:
            assert ids_of(faiss_store.search(q, 10)) == ids_of(q_store.search(q, 10))
    finally:
        qdrant.close()


def test_approximate_recall_at_10_against_exact(tmp_path):
    """20k random normalized 512-d vectors (CLIP's size; the hardest case for an approximate index),
    ingested in batches as the gateway does."""
    n, dim = 20_000, 512
    store = FaissStore(tmp_path / "ann", dim, ann_threshold=1_000)
    v = vectors(n, dim, seed=5)
    for lo in range(0, n, 5_000):
        store.upsert([f"p{i}" for i in range(lo, lo + 5_000)], v[lo:lo + 5_000], [{}] * 5_000)
    assert store.approximate
    queries = vectors(200, dim, seed=6)
    recall = np.mean([len(set(ids_of(store.search(q, 10))) & set(ids_of(store.exact_search(q, 10)))) / 10
                      for q in queries])
    assert recall >= 0.95, recall


def test_tombstones_then_compaction_without_rebuild_per_delete(tmp_path):
    store = FaissStore(tmp_path / "c", DIM, ann_threshold=100)
    v = vectors(1000, seed=7)
    store.upsert([f"p{i}" for i in range(1000)], v, [{}] * 1000)
    assert store.approximate
    index = store.index
    store.delete(["p1", "p2"])
    assert store.index is index and store.dead == 2, "a delete only tombstones"
    assert not {"p1", "p2"} & set(ids_of(store.search(v[1], 10)))
    store.delete([f"p{i}" for i in range(3, 300)])
    assert store.dead == 0 and store.index is not index and store.count() == 701, "compacted"
    assert ids_of(store.search(v[500], 1)) == ["p500"]


def test_a_torn_file_is_reported_by_name(tmp_path):
    store = FaissStore(tmp_path / "t", DIM)
    store.upsert(["a", "b"], vectors(2), [{}, {}])
    store.compact()
    victim = next(p for p in (tmp_path / "t").iterdir() if p.name.startswith("vectors-"))
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(CorruptFile, match=victim.name):
        FaissStore(tmp_path / "t", DIM)


def test_an_unfinished_write_leaves_the_last_acknowledged_state(tmp_path):
    store = FaissStore(tmp_path / "u", DIM)
    v = vectors(3)
    store.upsert(["a", "b"], v[:2], [{}, {}])
    (tmp_path / "u" / "vectors-2.npy.tmp").write_bytes(b"half a write")  # crashed before the manifest
    again = FaissStore(tmp_path / "u", DIM)
    assert again.count() == 2 and ids_of(again.search(v[1], 1)) == ["b"]


# ----- the append-only log -----
def log_file(folder):
    return next(folder.glob("log-*.wal"))


def results(store, queries, limit=10):
    return [[(h.id, round(h.score, 5), tuple(sorted(h.payload.items()))) for h in store.search(q, limit)]
            for q in queries]


def test_a_write_appends_to_the_log_and_rewrites_no_snapshot(tmp_path):
    store = FaissStore(tmp_path / "w", DIM)
    store.upsert(["a", "b"], vectors(2), [{}, {}])
    generation, log, size = store.generation, log_file(tmp_path / "w"), log_file(tmp_path / "w").stat().st_size
    snapshot = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "w").iterdir() if p != log}
    store.upsert(["c"], vectors(3)[2:], [{"k": "v"}])
    store.delete(["a"])
    assert store.generation == generation and log_file(tmp_path / "w") == log
    assert log.stat().st_size > size + 2 * RECORD_HEADER.size + DIM * 4
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "w").iterdir() if p != log} == snapshot


def test_a_torn_log_tail_opens_to_the_last_complete_batch(tmp_path):
    folder, v = tmp_path / "torn", vectors(30, seed=8)
    store = FaissStore(folder, DIM)
    store.upsert([f"a{i}" for i in range(10)], v[:10], [{"batch": 1}] * 10)
    complete = log_file(folder).stat().st_size
    store.upsert([f"b{i}" for i in range(10)], v[10:20], [{"batch": 2}] * 10)
    store.close()
    log = log_file(folder)
    log.write_bytes(log.read_bytes()[:complete + RECORD_HEADER.size + 40])  # the crash cut batch 2 short
    again = FaissStore(folder, DIM)
    assert again.count() == 10 and ids_of(again.search(v[15], 1)) != ["b5"]
    assert log.stat().st_size == complete, "the torn tail is cut off so that appends follow batch 1"
    again.upsert(["c0"], v[20:21], [{"batch": 3}])
    again.close()
    third = FaissStore(folder, DIM)
    assert third.count() == 11 and ids_of(third.search(v[20], 1)) == ["c0"]


@pytest.mark.parametrize("cut", [3, RECORD_HEADER.size - 1])
def test_a_log_cut_inside_the_first_record_header_opens_empty(tmp_path, cut):
    folder = tmp_path / "h"
    FaissStore(folder, DIM).upsert(["a"], vectors(1), [{}])
    log = log_file(folder)
    log.write_bytes(log.read_bytes()[:cut])
    assert FaissStore(folder, DIM).count() == 0


def two_batches_with_a_flipped_byte(folder, v, where: int):
    """Two acknowledged writes of 10 points (a*, b*), then one byte of the log flipped; returns the log
    (a flipped length field would reach past the end)."""
    store = FaissStore(folder, DIM)
    store.upsert([f"a{i}" for i in range(10)], v[:10], [{}] * 10)
    store.upsert([f"b{i}" for i in range(10)], v[10:], [{}] * 10)
    store.close()
    log = log_file(folder)
    data = bytearray(log.read_bytes())
    data[where] ^= 0xFF
    log.write_bytes(bytes(data))
    return log


@pytest.mark.parametrize("where", [RECORD_HEADER.size + 8, 9], ids=["body", "length-field"])
def test_a_damaged_record_before_the_tail_is_an_error_naming_the_log(tmp_path, where):
    folder, v = tmp_path / "bad", vectors(20, seed=9)
    log = two_batches_with_a_flipped_byte(folder, v, where)  # inside the first, acknowledged, record
    with pytest.raises(CorruptFile, match=log.name):
        FaissStore(folder, DIM)


def test_a_damaged_last_record_of_full_length_is_a_torn_tail(tmp_path):
    folder, v = tmp_path / "last", vectors(20, seed=10)
    two_batches_with_a_flipped_byte(folder, v, -5)  # pages of an interrupted append written out of order
    assert sorted(ids_of(FaissStore(folder, DIM).search(v[0], 20))) == sorted(f"a{i}" for i in range(10))


@pytest.mark.parametrize("threshold", [10_000, 100], ids=["exact", "approximate"])
@pytest.mark.parametrize("compact_first", [False, True], ids=["from-log", "from-snapshot"])
def test_deletes_and_replacements_survive_reopen(tmp_path, threshold, compact_first):
    folder, v = tmp_path / "dr", vectors(1200, seed=11)
    store = FaissStore(folder, DIM, ann_threshold=threshold)
    store.upsert([f"p{i}" for i in range(1000)], v[:1000], [{"v": 1}] * 1000)
    store.upsert([f"p{i}" for i in range(0, 100)], v[1000:1100], [{"v": 2}] * 100)  # replacements
    store.delete([f"p{i}" for i in range(100, 150)] + ["p0"])
    if compact_first:
        store.compact()
    queries = np.concatenate([v[1000:1010], v[100:105], vectors(5, seed=12)])
    before = results(store, queries)
    store.close()
    again = FaissStore(folder, DIM, ann_threshold=threshold)
    assert again.count() == 1000 - 51 and again.approximate == (threshold == 100)
    assert results(again, queries) == before
    assert ids_of(again.search(v[1005], 1)) == ["p5"] and again.search(v[1005], 1)[0].payload == {"v": 2}
    assert not {f"p{i}" for i in range(100, 150)} & set(ids_of(again.search(v[120], 50)))


def test_compaction_keeps_results_identical_and_drops_old_files(tmp_path, monkeypatch):
    monkeypatch.setattr(faiss_store, "LOG_MIN_BYTES", 4096)  # a snapshot every few writes
    folder, v = tmp_path / "cmp", vectors(1500, seed=13)
    store = FaissStore(folder, DIM, ann_threshold=500)
    reference = FaissStore(tmp_path / "ref", DIM, ann_threshold=500)
    for lo in range(0, 1500, 100):
        for s in (store, reference):
            s.upsert([f"p{i}" for i in range(lo, lo + 100)], v[lo:lo + 100], [{"lo": lo}] * 100)
            s.delete([f"p{lo + 1}"])
    assert store.generation > 3, "the log was compacted into snapshots several times"
    queries = vectors(20, seed=14)
    assert results(store, queries) == results(reference, queries)
    store.compact()
    assert results(store, queries) == results(reference, queries)
    names = {p.name for p in folder.iterdir()}
    assert names == {"manifest.json", f"vectors-{store.generation}.npy", f"points-{store.generation}.json",
                     f"index-{store.generation}.faiss", f"log-{store.generation}.wal"}
    store.close()
    assert results(FaissStore(folder, DIM, ann_threshold=500), queries) == results(reference, queries)


def test_a_failed_append_writes_and_applies_nothing(tmp_path, monkeypatch):
    folder, v = tmp_path / "fail", vectors(3, seed=15)
    store = FaissStore(folder, DIM)
    store.upsert(["a"], v[:1], [{}])
    size = log_file(folder).stat().st_size

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gateway.search.durable.os.fsync", full_disk)
    with pytest.raises(OSError):
        store.upsert(["b"], v[1:2], [{}])
    monkeypatch.undo()
    assert log_file(folder).stat().st_size == size and store.count() == 1
    store.upsert(["c"], v[2:3], [{}])
    store.close()
    assert sorted(ids_of(FaissStore(folder, DIM).search(v[0], 5))) == ["a", "c"]
