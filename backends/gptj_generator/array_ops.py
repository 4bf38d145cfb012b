"""The few array operations where numpy and torch differ in name or signature, for the one sampler and logprob
function (sampling.py) that both engines call on their own arrays: the OpenVINO engine on numpy (it never imports
torch), the torch engine on its step's logits tensor, where they are. Why not convert the torch engine's logits to
numpy: on a CUDA instance that is a copy from the GPU and a sync for every sampled or scored row of every step,
and the sort of top-p would run on the host; here the math stays on the logits' device and only the chosen id (and
the logprobs asked for) come back. Everything else (indexing, arithmetic, .max/.sum/.argmax/.tolist) is spelled
the same in both. (array-api-compat is the library for this, less top-k; these lines spare every stub a dependency.)
"""
from __future__ import annotations

import numpy as np


class NumpyOps:
    """float64 (a scorer row is float32; the OpenVINO engine's sampling and logprobs were float64 from the start)."""

    @staticmethod
    def as_float(x):
        return x.astype(np.float64)

    @staticmethod
    def softmax(x):
        probs = np.exp(x - x.max())
        return probs / probs.sum()

    @staticmethod
    def log_softmax(x):
        shifted = x.astype(np.float64) - x.max()
        return shifted - np.log(np.exp(shifted).sum())

    cumsum = staticmethod(np.cumsum)

    @staticmethod
    def where(condition, x, y):
        return np.where(condition, x, y)

    @staticmethod
    def kth_largest(x, k: int):
        return np.partition(x, -k)[-k]

    @staticmethod
    def argsort_descending(x):
        return np.argsort(-x, kind="stable")  # equal values keep their id order, as torch's stable sort does

    @staticmethod
    def unsort(values, order):
        """x such that x[order] == values."""
        out = np.empty_like(values)
        out[order] = values
        return out

    @staticmethod
    def top(x, k: int):
        """(ids, values) of the k largest, largest first."""
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        return ids, x[ids]

    @staticmethod
    def searchsorted_right(cdf, u):
        return np.searchsorted(cdf, u, side="right")

    @staticmethod
    def uniform(rng: np.random.Generator, like):
        return rng.random()  # one double: what Generator.choice(n, p=...) draws


class TorchOps:
    """float32, as the torch engine's logits come and as transformers' reference computes log_softmax (half precision
    is not stable for sampling); torch's fused softmax kernels. Only built for torch tensors: importing this module
    imports no torch."""

    def __init__(self):
        import torch

        self.torch = torch
        self.where = torch.where

    @staticmethod
    def as_float(x):
        return x.float()

    def softmax(self, x):
        return self.torch.softmax(x, dim=0)

    def log_softmax(self, x):
        return self.torch.log_softmax(x.float(), dim=0)

    def cumsum(self, x):
        return self.torch.cumsum(x, dim=0)

    def kth_largest(self, x, k: int):
        return self.torch.topk(x, k).values[-1]

    def argsort_descending(self, x):
        return self.torch.argsort(x, descending=True, stable=True)

    @staticmethod
    def unsort(values, order):
        return values.scatter(0, order, values)

    def top(self, x, k: int):
        best = self.torch.topk(x, k)
        return best.indices, best.values

    def searchsorted_right(self, cdf, u):
        return self.torch.searchsorted(cdf, u, right=True)

    def uniform(self, rng, like):
        """From the request's torch.Generator, on its (the logits') device: nothing crosses to the host."""
        return self.torch.rand((), generator=rng, device=rng.device, dtype=like.dtype)


_numpy = NumpyOps()
_torch: TorchOps | None = None


def ops_for(x):
    """The operations for x's library: numpy for an ndarray, else torch (x is a tensor, so torch is loaded)."""
    global _torch
    if isinstance(x, np.ndarray):
        return _numpy
    if _torch is None:
        _torch = TorchOps()
    return _torch
