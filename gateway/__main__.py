"""`python -m gateway`: serve the gateway with uvicorn on HOST:GATEWAY_PORT (settings from the environment)."""
from __future__ import annotations

import uvicorn

from gateway.app import configure_logging, create_app
from gateway.http_protocol import bounded_protocol
from gateway.settings import Settings


def main() -> None:
    configure_logging()
    settings = Settings.from_env()
    # loop "auto": uvloop where installed; http: httptools (requirements.txt) with the header bounds of
    # gateway/http_protocol.py. Connection bounds: docs/security.md.
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=30, loop="auto", http=bounded_protocol(settings),
                timeout_keep_alive=settings.keep_alive_s, limit_concurrency=settings.max_connections)


if __name__ == "__main__":
    main()
