"""Internal errors found by bench/stress_security.py (issue 25), each reproduced here in process: the
gateway app is called through httpx's ASGI transport, which raises whatever the app lets escape, also
after the answer was sent (under uvicorn such an exception closes the keep-alive connection, and the
client's next request on it fails: 5-12% of valid requests in the stress run)."""
from __future__ import annotations

import asyncio
import json

import pytest

from gateway.middleware import strict_json
from gateway.middleware.audit import target_of
from gateway.keys import key_line
from inprocess_gateway import inprocess_gateway

NESTED = b"[" * 5000 + b"]" * 5000  # deeper than Python's recursion limit: json raises RecursionError
ADMIN, TOKENS = "gk-admin-0123456789", "gk-tokens-0123456789"


def keyed(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(key_line(ADMIN, "admin-1", "admin") + key_line(TOKENS, "tokens-1", "inference", tpm=1000))
    return inprocess_gateway(tmp_path, api_keys_file=keys)


def test_json_nested_too_deep_is_a_decode_error():
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        strict_json.loads(NESTED)
    assert target_of({}, NESTED) is None and target_of({}, b'{"model_name": ' + b"[" * 3000) is None
    assert target_of({}, b'{"model_name": "some/model"}') == "some/model"


@pytest.mark.parametrize("body, says", [
    (b'{"input": [1, NaN]}', "NaN is not a JSON number"),
    (b'{"input": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"input": 1e400}', "infinity"),  # json read it as float('inf'): a non-finite number by another door
    (b'{"input": "\\ud800"}', "surrogate"),  # json read it into a str that fails UTF-8 encoding later (a 500)
    (b'{"input": "a",}', "trailing comma"),
])
def test_strict_json_refuses_what_is_not_json(body, says):
    with pytest.raises(json.JSONDecodeError, match=says):
        strict_json.loads(body)


def test_strict_json_reads_json():
    assert strict_json.loads('{"input": ["é", "\\u00e9"], "n": 1.5e3, "x": null}') == {"input": ["é", "é"], "n": 1500.0, "x": None}


@pytest.mark.parametrize("body", [b'{"model": "m", "input": "\\ud800"}', b'{"model": "m", "input": 1e999}'])
def test_embeddings_body_that_is_not_json_is_400(tmp_path, body):
    async def scenario():
        async with inprocess_gateway(tmp_path) as (_app, client):
            return await client.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"})

    response = asyncio.run(scenario())
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
def test_nested_completion_body_with_a_token_quota_is_400(tmp_path, content_type):
    """The tokens-per-minute dependency reads the body again; with a content type FastAPI does not parse
    as JSON, the route's own 400 comes after it, and RecursionError (no ValueError) escaped as a 500."""
    async def scenario():
        async with keyed(tmp_path) as (_app, client):
            return await client.post("/v1/completions", content=NESTED,
                                      headers={"Authorization": f"Bearer {TOKENS}", "Content-Type": content_type})

    response = asyncio.run(scenario())
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [NESTED, b'{"model_name": ' + b"[" * 3000])
def test_nested_admin_body_is_400_and_audited(tmp_path, body):
    """The audit middleware parsed the body's start after the answer: RecursionError escaped the app
    (uvicorn then closed the connection) and the audit line was lost."""
    async def scenario():
        async with keyed(tmp_path) as (app, client):
            response = await client.post("/unload_model", content=body, headers={
                "Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json", "x-request-id": "nested-1"})
            return response, app.state.settings.data_dir / "audit.log"

    response, audit = asyncio.run(scenario())
    assert response.status_code == 400, response.text
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(line["request_id"], line["key_id"], line["result"], line["target"]) for line in lines] == \
        [("nested-1", "admin-1", 400, None)]


def test_audit_line_is_written_before_the_answer_ends(tmp_path):
    """A client that has its answer finds the line: CI read audit.log right after a 404 and missed the
    line, which was written only once the answer had left."""
    from gateway.middleware.audit import Audit, AuditLog
    from gateway.middleware.policy import RouteTable

    audit_file = tmp_path / "audit.log"
    seen_at_end = []

    async def inner(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b'{"model_name": "some/model"}', "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body":
            lines = audit_file.read_text().splitlines() if audit_file.exists() else []
            seen_at_end.append((message.get("more_body", False), len(lines)))

    scope = {"type": "http", "method": "POST", "path": "/unload_model", "headers": []}
    asyncio.run(Audit(inner, RouteTable(None), AuditLog(audit_file))(scope, receive, send))
    assert seen_at_end == [(True, 0), (False, 1)]  # not before the answer is known, once before its end
    [line] = [json.loads(line) for line in audit_file.read_text().splitlines()]
    assert line["route"] == "POST /unload_model" and line["result"] == 404 and line["target"] == "some/model"
