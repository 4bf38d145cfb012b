"""What the canaries send a codegen front: its request tensors (text_input, max_tokens and, for the request
the front refuses at once, temperature) and one streamed call read to its final response."""
from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


def tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    """One input from a numpy array: an object array is BYTES."""
    given = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    given.set_data_from_numpy(array)
    return given


def request_inputs(prompt: str, max_tokens: int, temperature: float | None = None) -> list[grpcclient.InferInput]:
    """One row of the codegen pipelines' request (client/generate.py sends the same, with every option)."""
    arrays = {"text_input": np.array([[prompt.encode("utf-8")]], dtype=np.object_),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    if temperature is not None:
        arrays["temperature"] = np.array([[temperature]], dtype=np.float32)
    return [tensor(name, array) for name, array in arrays.items()]


def stream_call(client: grpcclient.InferenceServerClient, model: str, inputs, timeout: float = 60.0,
                headers: dict[str, str] | None = None):
    """One streamed request: its final response (`timeout` bounds the wait for each response)."""
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)), headers=headers)
    timed_out = False
    try:
        try:
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        except InferenceServerException:
            # "the stream is no longer in valid state, the error detail is reported through provided callback":
            # the callback's error (e.g. UNAVAILABLE while a server restarts) is the real one
            try:
                _, error = events.get(timeout=1.0)
            except queue.Empty:
                error = None
            if error is not None:
                raise error from None
            raise
        while True:
            try:
                result, error = events.get(timeout=timeout)
            except queue.Empty:
                timed_out = True
                raise
            if error is not None:
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return result
    finally:
        # cancel only what is unanswered (a timeout): tritonclient's cancel leaves the gRPC thread that feeds
        # the request stream blocked forever (one leaked thread per call: 28,000 in a 30-minute soak; and one
        # per call while a server restarts, when the call fails before any answer)
        client.stop_stream(cancel_requests=timed_out)
