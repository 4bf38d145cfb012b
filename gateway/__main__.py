"""`python -m gateway`: serve the gateway with uvicorn on HOST:GATEWAY_PORT (settings from the environment).

SIGTERM / Ctrl-C drain first (gateway/server/draining.py): /health turns 503, new requests get 503, those
in flight finish until DRAIN_S, then uvicorn stops. A second signal stops at once."""
from __future__ import annotations

import uvicorn

from gateway.app import configure_logging, create_app
from gateway.server.draining import DrainingServer
from gateway.server.http_protocol import bounded_protocol
from gateway.settings import Settings


def server_config(settings: Settings, app) -> uvicorn.Config:
    """uvicorn's options for the gateway's `app`: the connection bounds of docs/security.md."""
    # loop "auto": uvloop where installed; http: httptools (requirements.txt) with the header bounds and the
    # per-address connection cap of gateway/server/http_protocol.py. Connection bounds: docs/security.md. The
    # drain has already waited for requests in flight: uvicorn's own wait is a short backstop. No
    # X-Forwarded-For (uvicorn believes it from 127.0.0.1 by default, so any local client, or any client
    # through a local proxy that passes the header on, could pick its address): a client's address is its
    # connection's, or what a PROXY header from TRUSTED_PROXIES says (gateway/server/proxy_protocol.py).
    # Keep-alive: KEEP_ALIVE_S (75 s, nginx's default) outlives the idle time of the common client pools
    # (aiohttp 15 s, httpx 5 s), so a pooled client drops an idle connection before the gateway closes it and
    # never sends its next request into one being closed (issue 55: aiohttp's ServerDisconnectedError after the
    # old 5 s). A connection the gateway ends while answering (the drain, a refused connection) says
    # `Connection: close` (gateway/middleware/admission.py, gateway/server/http_protocol.py).
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                          timeout_graceful_shutdown=5, loop="auto", http=bounded_protocol(settings),
                          proxy_headers=False,
                          timeout_keep_alive=settings.keep_alive_s, limit_concurrency=settings.max_connections)


def main() -> None:
    configure_logging()
    settings = Settings.from_env()
    app = create_app(settings)
    DrainingServer(server_config(settings, app), app.state.admission).run()


if __name__ == "__main__":
    main()
