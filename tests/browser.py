"""Headless Debian chromium driven by Playwright (never a browser of Playwright's own: none can be downloaded
here), with the network limited to this machine: every request that is not for 127.0.0.1 goes to a proxy
port nothing listens on, so it fails, and every request the page makes is logged for the test to check."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from launcher.processes import free_port

LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]"}


def chromium_executable() -> str:
    """Debian's chromium (deploy/install_tools.sh installs it): the real binary behind /usr/bin's wrapper."""
    real = Path("/usr/lib/chromium/chromium")
    if real.exists():
        return str(real)
    found = shutil.which("chromium")
    assert found, "Debian's chromium is missing: run deploy/install_tools.sh (make test does)"
    return found


class RequestLog:
    def __init__(self):
        self.urls: list[str] = []
        self.failed: list[str] = []

    def attach(self, page) -> None:
        page.on("request", lambda request: self.urls.append(request.url))
        page.on("requestfailed", lambda request: self.failed.append((request.url, request.failure)))

    def external(self) -> list[str]:
        """Requests the page made for anything but this machine (data: and blob: URLs never leave the page)."""
        return [u for u in self.urls
                if urlsplit(u).scheme not in ("data", "blob", "about") and urlsplit(u).hostname not in LOCAL_HOSTS
                and f"[{urlsplit(u).hostname}]" not in LOCAL_HOSTS]

    def left_the_machine(self) -> list[str]:
        """External requests the browser sent on: all but those its Content-Security-Policy refused before
        any network access (a request the proxy refused still tried to leave, and is listed)."""
        refused_by_csp = {url for url, failure in self.failed if failure == "csp"}
        return [u for u in self.external() if u not in refused_by_csp]

    def local_failures(self) -> list[tuple[str, str]]:
        return [(u, f) for u, f in self.failed if u not in self.external()]


def launch_local(browser_type):
    """A headless chromium whose only reachable host is 127.0.0.1 (a closed port is its proxy for the rest)."""
    closed = free_port()  # bound then released: nothing listens there
    return browser_type.launch(
        executable_path=chromium_executable(), headless=True,
        proxy={"server": f"http://127.0.0.1:{closed}", "bypass": "127.0.0.1,localhost"},
        args=["--no-sandbox", "--disable-background-networking", "--disable-component-update"])


@contextmanager
def local_browser():
    """launch_local's browser for the duration of the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_local(playwright.chromium)
        try:
            yield browser
        finally:
            browser.close()
