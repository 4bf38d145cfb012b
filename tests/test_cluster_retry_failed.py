"""Issue 43 item 8: in cluster mode a request for a registered model that fails to load on this replica
started a whole new load every time (10 requests, 10 load attempts, each an error), while the reconcile
loop waited RETRY_FAILED_S between attempts. The request path now honours it too: one attempt per
RETRY_FAILED_S, and in between a 503 with Retry-After."""
from __future__ import annotations

import asyncio

import pytest

from gateway import errors
from gateway.registry import cluster_registry
from test_cluster_registry import redis_url, replica, run  # noqa: F401 - redis_url is a fixture
from test_gateway_registry import FakeEngine
from test_registry_replace_unit import generated  # noqa: F401 - the stubbed generation fixture


class FailingEngine(FakeEngine):
    def __init__(self):
        super().__init__()
        self.attempts: list[str] = []

    async def load(self, model: str) -> None:
        self.attempts.append(model)
        await asyncio.sleep(0.01)
        raise RuntimeError(f"fake Triton: {model} failed to load")


def test_a_model_that_fails_to_load_is_tried_once_per_retry_period_from_requests(tmp_path, redis_url, generated,
                                                                                   monkeypatch):
    monkeypatch.setattr(cluster_registry, "RETRY_FAILED_S", 1.5)

    async def use(registry, name):
        async with registry.use(name):
            pass

    async def main():
        a = replica(tmp_path, redis_url, "a")
        await a.start()
        b = replica(tmp_path, redis_url, "b")  # not started: only the request path loads here
        b.engine = engine = FailingEngine()
        try:
            await a.load("m/one", None, "sentence_transformer")  # registered, ready on a
            outcomes = []
            for _ in range(10):
                with pytest.raises(errors.ApiError) as caught:
                    await use(b, "m/one")
                outcomes.append(caught.value)
            assert len(engine.attempts) == 1, f"{len(engine.attempts)} load attempts for 10 requests"
            assert outcomes[0].status != 503
            for later in outcomes[1:]:
                assert later.status == 503 and isinstance(later, errors.Unavailable), later
                assert 1 <= later.retry_after <= 2 and "m/one" in later.message
            concurrent = await asyncio.gather(*(use(b, "m/one") for _ in range(10)), return_exceptions=True)
            assert all(isinstance(e, errors.Unavailable) for e in concurrent) and len(engine.attempts) == 1

            await asyncio.sleep(1.6)  # the period is over: one request tries again, the others wait for it
            again = await asyncio.gather(*(use(b, "m/one") for _ in range(10)), return_exceptions=True)
            assert len(engine.attempts) == 2, engine.attempts
            assert sum(not isinstance(e, errors.Unavailable) for e in again) >= 1
        finally:
            await b.shared.close()
            await a.close()
    run(main())
