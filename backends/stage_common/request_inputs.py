"""Readers of a request's small inputs: one value per request, one value per row, stop words (torch-free)."""
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


def row_values(request, name: str, rows: int) -> list | None:
    """The one value of each row of a [rows, 1] input (None when the optional input is absent)."""
    array = input_array(request, name, optional=True)
    if array is None:
        return None
    if array.shape[0] != rows or array.size != rows:
        raise BadInput(f"'{name}' takes one value per row, got shape {list(array.shape)} for {rows} row(s)")
    return [v.item() if hasattr(v, "item") else v for v in array.reshape(-1)]


def row_stop_words(request, rows: int, name: str = "stop_words") -> list[list[str]]:
    """Each row's stop words of a [rows, k] TYPE_STRING input (empty strings are padding)."""
    array = input_array(request, name, optional=True)
    if array is None:
        return [[] for _ in range(rows)]
    if array.ndim == 1 or array.shape[0] != rows:
        array = array.reshape(rows, -1) if array.size % max(rows, 1) == 0 else array
    if array.shape[0] != rows:
        raise BadInput(f"'{name}' must have one row of stop words per prompt, got shape {list(array.shape)}")
    return [[w for w in (decode_utf8(v if isinstance(v, bytes) else str(v).encode(), "a stop word")
                         for v in row.reshape(-1)) if w] for row in array]
