"""/ui: a static page (gateway/pages/ui_static/: HTML, CSS and plain JavaScript, no build step) that calls only the
gateway's public API from the browser: image search, NER, captioning, streamed completions, embedding
comparison. Served with a same-origin Content-Security-Policy, so it loads nothing from another host."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

UI_URL = "/ui"
# Reachable without a key when keys are on (the page is static; each API call it makes carries the key).
PUBLIC_PATHS = (UI_URL,)
PUBLIC_PREFIXES = (UI_URL + "/",)
STATIC_DIR = Path(__file__).resolve().parent / "ui_static"
# blob: and data: for the previews and thumbnails the page makes from dropped files
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
                           "connect-src 'self'; frame-ancestors 'self'; form-action 'self'")


class _SameOriginStatic(StaticFiles):
    async def get_response(self, path, scope):
        response = await super().get_response(path, scope)
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        return response


def install(app: FastAPI) -> None:
    @app.get(UI_URL, include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse(f"{UI_URL}/")

    app.mount(UI_URL, _SameOriginStatic(directory=STATIC_DIR, html=True), name="ui")
