"""The collections service without a server: metadata persisted and reopened, a torn store file named
in the collection's error while the others open, conflicts, drop."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateway.errors import BadRequest, Conflict, NotFound, Unavailable
from gateway.search.collections import CollectionInfo, Collections, check_ids, check_name
from gateway.settings import Settings


def info(name, store="faiss", dim=8):
    return CollectionInfo(name=name, model="demo_models/clip-demo", pretrained=None, store=store,
                          distance="cosine", dimension=dim)


def service(tmp_path) -> Collections:
    s = Collections(Settings(data_dir=tmp_path))
    s.start()
    return s


def test_collections_reopen_and_a_torn_file_is_named(tmp_path):
    async def scenario():
        s = service(tmp_path)
        v = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
        for name, store in (("a", "faiss"), ("b", "faiss"), ("q", "qdrant")):
            assert await s.create(info(name, store)) is True
            await s.upsert(name, [f"p{i}" for i in range(5)], v, [{"i": i} for i in range(5)])
        assert await s.create(info("a")) is False
        with pytest.raises(Conflict):
            await s.create(info("a", dim=16))
        s.close()
        victim = next((tmp_path / "collections" / "faiss" / "b").glob("points-*.json"))
        victim.write_text("{torn")
        again = service(tmp_path)
        try:
            assert (await again.describe("a"))["count"] == 5 and (await again.describe("q"))["count"] == 5
            assert (await again.search("q", v[2], 1, None))[0].id == "p2"
            broken = await again.describe("b")
            assert broken["count"] is None and victim.name in broken["error"]
            with pytest.raises(Unavailable, match=victim.name):
                await again.search("b", v[0], 1, None)
            await again.drop("b")
            with pytest.raises(NotFound):
                await again.describe("b")
            assert not (tmp_path / "collections" / "faiss" / "b").exists()
        finally:
            again.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("bad", ["", "a/b", "..", "a.b", "x" * 65, "a b", "é"])
def test_names_and_ids_are_restricted(bad):
    with pytest.raises(BadRequest):
        check_name(bad)
    with pytest.raises(BadRequest):
        check_ids(["ok", "x" * 129 if len(bad) > 64 else bad])
    check_name("Photos_2024-a")
