"""Per-route policy, in one table: the scope a route needs, its body cap, and the error statuses it can
answer. The auth, quota and body-cap middlewares and the OpenAPI document all read this table, so what
is enforced and what is documented cannot drift. A route missing here is refused at start."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fastapi.openapi.utils import get_openapi
from starlette.routing import compile_path

from gateway.settings import Settings

KIB, MIB = 1024, 1024 * 1024
SMALL = 64 * KIB  # bodies of the admin and listing routes: a model name, a few ids
# a text's bytes in the body: the sizing (256 inputs x 64 KiB for embeddings). A body of texts all
# at MAX_TEXT_BYTES *and* \u-escaped by the client is over it: send UTF-8 (ensure_ascii=False) or fewer.
JSON_TEXT = 1
BASE64 = 4 / 3
TRITON = (503, 504)  # Triton down / loading / over capacity, and a request past REQUEST_TIMEOUT_S
OPEN, INFERENCE, ADMIN = None, "inference", "admin"


@dataclass(frozen=True)
class Policy:
    scope: str | None  # None: open to everyone (probes, scrapers, the docs)
    cap: Callable[[Settings], int] = lambda s: SMALL
    errors: tuple[int, ...] = ()  # statuses the route itself can answer (400 for a bad body is added to every body route)
    audit: bool = False  # admin actions: one JSON line each in DATA_DIR/audit.log
    tokens: bool = False  # counts against the key's tokens per minute


def text_cap(s: Settings) -> int:
    return s.max_text_bytes * JSON_TEXT + SMALL


def image_cap(s: Settings) -> int:
    return int(s.max_image_bytes * BASE64) + SMALL


def texts_cap(s: Settings) -> int:
    """MAX_INPUTS texts of MAX_TEXT_BYTES, bounded by MAX_REQUEST_TEXT_BYTES (all of a request's texts)."""
    return min(s.max_inputs * s.max_text_bytes, s.max_request_text_bytes) * JSON_TEXT + SMALL


def completions_cap(s: Settings) -> int:
    return s.completions_max_sequences * s.max_text_bytes * JSON_TEXT + SMALL


def images_cap(s: Settings) -> int:
    """`max_inputs` images of MAX_IMAGE_BYTES in base64 plus as many texts: far over what one process
    should hold, so MAX_BODY_BYTES bounds it."""
    return int(s.max_inputs * (s.max_image_bytes * BASE64 + s.max_text_bytes * JSON_TEXT)) + SMALL


def points_cap(s: Settings) -> int:
    # a point: an image (base64) or a text or a vector, and a payload
    return int(s.search_max_points * (s.max_image_bytes * BASE64 + SMALL)) + SMALL


def search_cap(s: Settings) -> int:
    return int(s.max_image_bytes * BASE64 + s.max_text_bytes * JSON_TEXT) + SMALL


def ids_cap(s: Settings) -> int:
    return s.search_max_points * 256 + SMALL  # ids are at most 128 characters


def cap(policy: Policy, settings: Settings) -> int:
    return min(policy.cap(settings), settings.max_body_bytes)


ROUTES: dict[tuple[str, str], Policy] = {
    ("GET", "/health"): Policy(OPEN, errors=(503,)),
    ("GET", "/metrics/prometheus"): Policy(OPEN),
    ("GET", "/openapi.json"): Policy(OPEN),
    ("GET", "/docs"): Policy(OPEN),
    ("GET", "/docs/oauth2-redirect"): Policy(OPEN),
    ("GET", "/redoc"): Policy(OPEN),
    # Swagger UI / ReDoc files (gateway/pages/docs.py)
    ("GET", "/docs/assets/{path:path}"): Policy(OPEN, errors=(404,)),
    ("GET", "/ui"): Policy(OPEN),  # the browser page: static files; it calls the API with the key typed into it
    ("GET", "/ui/{path:path}"): Policy(OPEN, errors=(404,)),
    ("GET", "/v1/models"): Policy(INFERENCE),
    ("GET", "/v1/models/{model}"): Policy(INFERENCE, errors=(404,)),  # ids hold "/": see PATH_CONVERTERS
    ("POST", "/v1/embeddings"): Policy(INFERENCE, texts_cap, (404, *TRITON)),
    ("POST", "/v1/completions"): Policy(INFERENCE, completions_cap, (404, *TRITON), tokens=True),
    ("GET", "/loaded_models"): Policy(INFERENCE),
    ("POST", "/infer"): Policy(INFERENCE, images_cap, (404, *TRITON)),
    ("POST", "/v1/ner"): Policy(INFERENCE, text_cap, (404, *TRITON)),
    ("POST", "/v1/caption"): Policy(INFERENCE, image_cap, (404, *TRITON)),
    ("GET", "/metrics"): Policy(INFERENCE, errors=TRITON),
    ("POST", "/load_sentence_transformer_model"): Policy(ADMIN, errors=(404, 409, *TRITON), audit=True),
    ("POST", "/load_clip_model"): Policy(ADMIN, errors=(404, 409, *TRITON), audit=True),
    ("POST", "/unload_model"): Policy(ADMIN, errors=(404, 409, *TRITON), audit=True),
    ("POST", "/delete_model"): Policy(ADMIN, errors=(404, 409, *TRITON), audit=True),
    ("GET", "/collections"): Policy(INFERENCE),
    ("GET", "/collections/{name}"): Policy(INFERENCE, errors=(404,)),
    ("PUT", "/collections/{name}"): Policy(ADMIN, errors=(404, 409, *TRITON), audit=True),
    ("DELETE", "/collections/{name}"): Policy(ADMIN, errors=(404,), audit=True),
    ("POST", "/collections/{name}/points"): Policy(ADMIN, points_cap, (404, *TRITON), audit=True),
    ("DELETE", "/collections/{name}/points"): Policy(ADMIN, ids_cap, (404,), audit=True),
    ("POST", "/collections/{name}/search"): Policy(INFERENCE, search_cap, (404, *TRITON)),
}
# templates as the OpenAPI document writes them -> as the route declares them, where a parameter takes "/"
PATH_CONVERTERS = {"/v1/models/{model}": "/v1/models/{model:path}"}
# a path no route matches: its 404 (or 405) is only for callers with a key, when keys are configured
UNMATCHED = Policy(INFERENCE)
# another method of an open path (POST /health): its 405 needs no key, as the path itself is public
OPEN_PATH_OTHER_METHOD = Policy(OPEN)


class RouteTable:
    """Resolves an ASGI scope to its route's (method, path template) and Policy, once per request (kept in
    the scope for the middlewares after the first), by the same path templates Starlette compiles."""

    def __init__(self, app):
        self.app = app
        self.patterns = [(method, path, compile_path(PATH_CONVERTERS.get(path, path))[0], policy)
                         for (method, path), policy in ROUTES.items()]

    def check_complete(self) -> None:
        """Every route the app documents has a policy (routes kept out of the document are in ROUTES too)."""
        document = get_openapi(title="check", version="0", routes=self.app.routes)
        missing = [(m.upper(), p) for p, ops in document["paths"].items() for m in ops if (m.upper(), p) not in ROUTES]
        if missing:
            raise RuntimeError(f"routes without a policy in gateway/middleware/policy.py: {missing}")

    def allowed(self, path: str) -> list[str]:
        """The methods some route serves at `path` (a 405's Allow header), HEAD with GET."""
        methods = {method for method, _, regex, _ in self.patterns if regex.match(path)}
        return sorted(methods | ({"HEAD"} if "GET" in methods else set()))

    def resolve(self, scope) -> tuple[str | None, Policy]:
        found = scope.get("gateway.route")
        if found is None:
            found = (None, UNMATCHED)
            method = "GET" if scope["method"] == "HEAD" else scope["method"]
            path = scope["path"]
            for route_method, template, regex, policy in self.patterns:
                if route_method == method:
                    match = regex.match(path)
                    if match:
                        found = (template, policy)
                        scope["gateway.path_params"] = match.groupdict()
                        break
            if found[0] is None and any(p.scope is OPEN and regex.match(path) for _, _, regex, p in self.patterns):
                found = (None, OPEN_PATH_OTHER_METHOD)
            scope["gateway.route"] = found
        return found
