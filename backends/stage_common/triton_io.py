"""The one adapter between Triton's Python backend and the project's Triton-free stage code."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import triton_python_backend_utils as pb_utils

from stage_common.errors import BadInput, Overloaded, StageError, check_limit, decode_utf8, internal_error_message
from stage_common.gpu_placement import GpuPlacement, placement_from_args

GPU_FALLBACK_METRIC = "stage_gpu_fallback"
_fallback_metrics: list = []


def load_model_config(args: dict) -> dict:
    return json.loads(args["model_config"])


def version_dir(args: dict) -> Path:
    """The model's version folder, where `make model` puts its artifacts."""
    return Path(args["model_repository"]) / args["model_version"]


def gpu_placement(args: dict) -> GpuPlacement | None:
    """The GPU Triton placed this instance on (KIND_AUTO/KIND_GPU), None on a CPU instance. A runtime that
    cannot use it refuses to load; with ALLOW_CPU_FALLBACK=1 it runs on the CPU, warns once and sets the gauge
    `stage_gpu_fallback` (1 per such stub) on Triton's /metrics."""
    return placement_from_args(args, on_fallback=lambda runtime, missing: _fallback_gauge(args, runtime))


def _fallback_gauge(args: dict, runtime: str) -> None:
    family = pb_utils.MetricFamily(GPU_FALLBACK_METRIC, "stage instances that Triton placed on a GPU but run on the "
                                   "CPU (ALLOW_CPU_FALLBACK=1), per stub process", pb_utils.MetricFamily.GAUGE)
    labels = {"model": args.get("model_name", "?"), "gpu": str(args.get("model_instance_device_id", 0)),
              "runtime": runtime, "stub_pid": str(os.getpid())}
    metric = family.Metric(labels)
    metric.set(1)
    _fallback_metrics.append((family, metric))  # a Metric lives as long as Python holds it


def input_array(request, name: str, optional: bool = False) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if optional:
            return None
        raise BadInput(f"missing input '{name}'")
    return tensor.as_numpy()


def text_rows(request, name: str, max_bytes: int | None = None, setting: str = "") -> list[str]:
    """A [batch, 1] TYPE_STRING input as one str per row; invalid UTF-8 is the client's error. With
    `max_bytes`, a longer row is refused before it is decoded, naming `setting`."""
    rows = [v if isinstance(v, bytes) else str(v).encode() for v in input_array(request, name).reshape(-1)]
    if max_bytes is not None:
        for i, data in enumerate(rows):
            check_limit(len(data), max_bytes, f"the size of '{name}' row {i} (bytes)", setting)
    return [decode_utf8(data, f"'{name}' row {i}") for i, data in enumerate(rows)]


def string_tensor(name: str, values: Sequence[str], shape: tuple[int, ...]) -> "pb_utils.Tensor":
    data = np.array([v.encode("utf-8") for v in values], dtype=np.object_).reshape(shape)
    return pb_utils.Tensor(name, data)


def triton_error(exc: BaseException) -> "pb_utils.TritonError":
    """BadInput -> INVALID_ARG with its message; Overloaded -> UNAVAILABLE; StageError -> the other
    stage's own error; anything else -> INTERNAL with an id only (the traceback goes to the server log,
    never to the client)."""
    if isinstance(exc, BadInput):
        return pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
    if isinstance(exc, Overloaded):
        return pb_utils.TritonError(str(exc), pb_utils.TritonError.UNAVAILABLE)
    if isinstance(exc, StageError):
        return pb_utils.TritonError(exc.error.message(), exc.error.code())
    return pb_utils.TritonError(internal_error_message(exc))


def error_response(exc: BaseException) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[], error=triton_error(exc))


def execute_batched(requests: Sequence[Any], parse: Callable[[Any], Any],
                    compute: Callable[[list[Any]], list[Any]],
                    respond: Callable[[Any, Any], list["pb_utils.Tensor"]]) -> list:
    """Parse each request on its own (bad input fails only that request), compute once for all
    good ones, and build one response per request, in order. `compute` returns one result per
    parsed request; an exception in place of a result fails only that request."""
    responses: list = [None] * len(requests)
    good: list[tuple[int, Any]] = []
    for i, request in enumerate(requests):
        try:
            good.append((i, parse(request)))
        except Exception as exc:  # noqa: BLE001 - every failure is reported to its own client
            responses[i] = error_response(exc)
    if good:
        try:
            results = compute([parsed for _, parsed in good])
        except Exception as exc:  # noqa: BLE001
            results = [exc] * len(good)
        for (i, parsed), result in zip(good, results):
            if isinstance(result, BaseException):
                responses[i] = error_response(result)
                continue
            try:
                responses[i] = pb_utils.InferenceResponse(output_tensors=respond(parsed, result))
            except Exception as exc:  # noqa: BLE001
                responses[i] = error_response(exc)
    return responses
