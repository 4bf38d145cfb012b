"""The launcher's canaries: one cheap request per model whose stub can hang while staying alive.

Triton 2.51's python_backend stub can deadlock in codegen_stream (a decoupled BLS front, docs/operations.md: "A
python_backend bug"): the process lives on, so the /proc scan sees nothing, but it never answers again.
A canary raises when its model gives no final answer in time; the supervisor heals after repeated failures."""
from __future__ import annotations

import queue
import time
from collections.abc import Callable

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from supervisor.workload import request_inputs, stream_call

# the front's refusal over capacity (stage_common.bounded_workers): raised by its Python code, so not hung
OVERLOADED = "requests in flight, the limit"


class StreamCanary:
    """A 2-token completion over a gRPC stream, on its own client (made on first use, dropped after a failure so
    that a broken channel is not reused)."""

    def __init__(self, grpc_url: str, model: str, headers: dict[str, str] | None, timeout_s: float):
        self.grpc_url, self.model, self.headers, self.timeout_s = grpc_url, model, headers, timeout_s
        self.client: grpcclient.InferenceServerClient | None = None

    def __call__(self) -> None:
        started = time.monotonic()
        try:
            self.client = self.client or grpcclient.InferenceServerClient(self.grpc_url)
            try:
                final = stream_call(self.client, self.model, request_inputs("def f():", 2), self.timeout_s,
                                    self.headers)
            except queue.Empty:
                raise TimeoutError(f"no answer from {self.model} in {self.timeout_s:g} s") from None
            except InferenceServerException as exc:
                if OVERLOADED in str(exc.message()):
                    return
                raise
            if time.monotonic() - started > self.timeout_s:  # each response came in time, not the last one
                raise TimeoutError(f"no final answer from {self.model} in {self.timeout_s:g} s")
            reason = final.as_numpy("finish_reason")
            if reason is None or reason.reshape(-1)[0].decode() not in ("stop", "length"):
                raise RuntimeError(f"{self.model}'s final response has no finish_reason")
        except BaseException:
            if self.client is not None:
                client, self.client = self.client, None
                client.close()
            raise


def default_canaries(grpc_url: str, admin_headers: dict[str, str] | None = None,
                     timeout_s: float = 20.0) -> dict[str, Callable[[], None]]:
    """model -> canary, for the BLS fronts a caller reaches directly (an ensemble has no stub of its own)."""
    return {"codegen_stream": StreamCanary(grpc_url, "codegen_stream", admin_headers, timeout_s)}
