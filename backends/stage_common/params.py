"""Typed reading of a model's config.pbtxt `parameters` (Triton hands them over as strings)."""
from __future__ import annotations

from typing import Any, Callable

_REQUIRED = object()


def _to_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


_CASTS: dict[type, Callable[[str], Any]] = {bool: _to_bool, int: int, float: float, str: str}


def config_param(model_config: dict, name: str, cast: type = str, default: Any = _REQUIRED) -> Any:
    entry = model_config.get("parameters", {}).get(name)
    raw = entry.get("string_value") if isinstance(entry, dict) else entry
    if raw is None or raw == "":
        if default is _REQUIRED:
            raise ValueError(f"model '{model_config.get('name')}' needs parameter '{name}' in config.pbtxt")
        return default
    try:
        return _CASTS[cast](raw)
    except ValueError as e:
        raise ValueError(f"model '{model_config.get('name')}' parameter '{name}': {e}") from None


def runtime_params(model_config: dict, onnx_built: bool) -> tuple[str, int]:
    """(runtime, threads) of a network stage: `runtime` onnx or torch (default onnx when `make model`
    built the ONNX files, else torch); `threads` per execution (`torch_threads`, the older name, is read
    when `threads` is absent), default 1."""
    runtime = config_param(model_config, "runtime", str, "onnx" if onnx_built else "torch")
    if runtime not in ("onnx", "torch"):
        raise ValueError(f"model '{model_config.get('name')}' parameter 'runtime' must be onnx or torch, "
                         f"not {runtime!r}")
    return runtime, config_param(model_config, "threads", int, config_param(model_config, "torch_threads", int, 1))
