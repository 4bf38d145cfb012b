"""Issue 43, items 1, 2, 3, 10 and 11, in process (the app through httpx's ASGI transport, no Triton): one
client cannot take the body budget from everyone else; the connection cap's bookkeeping per address; an
open gateway serves loopback Host and Origin values only (DNS rebinding); control characters in request
fields never reach a log line unescaped; auth and audit run whatever the server's state, and a 503 names
no internal address. The same against live gateways, with 1,100 half-open connections:
tests/test_security_abuse_server.py."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest

from gateway import modelgen
from gateway.keys import key_line
from gateway.middleware.body_budget import BodyBudget, share_bytes
from gateway.middleware.body_limits import CapBodies, owner_of
from gateway.middleware.local_origin import LocalOrigin
from gateway.middleware.log_fields import printable
from gateway.middleware.policy import RouteTable
from gateway.server.http_protocol import ClientConnections, client_cap, client_of
from gateway.settings import Settings
from gateway_helpers import MINILM
from inprocess_gateway import inprocess_gateway
from test_body_budget import Client, Holder, until

KIB = 1024
KEYS = {"a": "gk-abuse-a-0123456789", "b": "gk-abuse-b-0123456789", "admin": "gk-abuse-admin-0123456789"}
UNKNOWN = "gk-not-a-configured-key"
TRITON_AT = "127.0.0.1:8001"  # what the server watch names in its own log
EMBED = {"model": MINILM, "input": "served"}


def keyed(tmp_path, **settings):
    tmp_path.mkdir(parents=True, exist_ok=True)
    keys = tmp_path / "keys"
    keys.write_text(key_line(KEYS["a"], "key-a", "inference") + key_line(KEYS["b"], "key-b", "inference")
                    + key_line(KEYS["admin"], "admin-1", "admin"))
    return inprocess_gateway(tmp_path, api_keys_file=keys, **settings)


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def stalled_request(app, path: str, declared: int, headers: dict[str, str], client=("127.0.0.1", 40000)):
    """A request whose headers declare `declared` body bytes and whose body never comes: (task, its sends)."""
    sent, forever = [], asyncio.Event()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": client,
             "server": ("127.0.0.1", 8080), "state": {},
             "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                         (b"content-length", str(declared).encode()),
                         *((k.lower().encode(), v.encode()) for k, v in headers.items())]}

    async def receive():
        await forever.wait()

    async def send(message):
        sent.append(message)

    return asyncio.create_task(app(scope, receive, send)), sent


# --- item 1: the body budget per key (per client address without keys) ---

def test_the_share_setting():
    default = Settings.from_env({})
    # the budget less one maximal /v1/embeddings body: whatever one key holds, another key's largest fits
    assert share_bytes(default) == default.body_buffer_bytes - (256 * 64 * KIB + 64 * KIB) == 29_294_592
    # ... and still one maximal image in base64 for the key that holds it (/infer, a search by image)
    assert share_bytes(default) > int(default.max_image_bytes * 4 / 3) + 64 * KIB
    assert share_bytes(Settings.from_env({"BODY_BUFFER_BYTES": "1000000"})) == 500_000  # half of a small budget
    assert share_bytes(Settings.from_env({"BODY_BUFFER_KEY_BYTES": "12345"})) == 12345
    with pytest.raises(ValueError, match="BODY_BUFFER_KEY_BYTES"):
        share_bytes(Settings.from_env({"BODY_BUFFER_KEY_BYTES": str(default.body_buffer_bytes + 1)}))


def test_one_owner_holds_at_most_its_share():
    budget = BodyBudget(100, share=60)
    assert budget.take(50, "a") and not budget.take(11, "a") and budget.take(10, "a")
    assert budget.take(40, "b") and not budget.take(1, "c") and budget.used == 100
    budget.give(60, "a")
    assert budget.take(60, "c") and budget.held == {"b": 40, "c": 60}
    budget.give(40, "b")
    budget.give(60, "c")
    assert budget.used == 0 and budget.held == {}  # no entry left behind per owner


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_a_key_over_its_share_waits_and_another_key_is_served(chunked):
    """Key a holds bodies up to its share (sent, held by the route); its next body is refused with 503,
    while key b's body, as large, is served: the budget beyond a's share stays for the others."""
    async def scenario():
        holder = Holder()
        cap = CapBodies(holder, RouteTable(None), Settings(), BodyBudget(256 * KIB, share=160 * KIB))

        def as_key(client: Client, key_id: str) -> Client:
            client.scope["gateway.key"] = type("Key", (), {"key_id": key_id})()
            return client

        held = [as_key(Client(80 * KIB, chunked), "a") for _ in range(2)]
        tasks = [asyncio.create_task(cap(c.scope, c.receive, c.send)) for c in held]
        await until(lambda: len(holder.bodies) == 2)
        late = as_key(Client(80 * KIB, chunked), "a")
        await cap(late.scope, late.receive, late.send)
        assert late.status == 503 and late.error()["code"] == "body_buffer_full"
        assert "BODY_BUFFER_KEY_BYTES" in late.error()["message"]
        other = as_key(Client(80 * KIB, chunked), "b")
        task = asyncio.create_task(cap(other.scope, other.receive, other.send))
        await until(lambda: len(holder.bodies) == 3)
        holder.release.set()
        await asyncio.gather(task, *tasks)
        assert other.status == 200 and cap.budget.used == 0

    asyncio.run(scenario())


def test_a_declared_body_takes_nothing_until_it_arrives():
    async def scenario():
        holder = Holder()
        cap = CapBodies(holder, RouteTable(None), Settings(), BodyBudget(256 * KIB))
        stalled = Client(200 * KIB, chunked=False)
        stalled.left = 0  # it declares 200 KiB and sends nothing
        forever = asyncio.Event()

        async def never():
            await forever.wait()

        task = asyncio.create_task(cap(stalled.scope, never, stalled.send))
        await asyncio.sleep(0.01)
        assert cap.budget.used == 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_a_key_that_declares_the_whole_budget_and_stalls_denies_no_other_key(tmp_path):
    """The issue's attack: key a declares BODY_BUFFER_BYTES (and, below its share, several bodies that fill
    it) and sends nothing; key b's 39-byte /v1/embeddings is served."""
    async def scenario():
        async with keyed(tmp_path) as (app, client):
            budget = app.state.settings.body_buffer_bytes
            stalls = [stalled_request(app, "/infer", budget, bearer("a"))]
            stalls += [stalled_request(app, "/infer", 20 << 20, bearer("a")) for _ in range(3)]
            await asyncio.sleep(0.05)  # each has passed auth and the caps, and waits for its body
            response = await client.post("/v1/embeddings", json=EMBED, headers=bearer("b"))
            for task, _sent in stalls:
                task.cancel()
            await asyncio.gather(*(task for task, _ in stalls), return_exceptions=True)
            return response, app.state.body_budget.used

    response, used = asyncio.run(scenario())
    assert response.status_code == 200, response.text
    assert used == 0


