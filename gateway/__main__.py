"""`python -m gateway`: serve the gateway with uvicorn on HOST:GATEWAY_PORT (settings from the environment).

SIGTERM / Ctrl-C drain first (gateway/server/draining.py): /health turns 503, new requests get 503, those
in flight finish until DRAIN_S, then uvicorn stops. A second signal stops at once."""
from __future__ import annotations

import uvicorn

from gateway.app import configure_logging, create_app
from gateway.server.draining import DrainingServer
from gateway.server.http_protocol import bounded_protocol
from gateway.settings import Settings


def main() -> None:
    configure_logging()
    settings = Settings.from_env()
    app = create_app(settings)
    # loop "auto": uvloop where installed; http: httptools (requirements.txt) with the header bounds of
    # gateway/server/http_protocol.py. Connection bounds: docs/security.md. The drain has already waited for
    # requests in flight: uvicorn's own wait is a short backstop
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, loop="auto", http=bounded_protocol(settings),
                            timeout_keep_alive=settings.keep_alive_s, limit_concurrency=settings.max_connections)
    DrainingServer(config, app.state.admission).run()


if __name__ == "__main__":
    main()
