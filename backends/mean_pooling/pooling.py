"""sentence-transformers' Pooling module (mean, CLS, max, last token, mean/sqrt(len), weighted mean) and
its Normalize module, in numpy."""
from __future__ import annotations

import numpy as np

MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean")


def pool(token_embeddings: np.ndarray, attention_mask: np.ndarray, mode: str = "mean",
         normalize: bool = True) -> np.ndarray:
    """[rows, len, hidden] and [rows, len] (right padding) -> [rows, hidden] float32, as
    sentence_transformers.models.Pooling computes it (then Normalize when `normalize`)."""
    hidden = token_embeddings.astype(np.float32)
    mask = attention_mask.astype(np.float32)[:, :, None]
    if mode == "mean":
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    elif mode == "mean_sqrt_len_tokens":
        pooled = (hidden * mask).sum(axis=1) / np.sqrt(np.maximum(mask.sum(axis=1), 1e-9))
    elif mode == "weightedmean":  # position i (from 1) weighs i
        weights = mask * np.arange(1, hidden.shape[1] + 1, dtype=np.float32)[None, :, None]
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    elif mode == "cls":
        pooled = hidden[:, 0]
    elif mode == "max":
        # sentence-transformers sets padding to -1e9 before the max
        pooled = np.where(mask > 0, hidden, np.float32(-1e9)).max(axis=1)
    elif mode == "lasttoken":
        last = np.maximum(attention_mask.astype(np.int64).sum(axis=1) - 1, 0)
        pooled = hidden[np.arange(hidden.shape[0]), last]
    else:
        raise ValueError(f"pooling mode {mode!r} is not one of {MODES}")
    if normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return pooled.astype(np.float32)


def mean_pool_normalize(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """[rows, len, hidden] and [rows, len] -> L2-normalized mean-pooled [rows, hidden] float32."""
    return pool(token_embeddings, attention_mask, "mean", True)
