"""The Triton side of the gateway: async gRPC (nothing blocking on the event loop), numpy in and out, and Triton's
error codes turned into the gateway's error types. Inference goes through Triton's generated gRPC stub
(`tritonclient.grpc.service_pb2_grpc`) with messages built here; the control calls (live, ready, load, unload,
statistics, index) through `tritonclient.grpc.aio`'s client. Only tritonclient's public modules are imported."""
from __future__ import annotations

import asyncio
import os
import re
import struct
from dataclasses import dataclass
from typing import AsyncIterator, Mapping, Sequence

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferResult, KeepAliveOptions, service_pb2, service_pb2_grpc
from tritonclient.utils import (InferenceServerException, deserialize_bytes_tensor, np_to_triton_dtype,
                                triton_to_np_dtype)

from gateway import errors
from gateway.telemetry import spans


def _raw_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES wire format (a 4-byte little-endian length before each item), str sent as UTF-8:
    what tritonclient's serialize_byte_tensor produces, without np.vectorize and its per-call set-up."""
    pack, parts = struct.Struct("<I").pack, []
    for v in array.flat:
        b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        parts += (pack(len(b)), b)
    return b"".join(parts)


def infer_request(model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str],
                  timeout_s: float | None = None) -> service_pb2.ModelInferRequest:
    """The ModelInfer message built directly (raw_input_contents): the hot path skips tritonclient's
    InferInput/InferRequestedOutput objects and their copies (py-spy: ~9% of the gateway's CPU under load).
    `timeout_s`, the gateway's own wait, goes along as Triton's `timeout` parameter: the BLS fronts stop
    waiting for the generator when the gateway does (issue 48)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    if timeout_s:
        request.parameters["timeout"].int64_param = timeout_micros(timeout_s)
    for name, array in inputs.items():
        tensor = request.inputs.add()
        tensor.name = name
        tensor.shape.extend(array.shape)
        if array.dtype.kind in "OSU":  # object, bytes_ or str_ items: Triton's BYTES
            tensor.datatype = "BYTES"
            request.raw_input_contents.append(_raw_bytes(array))
        else:
            tensor.datatype = np_to_triton_dtype(array.dtype)
            request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name in outputs:
        request.outputs.add().name = name
    return request


def stream_request(model: str, inputs: Mapping[str, np.ndarray],
                   timeout_s: float | None = None) -> service_pb2.ModelInferRequest:
    """A decoupled model's request: every output (none named), and `triton_enable_empty_final_response` set, so
    that a model that ends with a bare FINAL flag still tells the gateway it is done. tritonclient's aio client
    refuses reserved parameters, so the message is built here (as its sync client does)."""
    request = infer_request(model, inputs, (), timeout_s)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def timeout_micros(timeout_s: float) -> int:
    return max(1, int(timeout_s * 1e6))


def response_arrays(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    """Every output of a ModelInfer response as numpy (numeric outputs are read-only views of the message)."""
    out = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        if tensor.datatype == "BYTES":
            array = deserialize_bytes_tensor(raw)
        else:
            array = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype))
        out[tensor.name] = array.reshape(tuple(tensor.shape))
    return out


def string_rows(values: Sequence[str | bytes]) -> np.ndarray:
    """[len(values), 1] object array: one item per batch row, the layout every ensemble takes."""
    return np.array([[v] for v in values], dtype=np.object_).reshape(len(values), 1)


def rpc_failure(exc: grpc.RpcError) -> InferenceServerException:
    """A failed gRPC call as tritonclient's clients report it: the message, the status code's name."""
    return InferenceServerException(exc.details(), status=str(exc.code()), debug_details=exc.debug_error_string())


def _status(exc: InferenceServerException) -> str:
    return str(exc.status() or "")


def translate(exc: InferenceServerException, model: str) -> errors.ApiError:
    """Triton's status -> the gateway's error type. INVALID_ARGUMENT is the client's fault (its message
    is meant for users); UNAVAILABLE means over capacity; anything else is internal (logged with an id)."""
    status, message = _status(exc), exc.message() or ""
    if "INVALID_ARG" in status:
        return errors.BadRequest(message, code="invalid_input")
    if "RESOURCE_EXHAUSTED" in status or "exceeds maximum queue size" in message.lower():
        return errors.Unavailable(f"model '{model}' is over capacity, retry later", code="overloaded")
    if "UNAVAILABLE" in status:  # the server is gone or restarting (connection refused, socket closed)
        return server_gone(model)
    if "DEADLINE_EXCEEDED" in status or "timeout" in message.lower():
        return errors.UpstreamTimeout(f"model '{model}' did not answer in time", code="timeout")
    if "NOT_FOUND" in status or "unknown model" in message or "is not found" in message:
        return errors.NotFound(f"model '{model}' is not loaded", code="model_not_found")
    if STUB_DIED in message.lower():
        return model_restarting(model)
    return errors.internal(exc, f"Triton call to '{model}'")


# Triton 2.51's words for a request in flight on (or sent to) a model's Python process that died: the
# supervisor restarts it within seconds (docs/self-healing.md), so the client may retry
STUB_DIED = "stub process"


def model_restarting(model: str) -> errors.ApiError:
    return errors.Unavailable(f"model '{model}' is being restarted after a failure; retry later", retry_after=2,
                              code="model_restarting")


# statuses translate() maps to their own causes; any other failure may be the server dying under the call
EXPLAINED = ("INVALID_ARG", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_FOUND")


def server_gone(model: str) -> errors.ApiError:
    return errors.Unavailable(f"the Triton server is not available for '{model}' now (restarting?); retry later",
                              retry_after=2, code="server_unavailable")


def stream_error(message: str, model: str) -> errors.ApiError:
    """A decoupled model's error as gRPC streaming reports it: the message alone, without Triton's status
    code. The stages send the client's faults as plain messages, overloads naming capacity, and internal
    faults as 'internal error (id ...)' (details in the server log), so the message tells them apart."""
    lowered = message.lower()
    if STUB_DIED in lowered:
        return model_restarting(model)
    if "internal error" in lowered or "traceback" in lowered:
        return errors.internal(RuntimeError(message), f"stream from '{model}'")
    if "over capacity" in lowered or "requests in flight" in lowered or "exceeds maximum queue size" in lowered:
        return errors.Unavailable(f"model '{model}' is over capacity, retry later", code="overloaded")
    if lowered.rstrip().endswith(("retry", "retry later")):  # the stages' other UNAVAILABLE refusals
        reason = re.sub(r":\s*retry( later)?\s*$", "", message.strip(), flags=re.IGNORECASE)
        return errors.Unavailable(f"model '{model}' could not answer now ({reason}); retry later", retry_after=2,
                                  code="unavailable")
    if "unknown model" in lowered or "is not found" in lowered or "not ready" in lowered:
        return errors.NotFound(f"model '{model}' is not loaded", code="model_not_found")
    return errors.BadRequest(message, code="invalid_input")


def channel_args() -> list[tuple[str, int]]:
    """tritonclient's defaults, plus a short reconnect backoff: gRPC's own grows to ~10 s after 30 s of a
    restarting server (seen: the gateway noticed the new server 8 s after it was ready)."""
    keepalive = KeepAliveOptions()
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            ("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
            ("grpc.max_reconnect_backoff_ms", 1000)]


@dataclass
class StreamResponse:
    outputs: dict[str, np.ndarray]  # every output the response carries (empty for an empty final one)
    final: bool


class TritonEngine:
    def __init__(self, url: str, request_timeout_s: float = 300.0):
        self.url, self.request_timeout_s = url, request_timeout_s
        self.client = grpcaio.InferenceServerClient(url, channel_args=channel_args())  # the control calls
        # inference on a channel of its own, through the generated stub: the messages are built here (no per-call
        # InferInput objects) and a stream can set the reserved parameter the aio client refuses
        self.channel = grpc.aio.insecure_channel(url, options=channel_args())
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        # Off loopback the launcher restricts Triton's model control to holders of this key (launcher/exposure.py).
        key = os.environ.get("TRITON_ADMIN_KEY")
        self.admin_headers = {"triton-grpc-protocol-triton-admin-key": key} if key else None

    async def close(self) -> None:
        await self.channel.close()
        await self.client.close()

    async def infer(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str],
                    timeout_s: float | None = None) -> dict[str, np.ndarray]:
        span = spans.start_call("ModelInfer", model)  # None unless this request is traced
        try:
            response = await self.stub.ModelInfer(
                infer_request(model, inputs, outputs, timeout_s or self.request_timeout_s),
                timeout=timeout_s or self.request_timeout_s,
                metadata=spans.grpc_metadata(span))
        except grpc.RpcError as exc:
            failure = await self._failure(rpc_failure(exc), model)
            spans.end(span, failure)
            raise failure from None
        except BaseException as exc:  # cancelled (a client gone): the span still ends
            spans.end(span, exc)
            raise
        spans.end(span)
        arrays = response_arrays(response)
        return {name: arrays[name] for name in outputs}

    async def stream_infer(self, model: str, inputs: Mapping[str, np.ndarray],
                           timeout_s: float | None = None) -> AsyncIterator[StreamResponse]:
        """One request to a decoupled model over gRPC `ModelStreamInfer`: its responses as they come, the
        last flagged final. Closing or cancelling the generator early cancels the gRPC call, which Triton
        passes on to the model as a cancelled request (the codegen front then frees its generator row)."""
        request = stream_request(model, inputs, timeout_s or self.request_timeout_s)

        async def requests():
            yield request

        span = spans.start_call("ModelStreamInfer", model)  # from the call to the final response
        call = self.stub.ModelStreamInfer(requests(), timeout=timeout_s or self.request_timeout_s,
                                          metadata=spans.grpc_metadata(span))
        done, failure, responses = False, None, 0
        try:
            async for message in call:
                responses += 1
                if responses == 1 and span is not None:
                    span.add_event("first_response")  # the time to the first token
                if message.error_message:
                    if not await self._still_live():  # the server died under the stream (issue 26: a 503)
                        raise server_gone(model)
                    raise stream_error(message.error_message, model)
                result = InferResult(message.infer_response)
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                outputs = {o.name: result.as_numpy(o.name) for o in response.outputs}
                yield StreamResponse(outputs, final)
                if final:
                    done = True
                    return
            if not await self._still_live():
                raise server_gone(model)
            raise errors.internal(RuntimeError("stream ended without a final response"), f"stream from '{model}'")
        except grpc.aio.AioRpcError as exc:  # the call itself failed (server gone, deadline)
            failure = await self._failure(rpc_failure(exc), model)
            raise failure from None
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if not done:
                call.cancel()
            spans.end(span, failure if not isinstance(failure, GeneratorExit) else None,
                      {"gateway.stream.responses": responses, "gateway.stream.complete": done} if span else None)

    async def _failure(self, exc: InferenceServerException, model: str) -> errors.ApiError:
        """translate(), except that a failure Triton does not explain (INTERNAL, UNKNOWN, CANCELLED), seen while
        the server is dying, is the server's absence: a 503 to retry, not a 500 (seen: 'Internal error from
        Core' on a stream the instant tritonserver was killed, before the server watch noticed)."""
        if not any(s in _status(exc) for s in EXPLAINED) and not await self._still_live():
            return server_gone(model)
        return translate(exc, model)

    async def _still_live(self, timeout_s: float = 1.0) -> bool:
        try:
            return bool(await asyncio.wait_for(self.client.is_server_live(), timeout_s))
        except Exception:  # noqa: BLE001 - refused, reset or too slow: not live
            return False

    async def live(self) -> bool:
        try:
            return await self.client.is_server_live()
        except InferenceServerException:
            return False

    async def ready(self, model: str) -> bool:
        try:
            return await self.client.is_model_ready(model)
        except InferenceServerException:
            return False

    async def load(self, model: str, config: str | None = None) -> None:
        try:
            await self.client.load_model(model, config=config, headers=self.admin_headers)
        except InferenceServerException as exc:
            if "UNAVAILABLE" in _status(exc):  # the server went away: the load is retried once it is back
                raise translate(exc, model) from None
            raise errors.internal(exc, f"loading '{model}'") from None

    async def unload(self, model: str, unload_dependents: bool = True) -> None:
        try:
            await self.client.unload_model(model, unload_dependents=unload_dependents,
                                           headers=self.admin_headers)
        except InferenceServerException as exc:
            raise errors.internal(exc, f"unloading '{model}'") from None

    async def wait_unloaded(self, model: str, timeout_s: float = 60.0) -> None:
        """Triton's unload returns before the stubs exit: wait until the model is gone."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while await self.ready(model) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)

    async def statistics(self, model: str = "") -> dict:
        try:
            return await self.client.get_inference_statistics(model, as_json=True)
        except InferenceServerException as exc:
            raise translate(exc, model or "*") from None

    async def repository_index(self) -> list[dict]:
        try:
            index = await self.client.get_model_repository_index(headers=self.admin_headers, as_json=True)
        except InferenceServerException as exc:
            raise errors.internal(exc, "repository index") from None
        return list(index.get("models", []))
