"""Collections keep their data right through bad input, races and crashes (issue 34, items 7-11): NaN and
Infinity are refused at parse time; a drop racing an upsert gives the upsert a 404, never a write into a
dropped store; a drop is crash-safe; searches do not starve a write; a zero-filled log tail is cut off."""
from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time

import numpy as np
import pytest

from gateway.errors import NotFound
from gateway.search import durable
from gateway.search.collections import CollectionInfo, Collections
from gateway.search.faiss_store import FaissStore, ReadWriteLock
from gateway.settings import Settings
from inprocess_gateway import inprocess_gateway


def info(name: str, dim: int = 8, store: str = "faiss") -> CollectionInfo:
    return CollectionInfo(name=name, model="m", pretrained=None, store=store, distance="cosine", dimension=dim)


def vectors(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def opened(tmp_path) -> Collections:
    service = Collections(Settings(data_dir=tmp_path))
    service.start()
    return service


# ---- 7: strict JSON -------------------------------------------------------------------------------
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_a_payload_are_refused_with_a_400(tmp_path, constant):
    async def scenario():
        async with inprocess_gateway(tmp_path) as (app, client):
            await app.state.collections.create(info("c"))
            vector = [1.0] + [0.0] * 7
            body = ('{"points": [{"id": "a", "vector": %s, "payload": {"x": %s}}]}'
                    % (json.dumps(vector), constant))
            response = await client.post("/collections/c/points", content=body,
                                         headers={"content-type": "application/json"})
            assert response.status_code == 400, response.text
            assert constant.lstrip("-") in response.json()["error"]["message"]
            # nothing was stored: a search that would have returned it answers
            found = await client.post("/collections/c/search", json={"vector": vector, "limit": 5})
            assert found.status_code == 200 and found.json()["results"] == [], found.text
            # a NaN in a vector, and in another endpoint's body, is refused the same way
            response = await client.post("/collections/c/search", content='{"vector": [NaN, 1, 0, 0, 0, 0, 0, 0]}',
                                         headers={"content-type": "application/json"})
            assert response.status_code == 400 and "NaN" in response.json()["error"]["message"]

    asyncio.run(scenario())


# ---- 8: a drop racing an upsert -------------------------------------------------------------------
def test_an_upsert_queued_behind_a_drop_gets_404_and_never_writes_into_a_recreated_collection(tmp_path):
    async def scenario():
        service = opened(tmp_path)
        await service.create(info("c"))
        lock = service._lock("c")
        await lock.acquire()  # an earlier write in progress
        drop = asyncio.create_task(service.drop("c"))
        await asyncio.sleep(0.05)  # the drop waits for the collection's lock
        upsert = asyncio.create_task(service.upsert("c", ["ghost"], vectors(1), [{}]))
        await asyncio.sleep(0.05)  # the upsert waits behind the drop
        lock.release()
        await drop
        await service.create(info("c"))  # re-created before the upsert runs
        with pytest.raises(NotFound):
            await upsert
        assert (await service.describe("c"))["count"] == 0
        service.close()
        again = opened(tmp_path)  # after a restart the new collection still holds nothing
        assert (await again.describe("c"))["count"] == 0
        again.close()

    asyncio.run(scenario())


# ---- 9: crash-safe drop ---------------------------------------------------------------------------
def test_a_drop_whose_delete_never_happens_does_not_bring_its_points_back(tmp_path, monkeypatch):
    """The folder's removal fails silently or a crash comes before it: a new collection of that name,
    even with another dimension, starts empty."""
    async def scenario():
        service = opened(tmp_path)
        await service.create(info("c", dim=8))
        await service.upsert("c", ["a", "b"], vectors(2), [{}, {}])
        with monkeypatch.context() as patch:
            patch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)  # nothing gets deleted
            await service.drop("c")
        service.close()
        again = opened(tmp_path)  # the restart after the crash
        assert "c" not in again.infos
        assert await again.create(info("c", dim=16))
        assert (await again.describe("c"))["count"] == 0
        await again.upsert("c", ["x"], vectors(1, 16), [{}])
        assert [h.id for h in await again.search("c", vectors(1, 16)[0], 5, None)] == ["x"]
        again.close()
        assert [p.name for p in (tmp_path / "collections" / "faiss").iterdir()] == ["c"]  # leftovers removed

    asyncio.run(scenario())


