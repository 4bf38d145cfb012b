"""sentence-transformers' mean pooling followed by its Normalize module, in numpy."""
import numpy as np


def mean_pool_normalize(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """[rows, len, hidden] and [rows, len] -> L2-normalized [rows, hidden] float32."""
    mask = attention_mask.astype(np.float32)[:, :, None]
    summed = (token_embeddings.astype(np.float32) * mask).sum(axis=1)
    mean = summed / np.maximum(mask.sum(axis=1), 1e-9)
    return (mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)).astype(np.float32)
