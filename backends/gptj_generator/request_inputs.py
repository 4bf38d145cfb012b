"""Reading the per-request scalar and stop-word inputs (torch-free, shared with the preprocessing)."""
from __future__ import annotations

from stage_common.errors import BadInput, decode_utf8
from stage_common.triton_io import input_array


def scalar_input(request, name: str, default=None, required: bool = False):
    """The single value of a [1, 1] input; `default` when an optional input is absent."""
    array = input_array(request, name, optional=not required)
    if array is None:
        return default
    if array.size != 1:
        raise BadInput(f"'{name}' takes one value per request, got shape {list(array.shape)}")
    return array.reshape(-1)[0].item()


def stop_words_input(request, name: str = "stop_words") -> list[str]:
    array = input_array(request, name, optional=True)
    if array is None:
        return []
    words = [decode_utf8(w if isinstance(w, bytes) else str(w).encode(), "a stop word") for w in array.reshape(-1)]
    return [w for w in words if w]
