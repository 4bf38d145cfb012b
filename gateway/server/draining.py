"""uvicorn's Server with the gateway's drain: on SIGTERM / Ctrl-C, /health turns 503, new requests get 503,
those in flight finish until DRAIN_S (gateway/middleware/admission.py), then uvicorn stops. A second
signal stops at once."""
from __future__ import annotations

import asyncio

import uvicorn

from gateway.middleware.admission import Admission


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, admission: Admission):
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
