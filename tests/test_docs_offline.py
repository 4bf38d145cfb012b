"""Issue 32: /docs (Swagger UI) and /redoc (ReDoc) render from the gateway alone, in a real headless
chromium whose network reaches only 127.0.0.1: the rendered page lists the gateway's operations and no
request leaves the machine."""
from __future__ import annotations

import re

import pytest

from browser import RequestLog, local_browser

pytestmark = pytest.mark.integration

METHODS = ("get", "post", "put", "patch", "delete")


def operations(openapi: dict) -> list[tuple[str, str, dict]]:
    return [(method, path, op) for path, item in openapi["paths"].items()
            for method, op in item.items() if method in METHODS]


@pytest.fixture(scope="module")
def openapi(gateway) -> dict:
    document = gateway.http.get("/openapi.json").json()
    assert len(operations(document)) >= 10, "the gateway's operations"
    return document


@pytest.fixture(scope="module")
def browser():
    with local_browser() as browser:
        yield browser


def test_pages_name_no_host_but_their_own(gateway):
    for page in ("/docs", "/redoc"):
        response = gateway.http.get(page)
        html = response.text
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        assert not re.findall(r"https?://", html), f"{page} names an outside address"
        for asset in re.findall(r'(?:src|href)="([^"]+)"', html):
            assert gateway.http.get(asset).status_code == 200, asset
    assert '"persistAuthorization": true' in gateway.http.get("/docs").text  # "Authorize" survives a reload


def logged_page(browser, url: str):
    """A new page at `url` with every request it makes logged (RequestLog)."""
    page, log = browser.new_page(), RequestLog()
    log.attach(page)
    page.goto(url)
    return page, log


def test_swagger_ui_lists_every_operation_offline(gateway, openapi, browser):
    page, log = logged_page(browser, f"{gateway.url}/docs")
    page.wait_for_selector(".opblock", timeout=60_000)
    rendered = {(b.get_attribute("class"), b.query_selector(".opblock-summary-path").get_attribute("data-path"))
                for b in page.query_selector_all(".opblock")}
    seen = {(re.search(r"opblock-(get|post|put|patch|delete)", cls).group(1), path) for cls, path in rendered}
    assert seen == {(method, path) for method, path, _ in operations(openapi)}
    assert page.title() == "Triton pipelines gateway - Swagger UI"
    assert f"{gateway.url}/openapi.json" in log.urls and f"{gateway.url}/docs/assets/swagger-ui-bundle.js" in log.urls
    assert log.external() == [] and log.failed == []
    page.close()


def test_redoc_lists_every_operation_offline(gateway, openapi, browser):
    page, log = logged_page(browser, f"{gateway.url}/redoc")
    page.wait_for_selector("[data-section-id^='tag/'], [data-section-id^='operation/']", timeout=60_000)
    sections = {s.get_attribute("data-section-id") for s in page.query_selector_all("[data-section-id]")}
    # ReDoc gives each operation a section named after its operationId, under its tag when it has one
    for method, path, op in operations(openapi):
        assert any(s.endswith(f"operation/{op['operationId']}") for s in sections), (method, path)
    text = page.inner_text("body")
    for _, path, _ in operations(openapi):
        assert path in text
    assert f"{gateway.url}/docs/assets/redoc.standalone.js" in log.urls
    # ReDoc's sidebar asks for a logo on cdn.redoc.ly (no option turns it off): the page's policy refuses it
    assert log.left_the_machine() == [] and log.local_failures() == []
    page.close()


def test_the_browser_reaches_only_this_machine(browser):
    """The guard the tests above rely on: an outside address fails at the (closed) proxy."""
    from playwright.sync_api import Error

    page = browser.new_page()
    with pytest.raises(Error, match="ERR_PROXY_CONNECTION_FAILED|ERR_TUNNEL_CONNECTION_FAILED"):
        page.goto("https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css", timeout=30_000)
    page.close()