def test_without_keys_the_share_is_per_client_address(tmp_path):
    async def scenario():
        async with inprocess_gateway(tmp_path, body_buffer_bytes=1 << 20, body_buffer_key_bytes=600 * KIB) as (app, _):
            budget = app.state.body_budget
            assert budget.take(600 * KIB, owner_of({"client": ("127.0.0.5", 1)}))  # its bodies in flight: its share
            task, sent = stalled_request(app, "/v1/embeddings", 1000, {}, client=("127.0.0.5", 40001))
            await asyncio.wait_for(task, 5)
            other, _ = stalled_request(app, "/v1/embeddings", 1000, {}, client=("127.0.0.6", 40002))
            await asyncio.sleep(0.05)
            waiting = not other.done()  # it was admitted and waits for its body
            other.cancel()
            await asyncio.gather(other, return_exceptions=True)
            return sent, waiting

    sent, waiting = asyncio.run(scenario())
    assert sent[0]["status"] == 503 and b"BODY_BUFFER_KEY_BYTES" in sent[1]["body"]
    assert waiting


# --- item 2: connections per client address (live: tests/test_security_abuse_server.py) ---

def test_the_connection_cap_setting_and_whose_connection_it_is():
    assert client_cap(Settings.from_env({})) == 256  # a quarter of MAX_CONNECTIONS
    assert client_cap(Settings.from_env({"MAX_CONNECTIONS": "100"})) == 25
    assert client_cap(Settings.from_env({"MAX_CONNECTIONS_PER_CLIENT": "0"})) == 0  # off (behind a proxy)
    with pytest.raises(ValueError, match="MAX_CONNECTIONS_PER_CLIENT"):
        client_cap(Settings.from_env({"MAX_CONNECTIONS_PER_CLIENT": "-1"}))
    assert client_of(("192.0.2.7", 40000)) == "192.0.2.7"
    # one IPv6 host is given a /64: all its addresses are one client; a mapped IPv4 address is that address
    one_host = {client_of(("2001:db8:1:2:aaaa::1", 1, 0, 0)), client_of(("2001:db8:1:2:bbbb::9", 2, 0, 0))}
    assert one_host == {"2001:db8:1:2::/64"}
    assert client_of(("::ffff:192.0.2.7", 1, 0, 0)) == "192.0.2.7"
    assert client_of(None) is None and client_of("/run/gateway.sock") is None


