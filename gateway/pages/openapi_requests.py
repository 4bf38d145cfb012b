"""Request schemas in the OpenAPI document as the gateway checks them (issue 43 item 13): what the routes
refuse beyond the request models' types, wherever a JSON schema can say it, so that a request the document
calls valid is served and one it calls invalid is refused (schemathesis' positive_data_acceptance and
negative_data_rejection checks, tools/fuzz_gateway.py). What no schema can say (an image must decode, a
vector must have the collection's dimension, a model must be loaded and of the right kind) is listed as a
deliberate deviation in tools/schemathesis.toml and docs/gateway-api.md."""
from __future__ import annotations

from gateway.search.collections import ID_RE, NAME_RE

NULL = {"type": "null"}
TEXT = {"type": "string", "minLength": 1}  # "" is refused: "input[0] is empty"
TEXTS = {"type": "array", "items": TEXT, "minItems": 1}
# the routes serve texts; token-id arrays are parsed only to be refused with a 400 that says why
# (gateway/schemas/embeddings.py), so the document does not offer them
PROPERTIES = {
    ("EmbeddingsRequest", "input"): {"anyOf": [TEXT, TEXTS]},
    ("EmbeddingsRequest", "dimensions"): {"anyOf": [{"type": "integer", "minimum": 1}, NULL]},
    ("InferRequest", "text"): {"anyOf": [{"type": "array", "items": TEXT}, NULL]},  # [] beside images is fine
    ("InferRequest", "image"): {"anyOf": [{"type": "array", "items": TEXT}, NULL]},
    ("NerRequest", "text"): TEXT,
    ("CaptionRequest", "image"): TEXT,
    # "point id ... must be 1-128 characters of [A-Za-z0-9_-]"
    ("Point", "id"): {"type": "string", "pattern": f"^{ID_RE.pattern}$"},
    ("PointIds", "ids"): {"type": "array", "items": {"type": "string", "pattern": f"^{ID_RE.pattern}$"}},
}
# /infer: "send at least one of text or image"
MODELS = {"InferRequest": {"anyOf": [{"required": ["text"], "properties": {"text": TEXTS}},
                                     {"required": ["image"], "properties": {"image": TEXTS}}]}}
# /collections/{name}...: "collection name must be 1-64 characters of [A-Za-z0-9_-]"
PATH_PARAMETERS = {"name": {"type": "string", "pattern": f"^{NAME_RE.pattern}$"}}

# FastAPI reads request booleans in pydantic's lax mode: true/false, 0/1 and these words in any case
# (pydantic-core's str -> bool); the document says so rather than claim `boolean` alone
BOOLEAN_WORDS = ("0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes")


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)


LAX_BOOLEAN = {"anyOf": [{"type": "boolean"}, {"type": "integer", "enum": [0, 1]},
                         {"type": "string", "pattern": "^(" + "|".join(map(_any_case, BOOLEAN_WORDS)) + ")$"}]}


def _lax_booleans(schema):
    """The schema with every `{"type": "boolean"}` inside it read as pydantic reads it."""
    if isinstance(schema, list):
        return [_lax_booleans(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "boolean":
        return {**{k: v for k, v in schema.items() if k != "type"}, **LAX_BOOLEAN}
    return {k: v if k in ("default", "examples", "enum", "const") else _lax_booleans(v) for k, v in schema.items()}


def request_components(document: dict) -> set[str]:
    """Names of the component schemas request bodies use (directly or through another component)."""
    schemas = document.get("components", {}).get("schemas", {})
    found, todo = set(), []
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            todo.append(operation.get("requestBody", {}))
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            ref = item.get("$ref", "")
            name = ref.rsplit("/", 1)[-1] if ref.startswith("#/components/schemas/") else None
            if name and name not in found:
                found.add(name)
                todo.append(schemas.get(name, {}))
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return found


def refine_requests(document: dict) -> None:
    """Tighten the document's request schemas and path parameters to what the routes accept (in place)."""
    schemas = document.get("components", {}).get("schemas", {})
    for name in request_components(document):
        schema = schemas[name]
        for prop, refined in schema.get("properties", {}).items():
            tighter = PROPERTIES.get((name, prop))
            if tighter is not None:
                kept = {k: v for k, v in refined.items() if k in ("title", "description", "default", "examples")}
                schema["properties"][prop] = {**kept, **tighter}
        schema.update(MODELS.get(name, {}))
        schemas[name] = _lax_booleans(schema)
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and path.startswith("/collections/"):
                    parameter["schema"] = {**parameter.get("schema", {}), **PATH_PARAMETERS.get(parameter["name"], {})}
