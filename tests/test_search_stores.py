"""Both vector stores through the same tests (add, replace, delete, filter, reopen, same exact top-k),
Faiss HNSW recall against exact search, compaction, and checksummed persistence."""
from __future__ import annotations

import numpy as np
import pytest

from gateway.search.durable import CorruptFile
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


def test_hnsw_recall_at_10_against_exact(tmp_path):
    """20k random normalized vectors (small dimension: random high-dimensional vectors have no
    neighbourhood structure for any graph index; bench/bench_search.py reports 512-d)."""
    n, dim = 20_000, 24
    store = FaissStore(tmp_path / "hnsw", dim, hnsw_threshold=1_000)
    v = vectors(n, dim, seed=5)
    store.upsert([f"p{i}" for i in range(n)], v, [{}] * n)
    assert store.hnsw
    queries = vectors(200, dim, seed=6)
    recall = np.mean([len(set(ids_of(store.search(q, 10))) & set(ids_of(store.exact_search(q, 10)))) / 10
                      for q in queries])
    assert recall >= 0.95, recall


def test_tombstones_then_compaction_without_rebuild_per_delete(tmp_path):
    store = FaissStore(tmp_path / "c", DIM, hnsw_threshold=100)
    v = vectors(1000, seed=7)
    store.upsert([f"p{i}" for i in range(1000)], v, [{}] * 1000)
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
