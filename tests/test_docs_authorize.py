"""Issue 32: with a Bearer security scheme on the gateway's routes, /docs stays open and Swagger UI's
"Authorize" sends the key as `Authorization: Bearer <key>` with "Try it out", and keeps it across a reload
(persistAuthorization). Run on a small app built with the gateway's own docs set-up (gateway/pages/docs.py),
served by uvicorn on 127.0.0.1, in headless chromium limited to 127.0.0.1."""
from __future__ import annotations

import threading
import time

import pytest
from fastapi import Depends, FastAPI
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from browser import RequestLog, local_browser
from gateway.pages import docs as docs_pages
from launcher.processes import free_port

pytestmark = pytest.mark.integration
KEY = "sk-test-7f3a"


def keyed_app() -> FastAPI:
    app = FastAPI(title="keyed", **docs_pages.fastapi_kwargs())
    docs_pages.install(app)
    bearer = HTTPBearer()

    @app.get("/v1/whoami")
    async def whoami(credentials: HTTPAuthorizationCredentials = Depends(bearer)) -> dict:
        return {"scheme": credentials.scheme, "key_tail": credentials.credentials[-4:]}

    return app


@pytest.fixture(scope="module")
def served():
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(keyed_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_authorize_sends_the_bearer_key_and_keeps_it(served):
    import httpx

    assert httpx.get(f"{served}/v1/whoami").status_code in (401, 403)  # the route does need the key
    assert httpx.get(f"{served}/docs").status_code == 200  # the docs do not
    with local_browser() as browser:
        context = browser.new_context()
        page = context.new_page()
        log = RequestLog()
        log.attach(page)
        sent = []
        page.on("request", lambda r: sent.append(r.headers.get("authorization")) if r.url.endswith("/v1/whoami") else None)
        page.goto(f"{served}/docs")
        page.click("button.authorize", timeout=60_000)
        page.fill(".auth-container input", KEY)
        page.click(".auth-btn-wrapper button.authorize")
        page.click(".auth-btn-wrapper button.btn-done")
        page.click(".opblock-summary")
        page.click("button.try-out__btn")
        page.click("button.execute")
        page.wait_for_selector(".live-responses-table .response-col_status", timeout=30_000)
        assert sent == [f"Bearer {KEY}"]
        body = page.inner_text(".live-responses-table")
        assert '"key_tail": "7f3a"' in body and '"scheme": "Bearer"' in body
        # persistAuthorization: after a reload the lock is still closed and the key still sent
        page.goto(f"{served}/docs")  # a new load of the page (without the deep-link hash)
        page.wait_for_selector("button.authorize.locked", timeout=60_000)
        page.click(".opblock-summary")
        page.click("button.try-out__btn")
        page.click("button.execute")
        page.wait_for_selector(".live-responses-table .response-col_status", timeout=30_000)
        assert sent == [f"Bearer {KEY}"] * 2
        assert log.left_the_machine() == [] and log.local_failures() == []
        context.close()
