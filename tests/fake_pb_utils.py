"""A stand-in for triton_python_backend_utils, enough to run every model.py without a server."""
from __future__ import annotations

import json

import numpy as np

_DTYPES = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT64": np.uint64, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


bls_handler = None  # tests that run a BLS front set it: (request, decoupled) -> response(s)


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL):
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceTrace:
    """A request's trace handle (request.trace()), to pass to the BLS calls it makes; `context` is what
    get_context() gives (Triton: a JSON object with the traceparent when the request is traced)."""

    def __init__(self, context: str = ""):
        self.context = context

    def get_context(self) -> str:
        return self.context


class InferenceRequest:
    """Test-side request: built from {name: array}; mirrors the server-side request API."""

    def __init__(self, inputs: dict[str, np.ndarray] | list[Tensor] | None = None, request_id: str = "",
                 model_name: str = "", requested_output_names=None, trace: "InferenceTrace | None" = None,
                 parameters: dict | str | None = None, timeout: int = 0, **_):
        self.passed_trace = trace  # a BLS call's `trace=` (the calling request's trace())
        self._timeout = timeout  # microseconds, 0: none (Triton's `timeout` request parameter)
        # request parameters: Triton hands a model their JSON (a BLS call passes a dict)
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        self._trace = InferenceTrace()
        if isinstance(inputs, list):  # a BLS request built by a model: a list of Tensors
            inputs = {t.name(): t.as_numpy() for t in inputs}
        self._inputs = {k: Tensor(k, v) for k, v in (inputs or {}).items()}
        self.cancelled = False
        self._request_id = request_id
        self.model_name, self.requested_output_names = model_name, requested_output_names
        self.sender = ResponseSender()

    def exec(self, decoupled: bool = False):
        """A BLS call: answered by the test's `bls_handler(request, decoupled)` (a response, or for a
        decoupled call an iterable of responses)."""
        if bls_handler is None:
            raise RuntimeError("this test set no fake_pb_utils.bls_handler for BLS calls")
        return bls_handler(self, decoupled)

    def request_id(self) -> str:
        return self._request_id

    def timeout(self) -> int:
        return self._timeout

    def trace(self) -> "InferenceTrace":
        return self._trace

    def parameters(self) -> str:
        return self._parameters

    def get_response_sender(self) -> "ResponseSender":
        return self.sender

    def inputs(self) -> list[Tensor]:
        return list(self._inputs.values())

    def is_cancelled(self) -> bool:
        return self.cancelled


class ResponseSender:
    """A decoupled model's sender: records (response, flags); `answered` is set by the final flag."""

    def __init__(self):
        import threading

        self.sent: list[tuple["InferenceResponse | None", int]] = []
        self.answered = threading.Event()

    def send(self, response: "InferenceResponse | None" = None, flags: int = 0) -> None:
        self.sent.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.answered.set()


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name: str, description: str, kind: str):
        self.name = name

    def Metric(self, labels: dict | None = None, buckets: list | None = None) -> "_Metric":
        return _Metric()


class _Metric:
    def __init__(self):
        self.value = 0.0
        self.observed: list[float] = []  # a histogram's observations

    def set(self, value: float) -> None:
        self.value = value

    def increment(self, value: float) -> None:
        self.value += value

    def observe(self, value: float) -> None:
        self.observed.append(value)


class InferenceResponse:
    def __init__(self, output_tensors=None, error: TritonError | None = None):
        self._outputs, self._error = list(output_tensors or []), error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def output(self, name: str) -> np.ndarray:
        return next(t.as_numpy() for t in self._outputs if t.name() == name)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request._inputs.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((o for o in model_config.get("output", []) if o["name"] == name), None)


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((i for i in model_config.get("input", []) if i["name"] == name), None)


def triton_string_to_numpy(type_string: str):
    return _DTYPES[type_string]


TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
