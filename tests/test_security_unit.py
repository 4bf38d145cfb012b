"""Issue 25 without a server: the keys file, the safe default, Triton's bind addresses, the route table,
quotas' arithmetic and the OpenAPI document."""
from __future__ import annotations

import asyncio
import stat
import time

import pytest
from limits import RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from gateway.middleware.auth import admin_key_required, check_exposure, presented_key
from gateway.keys import KeyRing, hash_key, key_line, parse_keys
from gateway.pages.openapi import complete
from gateway.middleware.policy import ROUTES, cap, texts_cap
from gateway.middleware.auth import KEY_SCOPE
from gateway.keys import ApiKey
from gateway.middleware.quotas import SWEEP_S, QuotaBook, Quotas, SweptMemoryStorage, rate_storage, reset_text
from gateway.settings import Settings
from launcher.exposure import gateway_keys, triton_host
from launcher.triton_server import TritonServer


def test_keys_file_lines_comments_scopes_and_limits():
    text = ("# a comment\n\n" + key_line("k1", "reader", "inference") + key_line("k2", "ops", "admin", rps=10, tpm=500)
            + f"{hash_key('k3')} both inference,admin  # trailing comment\n")
    reader, ops, both = parse_keys(text)
    assert reader.scopes == {"inference"} and ops.scopes == {"admin", "inference"} and both.allows("admin")
    assert ops.limits == {"requests_per_second": 10, "tokens_per_minute": 500} and reader.limits == {}
    ring = KeyRing([reader, ops, both])
    assert ring.find("k2").key_id == "ops" and ring.find("k1").key_id == "reader"
    assert ring.find("k4") is None and ring.find("") is None


@pytest.mark.parametrize("line, message", [
    ("plain-key-not-a-hash reader inference", "sha256"),
    (f"{hash_key('x')} reader", "expected"),
    (f"{hash_key('x')} reader root", "unknown scope"),
    (f"{hash_key('x')} reader inference rps=ten", "rps=N"),
    (f"{hash_key('x')} bad/id inference", "key id"),
])
def test_malformed_keys_file_lines_are_refused_by_line(line, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_keys("# header\n" + line + "\n")
    assert "line 2" in str(info.value)


def test_duplicate_key_ids_are_refused():
    with pytest.raises(ValueError, match="twice"):
        parse_keys(key_line("a", "same") + key_line("b", "same"))


def test_presented_key_from_either_header():
    assert presented_key([(b"authorization", b"Bearer abc")]) == "abc"
    assert presented_key([(b"authorization", b"bearer  abc ")]) == "abc"
    assert presented_key([(b"x-api-key", b"xyz")]) == "xyz"
    assert presented_key([(b"authorization", b"Basic abc")]) is None
    assert presented_key([]) is None


def test_open_gateway_only_on_loopback(tmp_path):
    assert check_exposure(Settings(host="127.0.0.1")) is None
    assert not admin_key_required(Settings(host="127.0.0.1"))
    with pytest.raises(RuntimeError, match="not loopback"):
        check_exposure(Settings(host="0.0.0.0"))
    keys = tmp_path / "keys"
    keys.write_text(key_line("k", "ops", "admin"))
    settings = Settings(host="0.0.0.0", api_keys_file=keys)
    assert check_exposure(settings).find("k").key_id == "ops" and admin_key_required(settings)
    keys.write_text("# nothing\n")
    with pytest.raises(RuntimeError, match="holds no key"):
        check_exposure(settings)


def test_make_triton_generates_an_admin_key_off_loopback(tmp_path):
    assert gateway_keys("127.0.0.1", tmp_path, env={}) == (None, None, False)
    keys_file, key_file, generated = gateway_keys("0.0.0.0", tmp_path, env={})
    assert generated and key_file == tmp_path / "run" / "gateway_admin_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert key not in keys_file.read_text()  # only its hash
    assert KeyRing.from_file(keys_file).find(key).allows("admin")
    again = gateway_keys("0.0.0.0", tmp_path, env={})
    assert again == (keys_file, key_file, False) and key_file.read_text().strip() == key  # kept across starts
    given = tmp_path / "mine"
    assert gateway_keys("0.0.0.0", tmp_path, env={"GATEWAY_API_KEYS_FILE": str(given)}) == (given, None, False)


def test_triton_inference_binds_loopback_unless_opted_in():
    assert triton_host({}) == "127.0.0.1" and triton_host({"TRITON_HOST": "0.0.0.0"}) == "0.0.0.0"
    command = TritonServer(triton_host({}), metrics_host="0.0.0.0").command()
    assert "--http-address=127.0.0.1" in command and "--grpc-address=127.0.0.1" in command
    assert "--metrics-address=0.0.0.0" in command


def test_body_caps_follow_each_routes_limits():
    settings = Settings()
    assert cap(ROUTES[("POST", "/v1/embeddings")], settings) == 256 * 64 * 1024 + 64 * 1024
    assert cap(ROUTES[("POST", "/v1/embeddings")], Settings(max_inputs=8)) == 8 * 64 * 1024 + 64 * 1024
    assert cap(ROUTES[("POST", "/infer")], settings) == settings.max_body_bytes  # 256 images: the ceiling
    assert cap(ROUTES[("POST", "/unload_model")], settings) == 64 * 1024
    assert texts_cap(settings) < settings.max_body_bytes


def test_quota_arithmetic():
    # a completion's token budget: tests/test_completions_unit.py (ResolvedCompletion.budget)
    assert reset_text(0.25) == "250ms" and reset_text(1.0) == "1s" and reset_text(90) == "1m30s"


def test_quota_storage_sweeps_at_most_every_interval_and_still_counts_exactly(monkeypatch):
    """The in-process storage throttles limits' per-hit sweep (its cost was the whole cost of keys under
    load) through a private hook: the hook must exist, fire once per SWEEP_S, and counting stay exact."""
    assert "_MemoryStorage__schedule_expiry" in vars(MemoryStorage)  # a limits release renamed it: redo the hook
    sweeps = []
    original = MemoryStorage._MemoryStorage__schedule_expiry

    async def counted(self):
        sweeps.append(time.monotonic())
        await original(self)
    monkeypatch.setattr(MemoryStorage, "_MemoryStorage__schedule_expiry", counted)

    async def main():
        storage = rate_storage("memory://")
        assert isinstance(storage, SweptMemoryStorage)
        limiter, item = MovingWindowRateLimiter(storage), RateLimitItemPerSecond(10)
        admitted = [await limiter.hit(item, "requests:k") for _ in range(200)]
        assert admitted == [True] * 10 + [False] * 190  # exact: ten in the window, no more
        assert len(sweeps) == 1  # one sweep for 200 hits (the library started one per hit)
        await asyncio.sleep(1.0 + SWEEP_S + 0.05)  # the window has passed, and so has the sweep interval
        assert await limiter.hit(item, "requests:k")
        await asyncio.sleep(0.05)  # the sweep this hit started runs
        [entries] = storage.events.values()  # the one key, under limits' own name for it
        assert len(sweeps) == 2 and len(entries) == 1  # the ten old entries are gone, the new one counts
    asyncio.run(main())


def test_a_request_refused_for_concurrency_uses_no_rate_slot(tmp_path):
    """A key at 2 requests/s and 1 in flight: while one request holds the slot, five more are refused for
    concurrency, and the key's second request of that second still passes afterwards."""
    key = ApiKey("k", bytes(32), frozenset({"inference"}), {"requests_per_second": 2, "concurrency": 1})
    held = asyncio.Event()

    async def route(scope, receive, send):
        if scope["path"] == "/slow":
            await held.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def main():
        quotas = Quotas(route, QuotaBook(Settings(data_dir=tmp_path)))

        async def status(path: str) -> int:
            statuses = []

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])
            await quotas({"type": "http", "path": path, "method": "POST", KEY_SCOPE: key}, None, send)
            return statuses[0]

        slow = asyncio.create_task(status("/slow"))
        await asyncio.sleep(0.05)
        assert [await status("/fast") for _ in range(5)] == [429] * 5
        held.set()
        assert await slow == 200
        assert await status("/fast") == 200  # the rate's second slot was not used by the refusals
        assert await status("/fast") == 429  # and now the rate is spent
    asyncio.run(main())


