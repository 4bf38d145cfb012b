"""Request schemas in the OpenAPI document as the gateway checks them (issue 43 item 13): what the routes
refuse beyond the request models' types, wherever a JSON schema can say it, so that a request the document
calls valid is served and one it calls invalid is refused (schemathesis' positive_data_acceptance and
negative_data_rejection checks, tools/fuzz_gateway.py). Static bounds are in the request models themselves
(gateway/schemas/); here are the forms the models parse only to refuse them (token ids), the routes' own
checks with their own messages (ids, names, empty texts), and the bounds that are settings (MAX_INPUTS,
SEARCH_MAX_LIMIT, SEARCH_MAX_POINTS). An image is the gateway's string format `image`
(gateway/schemas/images.py). What depends on state (a model loaded and of the right kind, a vector of the
collection's dimension) is a 404 or 409 that each route declares (gateway/errors.py `responses`)."""
from __future__ import annotations

from gateway.schemas.images import IMAGE_FORMAT
from gateway.search.collections import ID_RE, NAME_RE
from gateway.settings import Settings

NULL = {"type": "null"}
TEXT = {"type": "string", "pattern": r"\S"}  # "" and blank texts are refused: "input[0] is empty"
TEXTS = {"type": "array", "items": TEXT, "minItems": 1}
IMAGE = {"type": "string", "format": IMAGE_FORMAT}
PROPERTIES = {
    ("NerRequest", "text"): TEXT,
    ("Point", "text"): {"anyOf": [TEXT, NULL]},
    ("Search", "text"): {"anyOf": [TEXT, NULL]},
    # "point id ... must be 1-128 characters of [A-Za-z0-9_-]"
    ("Point", "id"): {"type": "string", "pattern": f"^{ID_RE.pattern}$"},
    ("PointIds", "ids"): {"type": "array", "items": {"type": "string", "pattern": f"^{ID_RE.pattern}$"}},
}
# /infer: "send at least one of text or image"
SOME = {"type": "array", "minItems": 1}
# a point, a search: "needs exactly one of image, text, vector" (null is not given)
ONE_QUERY = {"oneOf": [{"required": [k], "properties": {k: {"not": NULL}}} for k in ("image", "text", "vector")]}
MODELS = {"InferRequest": {"anyOf": [{"required": ["text"], "properties": {"text": SOME}},
                                     {"required": ["image"], "properties": {"image": SOME}}]},
          "Point": ONE_QUERY, "Search": ONE_QUERY}
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


def forms(settings: Settings) -> dict[tuple[str, str], dict]:
    """Schemas that replace a property's (its title, description, default and examples kept), with the
    bounds that are settings."""
    count = {"maxItems": settings.max_inputs}  # "input has N items, over the limit of ... (MAX_INPUTS)"
    # the routes serve texts; token-id arrays are parsed only to be refused with a 400 that says why
    # (gateway/schemas/text_input.py), so the document does not offer them
    return {**PROPERTIES,
            ("EmbeddingsRequest", "input"): {"anyOf": [TEXT, {**TEXTS, **count}]},
            # [] beside images is fine
            ("InferRequest", "text"): {"anyOf": [{"type": "array", "items": TEXT, **count}, NULL]},
            ("InferRequest", "image"): {"anyOf": [{"type": "array", "items": IMAGE, **count}, NULL]}}


def bounds(settings: Settings) -> dict[tuple[str, str], dict]:
    """Bounds that are settings, added to what a property's schema says."""
    # "limit must be between 1 and N (SEARCH_MAX_LIMIT)"
    return {("Search", "limit"): {"minimum": 1, "maximum": settings.search_max_limit},
            # "points is empty"; "... over the limit of N per request (SEARCH_MAX_POINTS)"
            ("Points", "points"): {"minItems": 1, "maxItems": settings.search_max_points},
            ("PointIds", "ids"): {"maxItems": settings.search_max_points}}


def refine_requests(document: dict, settings: Settings | None = None) -> None:
    """Tighten the document's request schemas and path parameters to what the routes accept (in place)."""
    schemas = document.get("components", {}).get("schemas", {})
    settings = settings or Settings()
    replaced, added = forms(settings), bounds(settings)
    for name in request_components(document):
        schema = schemas[name]
        for prop, refined in schema.get("properties", {}).items():
            tighter = replaced.get((name, prop))
            if tighter is not None:
                kept = {k: v for k, v in refined.items() if k in ("title", "description", "default", "examples")}
                refined = {**kept, **tighter}
            schema["properties"][prop] = {**refined, **added.get((name, prop), {})}
        schema.update(MODELS.get(name, {}))
        schemas[name] = _lax_booleans(schema)
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and path.startswith("/collections/"):
                    parameter["schema"] = {**parameter.get("schema", {}), **PATH_PARAMETERS.get(parameter["name"], {})}