def test_one_address_holds_at_most_its_cap():
    connections = ClientConnections(2)
    assert connections.admit("a") and connections.admit("a") and not connections.admit("a")
    assert connections.admit("b")
    connections.release("a")
    assert connections.admit("a") and not connections.admit("a")
    for client in ("a", "a", "b"):
        connections.release(client)
    assert connections.open == {}  # no entry left behind per address
    assert connections.response.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in connections.response


# --- item 3: DNS rebinding against the open gateway ---

REBIND = {"Host": "rebind.attacker.example:8080", "Origin": "http://rebind.attacker.example:8080"}


def test_an_open_gateway_refuses_a_foreign_host_and_starts_no_download(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(modelgen, "resolve_source", lambda *a, **k: asked.append(a) or tmp_path)

    async def scenario():
        async with inprocess_gateway(tmp_path) as (_app, client):
            load = await client.post("/load_sentence_transformer_model", headers=REBIND,
                                     json={"model_name": "attacker-org/big-model"})
            host_only = await client.post("/load_sentence_transformer_model", json={"model_name": "attacker-org/big"},
                                          headers={"Host": "rebind.attacker.example"})
            origin_only = await client.post("/v1/embeddings", json=EMBED,
                                            headers={"Origin": "http://rebind.attacker.example:8080"})
            null_origin = await client.post("/v1/embeddings", json=EMBED, headers={"Origin": "null"})
            return load, host_only, origin_only, null_origin

    load, host_only, origin_only, null_origin = asyncio.run(scenario())
    for response, code in ((load, "host_not_allowed"), (host_only, "host_not_allowed"),
                           (origin_only, "origin_not_allowed"), (null_origin, "origin_not_allowed")):
        assert response.status_code == 403, response.text
        error = response.json()["error"]
        assert error["type"] == "permission_error" and error["code"] == code
        assert "ALLOWED_HOSTS" in error["message"]
    assert "rebind.attacker.example" in load.json()["error"]["message"]
    assert asked == []  # no source was resolved: no hub download started


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8080", "localhost", "LocalHost:8080", "[::1]",
                                  "[::1]:8080", "127.0.0.2:9"])
def test_an_open_gateway_serves_loopback_hosts(tmp_path, host):
    async def scenario():
        async with inprocess_gateway(tmp_path) as (_app, client):
            origin = f"http://{host}"
            return (await client.post("/v1/embeddings", json=EMBED, headers={"Host": host, "Origin": origin}),
                    await client.get("/openapi.json", headers={"Host": host}))

    embeddings, document = asyncio.run(scenario())
    assert embeddings.status_code == 200, embeddings.text
    assert document.status_code == 200


@pytest.mark.parametrize("host", ["[::1]evil", "[::1", "localhost:", "localhost:80x", "127.0.0.1.rebind.example",
                                  "localhost.rebind.example", "0.0.0.0:8080", ""])
def test_what_only_looks_loopback_is_refused(host):
    guard = LocalOrigin((), 8080)
    assert not guard.allows_host(host)
    assert not guard.allows_origin(f"http://{host}") and not guard.allows_origin("null")


