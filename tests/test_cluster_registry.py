"""Issue 27 without Triton: replicas sharing a real redis-server (Debian's, from deploy/install_tools.sh),
each a ClusterRegistry over a fake engine. What one registers, every one loads; what one unloads, every one
unloads; the cap holds when two decide at once; a replica that starts later converges without a call;
quotas (rate and concurrency) hold across replicas."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gateway import errors
from gateway.app import create_app
from gateway.registry.cluster_registry import ClusterRegistry
from gateway.keys import ApiKey
from gateway.middleware.quotas import QuotaBook
from gateway.registry import ModelRegistry
from gateway.settings import Settings
from launcher.cluster.redis_server import RedisServer
from launcher.processes import free_port
from security_helpers import KEYS, write_keys
from test_gateway_registry import FakeEngine
from test_registry_replace_unit import generated  # noqa: F401 - the stubbed generation fixture


@pytest.fixture
def redis_url(tmp_path):
    with RedisServer(free_port(), tmp_path / "redis") as server:
        yield server.url


def replica(tmp_path, redis_url: str, name: str, **overrides) -> ClusterRegistry:
    settings = dict(data_dir=tmp_path / name, redis_url=redis_url, replica_id=name, cluster_sync_s=0.5,
                    cluster_heartbeat_s=0.2, cluster_heartbeat_ttl_s=3.0, model_wait_s=10.0, request_timeout_s=10.0)
    return ClusterRegistry(Settings(**{**settings, **overrides}), FakeEngine())


def run(coroutine, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def ready_here(reg: ClusterRegistry) -> set[str]:
    return {e.key[0] for e in reg.entries.values() if e.state == "ready"}


async def until(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout:.0f}s"
        await asyncio.sleep(0.05)


def test_a_registration_reaches_every_replica_and_an_unload_leaves_every_replica(tmp_path, redis_url, generated):
    async def main():
        a, b = replica(tmp_path, redis_url, "a"), replica(tmp_path, redis_url, "b")
        await a.start(), await b.start()
        try:
            spec, already = await a.load("m/one", None, "sentence_transformer")
            assert not already and ready_here(a) == {"m/one"}
            placement = await a.placement("m/one", wait_all=True)  # ?wait=all
            assert placement == {"ready": 2, "live": 2, "ready_on": ["a", "b"]}
            assert ready_here(b) == {"m/one"} and spec.text_model in b.engine.loads  # without a call to b
            where = await b.ready_on()
            assert where["m/one"] == ["a", "b"] and where["sentence-transformers/all-MiniLM-L6-v2"] == ["a", "b"]
            # registering it again through the other replica: already loaded, one registration
            _, already = await b.load("m/one", None, "sentence_transformer")
            assert already and len(await a.shared.all()) == 1
            await b.unload("m/one", None)  # through b: a follows
            await until(lambda: not ready_here(a), what="unload on a")
            assert spec.text_model in a.engine.unloads and await a.shared.all() == {}
            with pytest.raises(errors.NotFound):
                await a.unload("m/one", None)
        finally:
            await a.close(), await b.close()
    run(main())


def test_a_request_for_a_registered_model_not_loaded_here_waits_for_it(tmp_path, redis_url, generated):
    async def main():
        a = replica(tmp_path, redis_url, "a")
        await a.start()
        late = replica(tmp_path, redis_url, "late")  # not started: no reconcile, no events
        try:
            await a.load("m/one", None, "sentence_transformer")
            async with late.use("m/one") as spec:  # loads it here, then serves
                assert spec.model_name == "m/one"
            assert ready_here(late) == {"m/one"}
            with pytest.raises(errors.NotFound):  # never registered: 404 as before
                async with late.use("m/none"):
                    pass
        finally:
            await late.close(), await a.close()
    run(main())


def test_a_replica_started_later_converges_without_a_call(tmp_path, redis_url, generated):
    async def main():
        a = replica(tmp_path, redis_url, "a")
        await a.start()
        await a.load("m/one", None, "sentence_transformer")
        await a.load("m/two", None, "sentence_transformer")
        b = replica(tmp_path, redis_url, "b")
        try:
            await b.start()  # reconciles before it serves
            assert ready_here(b) == {"m/one", "m/two"}
        finally:
            await a.close(), await b.close()
    run(main())


def test_two_replicas_registering_at_once_with_the_cap_at_one_leave_exactly_one(tmp_path, redis_url, generated):
    async def main():
        a = replica(tmp_path, redis_url, "a", max_loaded_models=1)
        b = replica(tmp_path, redis_url, "b", max_loaded_models=1)
        await a.start(), await b.start()
        try:
            results = await asyncio.gather(a.load("m/one", None, "sentence_transformer"),
                                           b.load("m/two", None, "sentence_transformer"), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert all(isinstance(f, errors.Unavailable) for f in failures), failures
            registered = set(await a.shared.all())
            assert len(registered) == 1
            await until(lambda: ready_here(a) == ready_here(b) == registered, what="one model everywhere")
            # the cap evicts the least recently used once it is ready: a third registration replaces it
            await a.load("m/three", None, "sentence_transformer")
            await until(lambda: ready_here(a) == ready_here(b) == {"m/three"}, what="eviction everywhere")
        finally:
            await a.close(), await b.close()
    run(main())


def test_a_replace_through_one_replica_loads_the_new_version_on_every_replica(tmp_path, redis_url, generated):
    async def main():
        a, b = replica(tmp_path, redis_url, "a"), replica(tmp_path, redis_url, "b")
        await a.start(), await b.start()
        try:
            await a.load("m/one", None, "sentence_transformer")
            await until(lambda: ready_here(b) == {"m/one"}, what="first version on b")
            new, _ = await a.load("m/one", None, "sentence_transformer", replace=True)
            assert new.text_model.endswith("_g1")
            await until(lambda: any(m.endswith("_g1") for m in b.engine.loads), what="new version on b")
            async with b.use("m/one") as spec:
                assert spec.text_model.endswith("_g1")
        finally:
            await a.close(), await b.close()
    run(main())


def test_a_failed_first_load_takes_the_registration_back(tmp_path, redis_url, generated):
    class Failing(FakeEngine):
        async def load(self, model: str) -> None:
            raise RuntimeError(f"fake Triton: {model} failed to load")

    async def main():
        a = replica(tmp_path, redis_url, "a")
        a.engine = Failing()
        await a.start()
        try:
            with pytest.raises(errors.ApiError):
                await a.load("m/bad", None, "sentence_transformer")
            assert await a.shared.all() == {}
        finally:
            await a.close()
    run(main())


def test_redis_gone_answers_503_and_loaded_models_keep_serving(tmp_path, generated):
    async def main(server: RedisServer):
        a = replica(tmp_path, server.url, "a")
        await a.start()
        try:
            await a.load("m/one", None, "sentence_transformer")
            server.stop()
            with pytest.raises(errors.Unavailable, match="REDIS_URL"):
                await a.load("m/two", None, "sentence_transformer")
            async with a.use("m/one") as spec:  # found here: Redis is not asked
                assert spec.model_name == "m/one"
        finally:
            await a.close()
    server = RedisServer(free_port(), tmp_path / "redis").start()
    try:
        run(main(server))
    finally:
        server.stop()


def test_rate_and_concurrency_quotas_hold_across_replicas(tmp_path, redis_url):
    key = ApiKey(key_id="limited", digest=b"0" * 32, scopes=frozenset({"inference"}),
                 limits={"requests_per_second": 10, "concurrency": 2})

    async def main():
        books = [QuotaBook(Settings(quota_storage=redis_url, redis_url=redis_url, replica_id=n)) for n in "ab"]
        try:
            allowed = []
            for i in range(60):  # alternating between the replicas, as a load balancer spreads them
                before = time.time()
                ok, headers = await books[i % 2].hit(key, "second", 10, "requests")
                if ok:
                    allowed.append((before, time.time()))  # the limiter's clock read lies in between
                else:
                    assert headers["x-ratelimit-limit-requests"] == "10" and int(headers["Retry-After"]) >= 1
                await asyncio.sleep(0.01)
            assert len(allowed) >= 10
            for i, (start, _) in enumerate(allowed):  # no 1-second window surely holds more than 10
                assert sum(1 for _, end in allowed[i:] if end - start < 1.0) <= 10
            a1, _, t1 = await books[0].concurrency.acquire("limited", 2)
            a2, _, _ = await books[1].concurrency.acquire("limited", 2)
            a3, active, _ = await books[1].concurrency.acquire("limited", 2)
            assert a1 and a2 and not a3 and active == 2
            await books[0].concurrency.release(t1)
            assert (await books[1].concurrency.acquire("limited", 2))[0]
        finally:
            for book in books:
                await book.close()
    run(main())


def test_a_key_at_10_per_second_through_two_gateways_gets_10_in_total(tmp_path, redis_url):
    """The real middleware chain of two gateway apps sharing one Redis (as two replicas behind a balancer)."""
    keys = write_keys(tmp_path / "keys")

    async def main():
        apps = [create_app(Settings(data_dir=tmp_path / n, api_keys_file=keys, redis_url=redis_url,
                                    quota_storage=redis_url, replica_id=n)) for n in "ab"]
        for app in apps:  # what the lifespan would open (the ASGI transport does not run it)
            app.state.models = ModelRegistry(app.state.settings, FakeEngine())
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
                   for app in apps]
        headers = {"Authorization": f"Bearer {KEYS['limited']}"}
        try:
            started = time.monotonic()
            codes = []
            for i in range(40):  # /v1/models answers without Triton
                codes.append((await clients[i % 2].get("/v1/models", headers=headers)).status_code)
            elapsed = time.monotonic() - started
            assert set(codes) <= {200, 429}
            # one window of 1 s per elapsed second at most (20 if each replica counted alone)
            assert 10 <= codes.count(200) <= 10 * (1 + int(elapsed)), (codes.count(200), elapsed)
            if elapsed < 1:
                assert codes.count(200) == 10
        finally:
            for client in clients:
                await client.aclose()
            for app in apps:
                await app.state.quotas.close()
    run(main())


def test_with_redis_a_faiss_collection_is_refused_naming_qdrant_url(tmp_path, redis_url):
    from gateway.search.collections import CollectionInfo, Collections

    async def main():
        service = Collections(Settings(data_dir=tmp_path / "d", redis_url=redis_url))
        service.start()
        try:
            for store in ("faiss", "qdrant"):  # Qdrant's local mode is one replica's alone too
                with pytest.raises(errors.BadRequest, match="QDRANT_URL") as info:
                    await service.create(CollectionInfo(name="c", model="m", pretrained=None, store=store,
                                                        distance="cosine", dimension=8))
                assert info.value.code == "collection_not_shared"
        finally:
            service.close()
    run(main())


def test_registering_again_while_the_unload_still_runs_here_waits_for_it(tmp_path, redis_url, generated):
    class SlowUnload(FakeEngine):
        async def unload(self, model: str, unload_dependents: bool = False) -> None:
            await asyncio.sleep(0.5)
            await super().unload(model, unload_dependents)

    async def main():
        a = replica(tmp_path, redis_url, "a")
        a.engine = SlowUnload()
        await a.start()
        try:
            await a.load("m/one", None, "sentence_transformer")
            unloading = asyncio.ensure_future(a.unload("m/one", None))
            await until(lambda: any(e.state == "unloading" for e in a.entries.values()), what="the unload started")
            spec, already = await a.load("m/one", None, "sentence_transformer")  # the single registry: 409
            await unloading
            assert not already and ready_here(a) == {"m/one"} and set(await a.shared.all()) == {"m/one"}
        finally:
            await a.close()
    run(main())
