"""An honest OpenAPI document (issue 25): FastAPI's document, completed from gateway/middleware/policy.py with the
security schemes, each route's scope, its error statuses in OpenAI's error shape, and the schemas of
its successful answers. A route's own `responses=` (gateway/errors.py `responses`) adds the refusals that
depend on state, each with the rules that give it. Validation errors are answered 400 (gateway/errors.py),
so FastAPI's 422 HTTPValidationError is replaced. Schemathesis checks the result against the live gateway
(tests/test_security_fuzz.py)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from gateway.middleware.policy import ROUTES
from gateway.pages.openapi_requests import refine_requests
from gateway.settings import Settings

ERROR = {"$ref": "#/components/schemas/Error"}
STRING, INT, NUMBER = {"type": "string"}, {"type": "integer"}, {"type": "number"}
NULLABLE_STRING = {"type": ["string", "null"]}
# beyond OpenAI's shape: the response's x-request-id, in every error the gateway answers (gateway/errors.py)
REQUEST_ID = {"type": "string", "minLength": 1, "maxLength": 128,
              "description": "the request's id, also in the x-request-id header: quote it to find the failure in the logs"}


def obj(required: dict, optional: dict | None = None) -> dict:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


def array(items: dict) -> dict:
    return {"type": "array", "items": items}


MODEL = obj({"model_name": STRING, "pretrained": NULLABLE_STRING, "kind": STRING, "dimension": INT, "runtime": STRING})
COLLECTION = obj({"name": STRING, "model": STRING, "pretrained": NULLABLE_STRING, "store": STRING,
                  "distance": STRING, "dimension": INT, "count": {"type": ["integer", "null"]}},
                 {"error": STRING, "created": {"type": "boolean"}})
MESSAGE = obj({"message": STRING})
COMPLETION = obj({"id": STRING, "object": STRING, "created": INT, "model": STRING,
                  "choices": array(obj({"index": INT, "text": STRING, "finish_reason": NULLABLE_STRING}))},
                 {"usage": obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT})})
SUCCESS = {
    # `servers`: each Triton server's state, by failure domain (gateway/routers/health.py)
    ("GET", "/health"): obj({"status": STRING}, {"degraded": {"type": "object"}, "servers": {"type": "object"}}),
    ("GET", "/v1/models"): obj({"object": STRING, "data": array(obj({"id": STRING, "object": STRING,
                                                                      "created": INT, "owned_by": STRING}))}),
    ("GET", "/v1/models/{model}"): obj({"id": STRING, "object": STRING, "created": INT, "owned_by": STRING}),
    ("POST", "/v1/embeddings"): obj({"object": STRING, "model": STRING,
                                     "data": array(obj({"object": STRING, "index": INT,
                                                        "embedding": {"oneOf": [array(NUMBER), STRING]}})),
                                     "usage": obj({"prompt_tokens": INT, "total_tokens": INT})}),
    ("POST", "/v1/completions"): COMPLETION,
    ("GET", "/loaded_models"): obj({"models": array(MODEL)}),
    ("POST", "/infer"): obj({"text_embeddings": array(array(NUMBER)), "image_embeddings": array(array(NUMBER)),
                             "processingTimeMs": NUMBER}),
    ("GET", "/metrics"): obj({"model_stats": array({"type": "object"})}),
    ("POST", "/load_sentence_transformer_model"): obj({"message": STRING, "model": MODEL}),
    ("POST", "/load_clip_model"): obj({"message": STRING, "model": MODEL}),
    ("POST", "/unload_model"): MESSAGE,
    ("POST", "/delete_model"): MESSAGE,
    ("GET", "/collections"): obj({"collections": array(COLLECTION)}),
    ("GET", "/collections/{name}"): COLLECTION,
    ("PUT", "/collections/{name}"): COLLECTION,
    ("DELETE", "/collections/{name}"): obj({"deleted": STRING}),
    ("POST", "/collections/{name}/points"): obj({"upserted": INT, "count": INT}),
    ("DELETE", "/collections/{name}/points"): obj({"deleted": INT, "count": INT}),
    ("POST", "/collections/{name}/search"): obj({"results": array(obj({"id": STRING, "score": NUMBER,
                                                                        "payload": {"type": "object"}})),
                                                 "processingTimeMs": NUMBER}),
}
# statuses whose body is not the error shape
OTHER_ERRORS = {("GET", "/health", 503): obj({"status": STRING, "problems": {"type": "object"}},
                                             {"degraded": {"type": "object"}, "servers": {"type": "object"}})}
DESCRIPTIONS = {400: "invalid request (OpenAI's error shape)",
                401: "no API key, or an unknown one (`WWW-Authenticate: Bearer`)",
                403: "the key lacks this route's scope", 404: "no such model or collection",
                408: "the request body did not arrive within BODY_TIMEOUT_S",
                409: "conflicts with the current state (loading, unloading, other settings)",
                413: "the body is over this route's cap (refused before it is read)",
                429: "over the key's quota: Retry-After and x-ratelimit-* headers",
                503: "Triton not ready or over capacity, the gateway draining, or the request bodies it holds "
                     "at BODY_BUFFER_BYTES: Retry-After", 504: "Triton did not answer in time"}


def error_statuses(method: str, path: str, has_body: bool, has_params: bool) -> list[int]:
    policy = ROUTES[(method, path)]
    statuses = set(policy.errors)
    if has_body or has_params:
        statuses.add(400)
    if has_body:
        statuses.update((408, 413))
    # 503: refused while Triton is down or the gateway drains (gateway/middleware/admission.py)
    if policy.scope is not None:
        statuses.update((401, 403, 429, 503))
    return sorted(statuses)


def complete(document: dict, settings: Settings | None = None) -> dict:
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = obj({"error": obj({"message": STRING, "type": STRING},
                                         {"param": NULLABLE_STRING, "code": NULLABLE_STRING,
                                          "request_id": REQUEST_ID})})
    components["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <key> (the openai SDK's api_key)"},
        "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            key = (method.upper(), path)
            policy = ROUTES[key]
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            if key in SUCCESS:
                ok = responses.setdefault("200", {"description": "OK"})
                media = "text/event-stream" if path == "/v1/completions" else "application/json"
                ok["content"] = {"application/json": {"schema": SUCCESS[key]}}
                if media != "application/json":
                    ok["content"][media] = {"schema": STRING, "description": "with `stream: true`"}
            if policy.scope is not None:
                operation["security"] = [{"bearer": []}, {"apiKey": []}]
                operation["description"] = (operation.get("description", "") +
                                            f"\n\nScope: `{policy.scope}`.").strip()
            declared = {int(s): r.get("description") for s, r in responses.items() if s.isdigit() and int(s) >= 400}
            general = error_statuses(key[0], path, "requestBody" in operation, bool(operation.get("parameters")))
            for status in sorted(set(declared) | set(general)):
                schema = OTHER_ERRORS.get((*key, status), ERROR)
                # the general meaning, then the route's own rules (its responses=) where it declares them
                description = "; ".join(filter(None, (DESCRIPTIONS[status] if status in general else None,
                                                      declared.get(status))))
                responses[str(status)] = {"description": description,
                                          "content": {"application/json": {"schema": schema}}}
    refine_requests(document, settings)  # request schemas as the routes check them
    return document


def honest_openapi(app: FastAPI, settings: Settings):
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = complete(get_openapi(title=app.title, version=app.version, description=app.description,
                                                      routes=app.routes), settings)
        return app.openapi_schema

    return openapi
