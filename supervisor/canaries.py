"""The launcher's canaries: one cheap request per BLS front, whose stub can hang while staying alive.

Triton 2.51's python_backend stub can deadlock in a BLS front (docs/operations.md: "A python_backend bug"): the process
lives on, so the stub scan sees nothing, but it never answers again. A canary raises when its front gives no
final answer in time; the supervisor heals after repeated failures. Every pipeline with a BLS front has one:
codegen_stream (decoupled) and codegen_collect (the unary codegen's BLS step).

A slow answer is not a hang (issue 35): under load the canary's request may wait for a generator row longer
than its timeout, and reloading the front then fails every stream it serves. So:
- a refusal or an error the front sends from its own code (over capacity, the generator's full queue, a call
  its generator lost or did not answer) is an answer: the front is alive;
- when the canary's request times out, a second request that the front refuses at once (bad input, checked
  before any generator row) tells the two apart: refused in time -> overloaded, not hung; no answer -> hung."""
from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from supervisor.codegen_probe import request_inputs, stream_call, tensor

# refusals raised by the fronts' (and the generator's) Python code: the front answered, so it is not hung
ANSWERED = ("requests in flight, the limit",  # the front over capacity (stage_common.bounded_workers)
            "waiting for a row",  # the generator's queue is full (max_pending_requests)
            "lost the request", "gave no answer in",  # a generator call lost or past its deadline (bls_deadline)
            "ended the request early")  # the generator dropped the row (stage_common.errors.check_finish_reason)
OVERLOADED = ANSWERED[0]


def answered_by_the_front(exc: InferenceServerException) -> bool:
    message = str(exc.message())
    return any(marker in message for marker in ANSWERED)


class _Canary:
    """One request per call on its own client (made on first use, dropped after a failure so that a broken
    channel is not reused); subclasses send the good request (`ask`) and the one refused at once (`refused`)."""

    def __init__(self, grpc_url: str, model: str, headers: dict[str, str] | None, timeout_s: float,
                 liveness_timeout_s: float = 10.0):
        self.grpc_url, self.model, self.headers, self.timeout_s = grpc_url, model, headers, timeout_s
        self.liveness_timeout_s = liveness_timeout_s
        self.client: grpcclient.InferenceServerClient | None = None
        self.overloaded = 0  # timeouts found to be overload, not a hang (read by tests and logs)
        self.refusals: list[str] = []  # refusals the front sent from its own code (an answer, not a hang)

    def __call__(self) -> None:
        try:
            self.client = self.client or grpcclient.InferenceServerClient(self.grpc_url)
            try:
                self.ask(self.client)
            except InferenceServerException as exc:
                if answered_by_the_front(exc):
                    self.refusals.append(str(exc.message()))
                    return
                raise
            except TimeoutError:
                if self.alive():
                    self.overloaded += 1
                    return
                raise
        except BaseException:
            if self.client is not None:
                client, self.client = self.client, None
                client.close()
            raise

    def alive(self, timeout_s: float | None = None) -> bool:
        """Whether the front refuses a bad request within `timeout_s` (default liveness_timeout_s; a fresh
        client: the canary's own channel may be the stuck one)."""
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            self.refused(client, self.liveness_timeout_s if timeout_s is None else timeout_s)
        except InferenceServerException as exc:
            return "DEADLINE" not in str(exc.status() or "") and "Deadline" not in str(exc.message())
        except (TimeoutError, queue.Empty):
            return False
        finally:
            client.close()
        return True  # answered: alive (though it should have refused)

    def ask(self, client) -> None:
        raise NotImplementedError

    def refused(self, client, timeout_s: float) -> None:
        raise NotImplementedError


class StreamCanary(_Canary):
    """A 2-token completion over a gRPC stream."""

    def ask(self, client) -> None:
        started = time.monotonic()
        try:
            final = stream_call(client, self.model, request_inputs("def f():", 2), self.timeout_s, self.headers)
        except queue.Empty:
            raise TimeoutError(f"no answer from {self.model} in {self.timeout_s:g} s") from None
        if time.monotonic() - started > self.timeout_s:  # each response came in time, not the last one
            raise TimeoutError(f"no final answer from {self.model} in {self.timeout_s:g} s")
        reason = final.as_numpy("finish_reason")
        if reason is None or reason.reshape(-1)[0].decode() not in ("stop", "length"):
            raise RuntimeError(f"{self.model}'s final response has no finish_reason")

    def refused(self, client, timeout_s: float) -> None:
        stream_call(client, self.model, request_inputs("def f():", 2, temperature=float("nan")), timeout_s,
                    self.headers)


def _collect_inputs(ids: list[int], length: int) -> list[grpcclient.InferInput]:
    arrays = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[length]], np.int32),
              "generation_params": np.array([[json.dumps({"max_tokens": 2}).encode()]], np.object_)}
    return [tensor(name, array) for name, array in arrays.items()]


class UnaryCanary(_Canary):
    """A 2-token generation straight into codegen_collect (the BLS step of the unary codegen ensemble)."""

    def ask(self, client) -> None:
        try:
            result = client.infer(self.model, _collect_inputs([1, 2, 3], 3), client_timeout=self.timeout_s,
                                  headers=self.headers)
        except InferenceServerException as exc:
            if "DEADLINE" in str(exc.status() or "") or "Deadline" in str(exc.message()):
                raise TimeoutError(f"no answer from {self.model} in {self.timeout_s:g} s") from None
            raise
        reason = result.as_numpy("finish_reason")
        if reason is None or reason.reshape(-1)[0].decode() not in ("stop", "length"):
            raise RuntimeError(f"{self.model}'s answer has no finish_reason")

    def refused(self, client, timeout_s: float) -> None:
        # an empty prompt: refused by the front itself, before any generator call (INVALID_ARGUMENT), so that
        # the answer tells about the front alone, not about a generator busy or just healed (issue 48)
        client.infer(self.model, _collect_inputs([1], 0), client_timeout=timeout_s, headers=self.headers)


def default_canaries(grpc_url: str, admin_headers: dict[str, str] | None = None,
                     timeout_s: float = 20.0) -> dict[str, Callable[[], None]]:
    """model -> canary, for every BLS front (an ensemble has no stub of its own: codegen's is codegen_collect)."""
    return {"codegen_stream": StreamCanary(grpc_url, "codegen_stream", admin_headers, timeout_s),
            "codegen_collect": UnaryCanary(grpc_url, "codegen_collect", admin_headers, timeout_s)}
