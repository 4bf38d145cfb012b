"""One error type per cause, mapped to its HTTP status in one place (`install`). Every error body is
OpenAI's shape: {"error": {"message", "type", "param", "code"}}, plus "request_id" inside a request (the
x-request-id of its response: gateway/middleware/tracing.py). Unexpected exceptions become a 500
with an id that is in the gateway's log; no traceback or internal text reaches the client."""
from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.telemetry.context import REQUEST_ID

log = logging.getLogger("gateway")


class ApiError(Exception):
    status = 500
    type = "internal_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code

    def headers(self) -> dict[str, str]:
        return {}

    def body(self) -> dict:
        """OpenAI's shape, plus the request's id (also in its x-request-id header) to look the failure up."""
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        request_id = REQUEST_ID.get()
        if request_id is not None:
            error["request_id"] = request_id
        return {"error": error}


class BadRequest(ApiError):
    status, type = 400, "invalid_request_error"


class Unauthorized(ApiError):
    """No API key, or one that is not configured (the `openai` SDK raises AuthenticationError)."""
    status, type = 401, "invalid_request_error"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(ApiError):
    """A known key without the route's scope (the `openai` SDK raises PermissionDeniedError)."""
    status, type = 403, "permission_error"


class NotFound(ApiError):
    status, type = 404, "not_found_error"


class Conflict(ApiError):
    """The request is well formed but conflicts with the state of what it names: a model shipped with the
    server (cannot be unloaded), a model of another kind, `dimensions` over the named model's own, a vector
    of another dimension than its collection's, a collection that exists with other settings."""
    status, type = 409, "conflict_error"


class PayloadTooLarge(ApiError):
    status, type = 413, "payload_too_large_error"


class TooManyRequests(ApiError):
    """Over the key's quota: OpenAI's x-ratelimit-* headers and Retry-After say how long to wait."""
    status, type = 429, "rate_limit_error"

    def __init__(self, message: str, headers: dict[str, str], **kw):
        super().__init__(message, **kw)
        self._headers = headers

    def headers(self) -> dict[str, str]:
        return self._headers


class RequestTimeout(ApiError):
    """The request body did not arrive within BODY_TIMEOUT_S."""
    status, type = 408, "timeout_error"


class Unavailable(ApiError):
    """Over capacity or not ready: the client should retry after `retry_after` seconds."""
    status, type = 503, "service_unavailable_error"

    def __init__(self, message: str, retry_after: int = 1, **kw):
        super().__init__(message, **kw)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class UpstreamTimeout(ApiError):
    status, type = 504, "timeout_error"


class Internal(ApiError):
    status, type = 500, "internal_error"


# ---- runtime loads from the Hugging Face hub (gateway/hub/, docs/hub-downloads.md): one type per cause
class HubError(ApiError):
    """Base of the hub-download errors: each cause is a subclass that names its status, type and `code`."""
    default_code = "hub_error"

    def __init_subclass__(cls, status: int, type: str, code: str, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.status, cls.type, cls.default_code = status, type, code

    def __init__(self, message: str, param: str | None = "model_name", code: str | None = None):
        super().__init__(message, param=param, code=code or self.default_code)


class HubDownloadsOff(HubError, status=403, type="permission_error", code="hub_downloads_off"):
    """HUB_DOWNLOADS=off (or HF_HUB_OFFLINE=1 in the gateway's environment)."""


class HubNotAllowed(HubError, status=403, type="permission_error", code="hub_model_not_allowed"):
    """The repository is not on the HUB_DOWNLOADS allowlist."""


class HubGated(HubError, status=403, type="permission_error", code="hub_model_gated"):
    """Gated (or private) on the hub and HF_TOKEN is unset or has no access."""


class HubModelNotFound(HubError, status=404, type="not_found_error", code="model_not_found"):
    """The repository (or its commit) is not on the hub, or HF_TOKEN has no access to it."""


class HubTooLarge(HubError, status=413, type="payload_too_large_error", code="hub_model_too_large"):
    """The files the loader needs add up to more than HUB_MAX_DOWNLOAD_BYTES."""


class HubPickleRefused(HubError, status=422, type="invalid_request_error", code="hub_pickle_refused"):
    """Only pickled weights (.bin/.pt/.pth/.ckpt) and HUB_ALLOW_PICKLE is not 1."""


class NotEmbeddingModel(HubError, status=422, type="invalid_request_error", code="unsupported_model"):
    """The repository is not a sentence-transformers model / a transformers CLIP model the gateway can serve."""


class HubUnreachable(HubError, status=502, type="hub_unreachable_error", code="hub_unreachable"):
    """The hub (HF_ENDPOINT) did not answer, or answered with a server error."""


class HubDownloadTimeout(HubError, status=504, type="timeout_error", code="hub_download_timeout"):
    """The download took longer than HUB_DOWNLOAD_TIMEOUT_S (stopped; a later load resumes it)."""


def responses(*rules: tuple[type[ApiError], str]) -> dict[int, dict]:
    """A route's `responses=`: the refusals that depend on state (which models are loaded, what a
    collection holds), each status with the rules that give it, so the OpenAPI document lists them
    (gateway/pages/openapi.py adds the error body)."""
    whys: dict[int, list[str]] = {}
    for cls, why in rules:
        whys.setdefault(cls.status, []).append(why)
    return {status: {"description": "; ".join(texts)} for status, texts in whys.items()}


def internal(exc: BaseException, where: str = "") -> Internal:
    """Log `exc` with a fresh id; the client sees the id only."""
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s%s", error_id, f" in {where}" if where else "", exc_info=exc)
    return Internal(f"internal error (id {error_id}, see the gateway log)", code=error_id)


async def send(send, error: ApiError, extra_headers: dict[str, str] | None = None) -> None:
    """Answer `error` from a plain ASGI middleware (before any route runs), in the same shape."""
    await JSONResponse(error.body(), status_code=error.status,
                       headers={**error.headers(), **(extra_headers or {})})({"type": "http"}, None, send)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        why = (first.get("ctx") or {}).get("error")
        return "the request body is not valid JSON" + (f": {why}" if why else ""), None
    return (f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")), param


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        error = BadRequest(message, param=param, code="invalid_value")
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException):
        cls = {404: NotFound, 405: BadRequest, 413: PayloadTooLarge}.get(exc.status_code, BadRequest)
        error = cls(str(exc.detail))
        headers = dict(exc.headers or {})
        routes = getattr(_request.app.state, "routes", None)  # gateway/middleware/policy.py's RouteTable
        if exc.status_code == 405 and routes is not None:  # Allow: every method of the path (RFC 9110), not
            headers["Allow"] = ", ".join(routes.allowed(_request.url.path))  # only the first route's
        return JSONResponse(error.body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        error = internal(exc, f"{request.method} {request.url.path}")
        return JSONResponse(error.body(), status_code=error.status)
