"""Rows of many requests stacked for one forward: the encoders (transformer_encoder, clip_encoder's text tower)
pad token ids and masks together this way."""
from __future__ import annotations

import numpy as np


def pad_together(arrays: list[np.ndarray], pad_value: int = 0) -> np.ndarray:
    """Stack [rows_i, len_i] int arrays into [sum(rows_i), max(len_i)], right-padded."""
    longest = max(a.shape[1] for a in arrays)
    out = np.full((sum(a.shape[0] for a in arrays), longest), pad_value, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[row:row + a.shape[0], : a.shape[1]] = a
        row += a.shape[0]
    return out
