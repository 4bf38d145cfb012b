"""Training the demo models with arithmetic that comes out the same on every x86-64 CPU.

One thread and fixed seeds make training repeat itself on one machine, but the libraries under torch
pick their code from the CPU: torch's own vectorized kernels run 512-bit vectors on an AVX-512 CPU
and 256-bit ones on an AVX2 CPU, so their sums run in another order; MKL (torch's BLAS on x86-64)
picks its code by vendor and instruction set; oneDNN (convolutions, LSTMs) by instruction set and
cache sizes. The same code had trained two different GPT-Js: 76% of held-out headers parsed on an
AMD EPYC (AVX2), 58% on an Intel Xeon (AVX-512, AMX).

So the trainers run with
- torch's kernels held to AVX2, the widest set every x86-64 CPU of the last decade has;
- MKL in its conditional numerical reproducibility mode on its COMPATIBLE branch (SSE2 without
  approximate reciprocals), the one branch MKL documents for Intel and non-Intel CPUs alike: on an
  AMD CPU its AVX2 branch is not taken, MKL runs its own choice instead. STRICT makes the result
  independent of how arrays happen to be aligned;
- oneDNN switched off (without_onednn, in common.trained): convolutions and LSTMs then run torch's
  own kernels over MKL's matrix products; its instruction set is capped at AVX2 for anything else;
- fused Adam/AdamW steps (the trainers): the unfused step takes its square roots through MKL's vector
  math, whose COMPATIBLE code gave other bits on an Intel Xeon than on an emulated CPU (it relies on
  an approximate instruction, which each CPU computes its own way).

The libraries read these variables once, the first time they run, so they are set before torch is
imported: build/build_models.py calls pin() first thing, and the training workers it starts inherit them.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "DNNL_MAX_CPU_ISA": "AVX2",  # both spellings of oneDNN's variable
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def pin() -> None:
    """Hold this process and the processes it starts to PINNED. Values set before are replaced: what
    `make model` trains must not depend on who runs it either."""
    if "torch" in sys.modules:
        raise RuntimeError("pin the instruction set before torch is imported: its libraries may have read it")
    os.environ.update(PINNED)


def in_effect() -> str:
    """The pinned variables as this process has them, for the training stamp: a model trained without
    them (or with other values) is not the one `make model` trains, so it is trained again."""
    return ";".join(f"{name}={os.environ.get(name, '')}" for name in sorted(PINNED))


@contextmanager
def without_onednn():
    """oneDNN off: its kernels depend on the CPU's cache sizes, not only on its instruction set."""
    import torch

    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before
