"""Connection bounds uvicorn does not have (issue 25): a request's line and headers must arrive within
HEADER_TIMEOUT_S and fit in MAX_HEADER_BYTES, or the connection is closed. uvicorn's own settings bound
the rest: idle keep-alive (KEEP_ALIVE_S) and open connections (MAX_CONNECTIONS, 503 above it); the body
middleware bounds slow bodies (BODY_TIMEOUT_S). A slow client holds a connection object and no task."""
from __future__ import annotations

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.settings import Settings


def bounded_protocol(settings: Settings) -> type[HttpToolsProtocol]:
    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        header_timeout_s = settings.header_timeout_s
        max_header_bytes = settings.max_header_bytes
        _header_timer = None
        _header_bytes = 0

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection whose request headers took over %gs (HEADER_TIMEOUT_S)",
                                 self.header_timeout_s)
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()  # a connection that sends nothing is closed as well

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            self._header_bytes = 0
            self._arm()
            super().on_message_begin()

        def _count(self, size: int) -> None:
            self._header_bytes += size
            if self._header_bytes > self.max_header_bytes:
                # raised inside the parser's callback: uvicorn answers 400 and closes the connection
                raise httptools.HttpParserError(f"request headers over {self.max_header_bytes} bytes (MAX_HEADER_BYTES)")

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    return BoundedHttpToolsProtocol
