"""Issue 56 item 10: the audit line names the target of every admin action whatever the body's size or field
order (the first 4 KiB alone named none for an unload padded with 5,000 bytes)."""
from __future__ import annotations

import asyncio
import json

import pytest

from gateway.middleware.policy import SMALL
from test_security_abuse import bearer, keyed


def audit_lines(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "data" / "audit.log").read_text().splitlines()]


@pytest.mark.parametrize("padding", [5_000, SMALL - 1_000])
def test_a_padded_admin_body_is_audited_with_its_target(tmp_path, padding):
    async def scenario():
        async with keyed(tmp_path) as (_app, client):
            # the target last, after the padding: a client chooses the order of its fields
            body = json.dumps({"pad": "x" * padding, "model_name": "some/model", "pretrained": "tag"})
            unload = await client.post("/unload_model", content=body, headers={
                **bearer("admin"), "content-type": "application/json", "x-request-id": "padded-1"})
            return unload

    unload = asyncio.run(scenario())
    assert unload.status_code in (404, 409), unload.text  # not loaded here: the attempt is what is audited
    line = next(line for line in audit_lines(tmp_path) if line["request_id"] == "padded-1")
    assert line["target"] == "some/model|tag" and line["route"] == "POST /unload_model", line


def test_a_collection_is_named_by_its_path_and_its_points_are_not_kept(tmp_path):
    async def scenario():
        async with keyed(tmp_path) as (_app, client):
            return await client.request("DELETE", "/collections/kept-name/points", headers=bearer("admin"),
                                        json={"ids": ["x" * 100] * 100})

    asyncio.run(scenario())
    assert [line["target"] for line in audit_lines(tmp_path)] == ["kept-name"]