def test_a_key_window_is_the_window_limits_counts(tmp_path):
    """QuotaBook builds a key's storage key once and hits the storage with it: it must be the key that
    limits' own limiter and window stats use, or the 429 headers (and Redis-shared counts) would read another window."""
    key = ApiKey("k", bytes(32), frozenset({"inference"}), {"requests_per_second": 3})

    async def main():
        book = QuotaBook(Settings(data_dir=tmp_path))
        window = book.quota(key).requests
        assert book.quota(key) is book.quota(key) and window.item.amount == 3
        assert [(await book.take(window))[0] for _ in range(3)] == [True] * 3
        assert not await book.limiter.hit(window.item, window.namespace)  # limits sees the same three
        allowed, headers = await book.take(window)
        assert not allowed and headers["x-ratelimit-limit-requests"] == "3"
        assert headers["x-ratelimit-remaining-requests"] == "0" and int(headers["Retry-After"]) >= 1
        other = ApiKey("other", bytes(32), frozenset({"inference"}), {"requests_per_second": 3})
        assert (await book.take(book.quota(other).requests))[0]  # another key's window is its own
    asyncio.run(main())


def test_openapi_document_declares_security_and_errors():
    from gateway.app import create_app

    document = create_app(Settings()).openapi()
    assert set(document["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            policy = ROUTES[(method.upper(), path)]
            responses = operation["responses"]
            assert "422" not in responses, (method, path)  # validation errors are 400 here
            assert "200" in responses and responses["200"]["content"]["application/json"]["schema"]
            if policy.scope is not None:
                # 503: Triton down or draining (gateway/middleware/admission.py), or BODY_BUFFER_BYTES full
                assert operation["security"] and {"401", "403", "429", "503"} <= set(responses), (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "503"} <= set(responses), (method, path)
    assert complete({"paths": {}})["components"]["schemas"]["Error"]["required"] == ["error"]