def test_a_drop_interrupted_after_its_mark_is_finished_at_the_next_start(tmp_path, monkeypatch):
    async def scenario():
        service = opened(tmp_path)
        await service.create(info("c"))
        await service.upsert("c", ["a"], vectors(1), [{}])

        def crash():
            raise OSError("simulated crash before the metadata was saved")

        monkeypatch.setattr(service, "_save_meta", crash)
        with pytest.raises(OSError):
            await service.drop("c")
        service.close()
        again = opened(tmp_path)
        assert "c" not in again.infos and "c" not in again.broken
        assert await again.create(info("c", dim=16)) and (await again.describe("c"))["count"] == 0
        again.close()

    asyncio.run(scenario())


# ---- 10: searches do not starve a write -------------------------------------------------------------
def test_a_waiting_writer_goes_before_readers_that_come_after_it():
    lock, order = ReadWriteLock(), []
    first_reader_in, release_first = threading.Event(), threading.Event()

    def first_reader():
        with lock.read():
            first_reader_in.set()
            release_first.wait(10)

    def writer():
        with lock.write():
            order.append("write")

    def late_reader():
        with lock.read():
            order.append("read")

    threads = [threading.Thread(target=first_reader)]
    threads[0].start()
    first_reader_in.wait(10)
    threads.append(threading.Thread(target=writer))
    threads[1].start()
    time.sleep(0.3)  # the writer is waiting for the first reader
    threads.append(threading.Thread(target=late_reader))
    threads[2].start()
    time.sleep(0.2)
    assert order == [], "a reader that came after a waiting writer went first"
    release_first.set()
    for t in threads:
        t.join(10)
    assert order == ["write", "read"]


# ---- 11: a zero-filled log tail -------------------------------------------------------------------
def test_a_zero_filled_log_tail_is_cut_off_like_a_torn_one(tmp_path):
    store = FaissStore(tmp_path / "s", 8)
    store.upsert(["a", "b"], vectors(2), [{"k": 1}, {"k": 2}])
    store.upsert(["c"], vectors(1, seed=3), [{"k": 3}])
    log_file = store._log.path
    good_size = log_file.stat().st_size
    store.close()
    with open(log_file, "ab") as f:  # what some filesystems leave after a crash: the size, not the data
        f.write(b"\0" * 4096)
    again = FaissStore(tmp_path / "s", 8)
    assert again.count() == 3 and again.payloads["c"] == {"k": 3}
    assert log_file.stat().st_size == good_size
    again.upsert(["d"], vectors(1, seed=4), [{}])  # appends follow the last good record
    again.close()
    assert FaissStore(tmp_path / "s", 8).count() == 4


def test_a_record_cut_short_and_zero_filled_is_a_torn_tail_but_damage_before_good_records_is_not(tmp_path):
    path = tmp_path / "log.wal"
    durable.create_empty(path)
    log = durable.AppendLog(path)
    for body in (b"one", b"two", b"three" * 100):
        log.append(body)
    log.close()
    data = bytearray(path.read_bytes())
    last = len(data) - 500
    data[last:] = b"\0" * 500  # the last record's body zeroed: it was never acknowledged
    path.write_bytes(bytes(data))
    assert durable.AppendLog(path).read() == [b"one", b"two"]
    # zeros inside an acknowledged record with a good record after it: still corruption
    log = durable.AppendLog(path)
    log.append(b"four")
    log.close()
    data = bytearray(path.read_bytes())
    data[durable.RECORD_HEADER.size:durable.RECORD_HEADER.size + 3] = b"\0\0\0"
    path.write_bytes(bytes(data))
    with pytest.raises(durable.CorruptFile):
        durable.AppendLog(path).read()


def test_a_qdrant_drop_cut_short_does_not_bring_its_points_back_in_local_mode(tmp_path, monkeypatch):
    from gateway.search.qdrant_store import QdrantStore

    async def scenario():
        service = opened(tmp_path)
        await service.create(info("q", store="qdrant"))
        await service.upsert("q", ["a", "b"], vectors(2), [{}, {}])
        with monkeypatch.context() as patch:
            patch.setattr(QdrantStore, "destroy", lambda self: None)  # the crash comes before the delete
            await service.drop("q")
        service.close()
        again = opened(tmp_path)
        assert "q" not in again.infos
        assert await again.create(info("q", dim=16, store="qdrant"))
        assert (await again.describe("q"))["count"] == 0
        await again.upsert("q", ["x"], vectors(1, 16), [{}])
        assert [h.id for h in await again.search("q", vectors(1, 16)[0], 5, None)] == ["x"]
        again.close()

    asyncio.run(scenario())
