"""Issue 43 item 13, without a server: what schemathesis' every check found (tools/fuzz_gateway.py runs
them all against a live gateway; tests/test_security_fuzz.py a bounded run) and the gateway now does.

- A 405 names every method of its path in Allow (RFC 9110): none at all before, then only the first
  route's (POST for /collections/{name}/points, which takes DELETE too).
- Another method of an open path (POST /health) is a 405 without a key, not a 401.
- The document's request schemas say what the routes check where a schema can: collection names, blank
  texts, token-id arrays (refused), `dimensions` from 1 to MAX_DIMENSIONS, /infer's "text or image", point
  ids, names to load, the bounds that are settings, and booleans as pydantic reads them (0/1, "yes", ...);
  an image is the gateway's string format `image`.
- No deviation is left (issue 52): what depends on state is a 404 or 409 each operation declares, with its
  rule; nothing in tools/fuzz_gateway.py relaxes a check."""
from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from pydantic import TypeAdapter

from gateway.app import create_app
from gateway.keys import key_line
from gateway.pages.openapi_requests import LAX_BOOLEAN
from gateway.settings import Settings
from model_configs import ROOT
from gateway.schemas.embeddings import MAX_DIMENSIONS
from gateway.schemas.seed import SOURCE_PATTERN

KEY = "gk-test-conformance-0123456789"