def test_allowed_hosts_adds_names_and_keys_keep_todays_behaviour(tmp_path):
    async def scenario():
        async with inprocess_gateway(tmp_path / "open", allowed_hosts=("gateway.lan:8080",)) as (_app, client):
            listed = await client.post("/v1/embeddings", json=EMBED,  # any port of a listed name
                                       headers={"Host": "Gateway.LAN:9000", "Origin": "https://gateway.lan"})
            other = await client.get("/v1/models", headers={"Host": "other.lan"})
        async with keyed(tmp_path / "keyed") as (_app, client):
            with_key = await client.post("/v1/embeddings", json=EMBED, headers={**REBIND, **bearer("a")})
        return listed, other, with_key

    listed, other, with_key = asyncio.run(scenario())
    assert listed.status_code == 200, listed.text
    assert other.status_code == 403
    assert with_key.status_code == 200, with_key.text  # keys are the protection there
    listed_hosts = Settings.from_env({"ALLOWED_HOSTS": " a.example, B.example:8080 "}).allowed_hosts
    assert listed_hosts == ("a.example", "b.example:8080")


# --- item 10: log forging ---

FORGED = "/nope%0a2026-11-27%2013:00:00,000%20WARNING%20gateway.audit:%20audit%20{%22key_id%22:%22ops%22}"


def test_printable_escapes_every_control_character():
    assert printable("/v1/models") == "/v1/models"
    assert printable("é ünïcode ok") == "é ünïcode ok"
    assert printable("a\nb\rc\td\x1b[31m\x00\x7f\x85\u2028\u2029") == \
        "a\\nb\\rc\\td\\x1b[31m\\x00\\x7f\\x85\\u2028\\u2029"
    assert printable("x" * 5000).endswith("...") and len(printable("x" * 5000)) < 1100


def test_a_percent_encoded_newline_forges_no_log_line(tmp_path, caplog):
    async def scenario():
        async with keyed(tmp_path) as (_app, client):
            no_key = await client.get(FORGED)
            refused = await client.post(FORGED.replace("/nope", "/delete_model"), json={})
            admin = await client.post("/delete_model", json={"model_name": "x\n2026-11-27 13:00:00,000 WARNING y"},
                                      headers={**bearer("admin"), "x-request-id": "id\x0bwith\x1bcontrols"})
            return no_key, refused, admin

    with caplog.at_level(logging.INFO):
        no_key, refused, admin = asyncio.run(scenario())
    assert no_key.status_code == 401
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("gateway")]
    assert any("/nope\\n2026-11-27" in line for line in lines), lines
    for line in lines:
        assert line.isprintable(), repr(line)
    audit = (tmp_path / "data" / "audit.log").read_text()
    assert audit.count("\n") == len(audit.splitlines()) and all(line.isprintable() for line in audit.splitlines())


# --- item 11: auth and audit whatever the server's state; no internal address in a 503 ---

@pytest.mark.parametrize("state", ["triton down", "draining"])
def test_auth_and_audit_come_before_admission(tmp_path, state):
    async def scenario():
        async with keyed(tmp_path) as (app, client):
            if state == "draining":
                app.state.admission.draining = True
            else:  # what gateway/triton/server_watch.py sets while Triton is not live
                app.state.admission.server_problem = f"the Triton server at {TRITON_AT} is not live (restarting)"
            body = {"model_name": "some/model"}
            unknown = await client.post("/delete_model", json=body, headers={"Authorization": f"Bearer {UNKNOWN}"})
            no_key = await client.get("/v1/models")
            inference = await client.post("/delete_model", json=body, headers={**bearer("a"), "x-request-id": "inf-1"})
            admin = await client.post("/delete_model", json=body, headers={**bearer("admin"), "x-request-id": "adm-1"})
            served = await client.get("/v1/models", headers=bearer("a"))
            return unknown, no_key, inference, admin, served

    unknown, no_key, inference, admin, served = asyncio.run(scenario())
    assert unknown.status_code == 401 and unknown.json()["error"]["code"] == "invalid_api_key"
    assert no_key.status_code == 401
    assert inference.status_code == 403
    assert admin.status_code == 503 and served.status_code == 503
    for response in (admin, served):
        assert TRITON_AT not in response.text
        assert response.headers["retry-after"]
    lines = [json.loads(line) for line in (tmp_path / "data" / "audit.log").read_text().splitlines()]
    assert [(line["key_id"], line["result"]) for line in lines] == [(None, 401), ("key-a", 403), ("admin-1", 503)]
    assert [line["request_id"] for line in lines][1:] == ["inf-1", "adm-1"]
