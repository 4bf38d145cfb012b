"""Connection bounds uvicorn does not have (issue 25, issue 43): a request's line and headers must arrive
within HEADER_TIMEOUT_S and fit in MAX_HEADER_BYTES, or the connection is closed; one client address holds
at most MAX_CONNECTIONS_PER_CLIENT open connections (default a quarter of MAX_CONNECTIONS): one more is
answered 503 and closed as it opens, before uvicorn counts it, so that no one address can fill uvicorn's
MAX_CONNECTIONS (`limit_concurrency`, above which every new request gets 503) with connections that never
finish their headers. uvicorn's own settings bound the rest: idle keep-alive (KEEP_ALIVE_S) and open
connections (MAX_CONNECTIONS); the body middleware bounds slow bodies (BODY_TIMEOUT_S). A slow client
holds a connection object and no task.

Behind a proxy every connection comes from the proxy's address: a connection from TRUSTED_PROXIES may
begin with a PROXY protocol v2 header (gateway/server/proxy_protocol.py) naming the real client, which is
then the address counted here and the request's `client` (the body budget's owner without keys). Such a
connection is admitted when its first bytes have told whose it is; one without the header is the proxy's
own (a health check) and counted under the proxy's address."""
from __future__ import annotations

import ipaddress
import json
import logging
import time

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway import errors
from gateway.server import proxy_protocol
from gateway.settings import Settings

log = logging.getLogger("gateway.connections")
REFUSAL_LOG_S = 10.0  # refused connections are counted and logged at most once per this


def client_cap(settings: Settings) -> int:
    """MAX_CONNECTIONS_PER_CLIENT; unset: a quarter of MAX_CONNECTIONS; 0: no cap (behind a proxy that
    names no client: TRUSTED_PROXIES). `make cluster` gives HAProxy the same cap per client address."""
    value = settings.max_connections_per_client
    if value is None:
        return max(1, settings.max_connections // 4)
    if value < 0:
        raise ValueError(f"MAX_CONNECTIONS_PER_CLIENT must be 0 (no cap) or more, not {value}")
    return value


def client_of(peer) -> str | None:
    """Whose connection it is: the IPv4 address, or the /64 of an IPv6 one (what one host is given)."""
    if not peer or not isinstance(peer, tuple):
        return None  # a Unix socket: no address to count by
    address = peer[0]
    if ":" not in address:
        return address
    ip = ipaddress.IPv6Address(address.split("%", 1)[0])
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, 64), strict=False))


def refusal_response(cap: int) -> bytes:
    error = errors.Unavailable(f"this client address has {cap} connections open to the gateway, its limit "
                               "(MAX_CONNECTIONS_PER_CLIENT); close idle ones or retry later", retry_after=1,
                               code="too_many_connections")
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class ClientConnections:
    """Open connections per client address, for one server (no lock: the protocol runs on its loop)."""

    def __init__(self, cap: int):
        self.cap, self.open = cap, {}
        self.response = refusal_response(cap)
        self.refused, self.logged_at = {}, 0.0

    def admit(self, client: str) -> bool:
        count = self.open.get(client, 0)
        if count >= self.cap:
            self.refused[client] = self.refused.get(client, 0) + 1
            now = time.monotonic()
            if now - self.logged_at >= REFUSAL_LOG_S:  # one line per period, not one per socket
                self.logged_at = now
                log.warning("refused connections over MAX_CONNECTIONS_PER_CLIENT=%d: %s", self.cap,
                            ", ".join(f"{n} from {c}" for c, n in sorted(self.refused.items())))
                self.refused.clear()
            return False
        self.open[client] = count + 1
        return True

    def release(self, client: str) -> None:
        count = self.open.pop(client) - 1
        if count:
            self.open[client] = count


def bounded_protocol(settings: Settings) -> type[HttpToolsProtocol]:
    cap = client_cap(settings)
    clients = ClientConnections(cap) if cap else None
    proxies = proxy_protocol.trusted_networks(settings.trusted_proxies)

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        header_timeout_s = settings.header_timeout_s
        max_header_bytes = settings.max_header_bytes
        _header_timer = None
        _header_bytes = 0
        _client = None  # the address counted in `clients` for this connection
        _pending = None  # from a trusted proxy: the first bytes, until they tell whose connection it is

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
            peer = transport.get_extra_info("peername")
            if proxy_protocol.is_trusted(peer, proxies):
                super().connection_made(transport)
                self._arm()  # the PROXY header is part of the headers that must arrive in time
                self._pending = b""
                return
            if not self._admit(transport, peer):
                return  # never handed to uvicorn: not in its connections, no parser work, no timer
            super().connection_made(transport)
            self._arm()  # a connection that sends nothing is closed as well

        def _admit(self, transport, peer) -> bool:
            """Counts the connection under its client's address; over the cap: answered 503 and closed."""
            if clients is None:
                return True
            client = client_of(peer)
            if client is None:
                return True
            if not clients.admit(client):
                transport.write(clients.response)
                transport.close()
                return False
            self._client = client
            return True

        def _read_proxy_header(self, data: bytes) -> bytes | None:
            """The bytes after the PROXY header once it is read and the real client admitted; None while
            more are needed or when the connection was closed."""
            data = self._pending + data
            try:
                parsed = proxy_protocol.parse(data)
            except proxy_protocol.ProxyHeaderError as error:
                self.logger.warning("closing a connection from a trusted proxy: %s", error)
                self.transport.close()
                return None
            if parsed is None:
                self._pending = data
                return None
            self._pending = None
            consumed, source = parsed
            if source is not None:
                self.client = source  # uvicorn's scope["client"] of every request on this connection
            if not self._admit(self.transport, source or self.client):
                return None
            return data[consumed:]

        def connection_lost(self, exc) -> None:
            if self.transport is None:
                return  # refused in connection_made
            if self._client is not None:
                clients.release(self._client)
                self._client = None
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.transport is None:
                return  # nothing of a refused connection is parsed
            if self._pending is not None:
                if self.transport.is_closing():
                    return
                data = self._read_proxy_header(data)
                if not data:
                    return
            super().data_received(data)

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
