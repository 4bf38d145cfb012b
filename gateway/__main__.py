"""`python -m gateway`: serve the gateway with uvicorn on HOST:GATEWAY_PORT (settings from the environment).

SIGTERM / Ctrl-C drain first (gateway/admission.py): /health turns 503, new requests get 503, those in
flight finish until DRAIN_S, then uvicorn stops. A second signal stops at once."""
from __future__ import annotations

import asyncio

import uvicorn

from gateway.app import configure_logging, create_app
from gateway.http_protocol import bounded_protocol
from gateway.settings import Settings


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, admission):
        super().__init__(config)
        self.admission = admission
        self._drain: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._drain is not None or self._loop is None or not self.started:
            return super().handle_exit(sig, frame)  # a second signal, or before start-up: uvicorn's own
        # a signal handler runs between two bytecodes of the loop's thread: schedule, do not run
        self._loop.call_soon_threadsafe(self._start_drain)
        self._drain = True  # placeholder until the task exists: a second signal takes the branch above

    def _start_drain(self) -> None:
        async def drain_then_exit():
            await self.admission.drain()
            self.should_exit = True

        self._drain = self._loop.create_task(drain_then_exit())


def main() -> None:
    configure_logging()
    settings = Settings.from_env()
    app = create_app(settings)
    # loop "auto": uvloop where installed; http: httptools (requirements.txt) with the header bounds of
    # gateway/http_protocol.py. Connection bounds: docs/security.md. The drain has already waited for
    # requests in flight: uvicorn's own wait is a short backstop
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, loop="auto", http=bounded_protocol(settings),
                            timeout_keep_alive=settings.keep_alive_s, limit_concurrency=settings.max_connections)
    DrainingServer(config, app.state.admission).run()


if __name__ == "__main__":
    main()