@pytest.fixture
def app(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(key_line(KEY, "admin-1", "admin"))
    return create_app(Settings(data_dir=tmp_path / "data", api_keys_file=keys))


def _call(app, method: str, path: str, key: str | None = KEY) -> httpx.Response:
    async def call():
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await client.request(method, path, headers=headers)
    return asyncio.run(call())


@pytest.mark.parametrize("method, path, allow", [
    ("PATCH", "/collections/x/points", "DELETE, POST"), ("GET", "/collections/x/points", "DELETE, POST"),
    ("DELETE", "/v1/embeddings", "POST"), ("PUT", "/loaded_models", "GET, HEAD"),
    ("POST", "/collections/x", "DELETE, GET, HEAD, PUT")])
def test_a_405_lists_every_method_of_its_path(app, method, path, allow):
    response = _call(app, method, path)
    assert response.status_code == 405 and response.headers["allow"] == allow
    assert response.json()["error"]["message"] == "Method Not Allowed"


def test_another_method_of_an_open_path_is_a_405_without_a_key(app):
    response = _call(app, "POST", "/health", key=None)
    assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD"
    assert (_call(app, "POST", "/v1/models", key=None)).status_code == 401, "a protected path keeps its 401"
    assert (_call(app, "GET", "/no-such-path", key=None)).status_code == 401


def test_the_error_schema_declares_every_field_an_error_body_has(app):
    import jsonschema

    schema = app.openapi()["components"]["schemas"]["Error"]
    for method, path, key in (("GET", "/no-such-path", None), ("DELETE", "/v1/embeddings", KEY)):
        response = _call(app, method, path, key=key)
        error = response.json()["error"]
        assert response.status_code in (401, 405) and error["request_id"] == response.headers["x-request-id"]
        assert set(error) <= set(schema["properties"]["error"]["properties"]), "request_id is declared (issue 47)"
        jsonschema.validate(response.json(), schema)


def test_request_schemas_say_what_the_routes_check(app):
    document = app.openapi()
    schemas = document["components"]["schemas"]
    name = document["paths"]["/collections/{name}/search"]["post"]["parameters"][0]["schema"]
    assert re.fullmatch(name["pattern"], "photos_2-a") and not re.fullmatch(name["pattern"], "a/b")
    assert not re.fullmatch(name["pattern"], "x" * 65)
    embeddings = schemas["EmbeddingsRequest"]["properties"]
    text = {"type": "string", "pattern": r"\S"}
    assert embeddings["input"]["anyOf"] == [text, {"type": "array", "items": text, "minItems": 1, "maxItems": 2048}
                                            ], "no token-id arrays: they are refused; MAX_INPUTS"
    assert {"type": "integer", "minimum": 1, "maximum": MAX_DIMENSIONS} in embeddings["dimensions"]["anyOf"]
    assert "description" in embeddings["input"], "the model's description is kept"
    assert schemas["NerRequest"]["properties"]["text"] == {**text, "title": "Text"}
    assert schemas["CaptionRequest"]["properties"]["image"]["format"] == "image"
    infer = schemas["InferRequest"]
    assert [branch["required"] for branch in infer["anyOf"]] == [["text"], ["image"]]
    assert infer["properties"]["image"]["anyOf"][0]["items"]["format"] == "image"
    assert schemas["PointIds"]["properties"]["ids"]["items"]["pattern"]
    assert schemas["Search"]["properties"]["limit"]["maximum"] == 100, "SEARCH_MAX_LIMIT"
    assert schemas["Points"]["properties"]["points"]["maxItems"] == 256, "SEARCH_MAX_POINTS"
    requests = [schemas[k] for k in ("LoadClip", "LoadSentenceTransformer", "InferRequest", "EmbeddingsRequest")]
    assert _plain_booleans(requests) == 0, "every request boolean reads as pydantic reads it"


def _plain_booleans(schema) -> int:
    """`{"type": "boolean"}` schemas that are not the first branch of LAX_BOOLEAN."""
    if isinstance(schema, list):
        return sum(_plain_booleans(s) for s in schema)
    if not isinstance(schema, dict) or schema.get("anyOf") == LAX_BOOLEAN["anyOf"]:
        return 0
    return int(schema.get("type") == "boolean") + sum(_plain_booleans(v) for v in schema.values())


@pytest.mark.parametrize("value", [True, False, 0, 1, "yes", "TRUE", "oFf", "0", "f"])
def test_the_lax_boolean_schema_is_what_pydantic_accepts(value):
    import jsonschema

    jsonschema.validate(value, LAX_BOOLEAN)
    TypeAdapter(bool).validate_json(json.dumps(value))


@pytest.mark.parametrize("value", [2, -1, "maybe", " true", "", 0.5, None, []])
def test_the_lax_boolean_schema_refuses_what_pydantic_refuses(value):
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(value, LAX_BOOLEAN)
    with pytest.raises(ValueError):
        TypeAdapter(bool).validate_json(json.dumps(value))


def test_the_bounds_that_are_settings_follow_the_settings(tmp_path):
    app = create_app(Settings(data_dir=tmp_path / "data", max_inputs=7, search_max_limit=9))
    schemas = app.openapi()["components"]["schemas"]
    assert schemas["EmbeddingsRequest"]["properties"]["input"]["anyOf"][1]["maxItems"] == 7
    assert schemas["Search"]["properties"]["limit"]["maximum"] == 9


@pytest.mark.parametrize("method, path, status, words", [
    ("post", "/unload_model", 409, "shipped"), ("post", "/delete_model", 409, "shipped"),
    ("post", "/v1/embeddings", 409, "dimensions"), ("post", "/infer", 409, "images"),
    ("put", "/collections/{name}", 409, "CLIP"), ("post", "/collections/{name}/points", 409, "dimension"),
    ("post", "/collections/{name}/search", 404, "collection does not exist"),
    ("post", "/load_clip_model", 409, "another kind")])
def test_each_state_rule_is_declared_with_its_reason(app, method, path, status, words):
    """What depends on state is a 404 or 409 (schemathesis accepts them for a schema-valid request), listed
    in the operation's responses with the rule that gives it, in the error shape."""
    response = app.openapi()["paths"][path][method]["responses"][str(status)]
    assert words in response["description"]
    assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


@pytest.mark.parametrize("name, loadable", [
    ("org/name", True), ("demo_models/clip-demo", True), ("a..b", True), ("...", True), ("/abs/path", True),
    ("", False), (" \t", False), ("..", False), ("a/../b", False), ("a/..", False), ("../etc", False),
    ("a\\b", False), ("a\x00", False), ("x" * 301, False)])
def test_the_load_name_rules_are_what_the_loader_refuses(app, name, loadable, tmp_path):
    """The document's rules for a name to load (gateway/schemas/seed.py) against the loader's own checks:
    a name the document refuses is refused with a 400, one it allows is not refused for its form."""
    import jsonschema

    from gateway.errors import BadRequest
    from gateway.modelgen.sources import _check_name, local_folder

    rules = app.openapi()["components"]["schemas"]["LoadClip"]["properties"]["model_name"]
    assert rules["pattern"] == SOURCE_PATTERN
    assert jsonschema.Draft202012Validator(rules).is_valid(name) == loadable
    try:
        _check_name(name)
        local_folder(name, [tmp_path]) if not name.startswith("/") else None
        refused = False
    except BadRequest:
        refused = True
    assert refused != loadable
