"""`python -m gateway`: serve the gateway with uvicorn on HOST:GATEWAY_PORT (settings from the environment)."""
from __future__ import annotations

import uvicorn

from gateway.app import configure_logging, create_app
from gateway.settings import Settings


def main() -> None:
    configure_logging()
    settings = Settings.from_env()
    # loop/http "auto": uvloop and httptools (requirements.txt) where installed, asyncio and h11 elsewhere
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=30, loop="auto", http="auto")


if __name__ == "__main__":
    main()
