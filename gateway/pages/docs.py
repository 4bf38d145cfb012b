"""/docs (Swagger UI) and /redoc (ReDoc) served from the gateway itself: FastAPI's defaults load their
scripts and styles from a CDN and their favicon from fastapi.tiangolo.com, so on an air-gapped machine both
pages render blank. The assets come from the `fastapi-offline` package (requirements.txt, installed by
`make setup`), which ships swagger-ui-bundle.js, swagger-ui.css and redoc.standalone.js; the pages are
FastAPI's own get_swagger_ui_html / get_redoc_html pointed at them."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
ASSETS_URL = "/docs/assets"
# What a client may fetch without a key when keys are on (the API-key middleware lets these through):
# the two pages, their assets and the OpenAPI document they render.
PUBLIC_PATHS = (DOCS_URL, REDOC_URL, OAUTH2_REDIRECT_URL, "/openapi.json")
PUBLIC_PREFIXES = (ASSETS_URL + "/",)

# Swagger UI keeps what "Authorize" was given (a Bearer key) across reloads of /docs; no validator badge
# (its default asks validator.swagger.io about the document).
SWAGGER_UI_PARAMETERS = {"persistAuthorization": True, "validatorUrl": None}


# The pages may load nothing but this origin's: ReDoc's sidebar, for one, links a logo image on
# cdn.redoc.ly that no option turns off; with this policy the browser refuses it without asking the
# network (the image's onError hides it). Inline script and styles: FastAPI's pages and ReDoc use both.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
                           "connect-src 'self'; frame-ancestors 'self'")


def assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def fastapi_kwargs() -> dict:
    """FastAPI(...) arguments: its CDN-backed /docs and /redoc off; install() adds the local ones."""
    return {"docs_url": None, "redoc_url": None, "swagger_ui_oauth2_redirect_url": None,
            "swagger_ui_parameters": dict(SWAGGER_UI_PARAMETERS)}


def _same_origin_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


def install(app: FastAPI) -> None:
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")

    def local(request: Request, path: str) -> str:
        return f"{request.scope.get('root_path', '')}{path}"  # behind a proxy that strips a prefix

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return _same_origin_only(get_swagger_ui_html(
            openapi_url=local(request, app.openapi_url), title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=local(request, OAUTH2_REDIRECT_URL),
            swagger_js_url=local(request, f"{ASSETS_URL}/swagger-ui-bundle.js"),
            swagger_css_url=local(request, f"{ASSETS_URL}/swagger-ui.css"),
            swagger_favicon_url=local(request, f"{ASSETS_URL}/favicon.png"),
            swagger_ui_parameters=app.swagger_ui_parameters))

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return _same_origin_only(get_redoc_html(
            openapi_url=local(request, app.openapi_url), title=f"{app.title} - ReDoc",
            redoc_js_url=local(request, f"{ASSETS_URL}/redoc.standalone.js"),
            redoc_favicon_url=local(request, f"{ASSETS_URL}/favicon.png"),
            with_google_fonts=False))  # fonts.googleapis.com otherwise
