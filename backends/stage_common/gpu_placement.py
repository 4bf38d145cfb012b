"""The GPU Triton placed a stage's instance on, and what happens when the stage's runtime cannot use it.

Triton decides the device (KIND_AUTO puts every instance on a GPU when the node has one); the stage only
learns it from `model_instance_kind` / `model_instance_device_id`. A runtime that cannot drive that GPU (the
CPU build of ONNX Runtime, a CPU-only torch, a device id the process cannot see) would otherwise run on the CPU
while Triton reports a GPU instance: slow, and nobody told. So the stage refuses to load, saying what is
missing and how to install it; ALLOW_CPU_FALLBACK=1 turns the refusal into one warning per stage instance
(plus a metric, recorded by the `on_fallback` the Triton adapter passes) and the stage runs on the CPU.
Triton-free and runtime-free: the runtimes (onnx_runtime.py, torch_runtime.py) bring their own probes."""
from __future__ import annotations

import ctypes
import logging
import os
from typing import Callable, Mapping

FALLBACK_ENV = "ALLOW_CPU_FALLBACK"
INSTALL_HINT = ("install the GPU build with `make setup GPU=1` (requirements-gpu.txt: a CUDA build of torch and "
                "onnxruntime-gpu; the image Dockerfile.triton has it)")
_log = logging.getLogger("stage")

Probe = Callable[[int], "str | None"]  # device id -> what is missing to use it (None: nothing)


class GpuUnavailable(RuntimeError):
    """Triton placed the instance on a GPU that its runtime cannot use (and ALLOW_CPU_FALLBACK is not 1)."""


class GpuPlacement:
    """One stage instance on GPU `device_id`. A runtime asks `usable(runtime, probe)` for the device it may use:
    the id, or None for the CPU after a fallback. The first refusal decides for the whole instance: later
    sessions of the same stage go to the CPU without another warning."""

    def __init__(self, stage: str, device_id: int, allow_cpu_fallback: bool = False,
                 on_fallback: Callable[[str, str], None] | None = None):
        self.stage, self.device_id = stage, device_id
        self.allow_cpu_fallback, self.on_fallback = allow_cpu_fallback, on_fallback
        self.fell_back_because: str | None = None

    @property
    def device(self) -> int | None:
        """The GPU this instance runs on, or None once it fell back to the CPU."""
        return None if self.fell_back_because is not None else self.device_id

    def usable(self, runtime: str, probe: Probe) -> int | None:
        """The device id when `probe` finds nothing missing; else `unusable` (raises, or None on fallback)."""
        if self.fell_back_because is not None:
            return None
        missing = probe(self.device_id)
        if missing is None:
            return self.device_id
        self.unusable(runtime, missing)
        return None

    def unusable(self, runtime: str, missing: str) -> None:
        """Refuse to load (GpuUnavailable), or with ALLOW_CPU_FALLBACK=1 warn once, record it, and go on."""
        if self.fell_back_because is not None:
            return
        problem = (f"{self.stage}: Triton placed this instance on GPU {self.device_id}, but {runtime} cannot use "
                   f"it: {missing}")
        if not self.allow_cpu_fallback:
            raise GpuUnavailable(f"{problem}. To fix it, {INSTALL_HINT}. To run this stage on the CPU anyway, set "
                                 f"{FALLBACK_ENV}=1 (or give the model instance_group KIND_CPU).")
        self.fell_back_because = missing
        _log.warning("%s; running it on the CPU (%s=1)", problem, FALLBACK_ENV)
        if self.on_fallback is not None:
            self.on_fallback(runtime, missing)


def placement_from_args(args: Mapping[str, str], environ: Mapping[str, str] = os.environ,
                        on_fallback: Callable[[str, str], None] | None = None) -> GpuPlacement | None:
    """The placement Triton's initialize args describe (KIND_GPU, or KIND_AUTO on a GPU node); None on a CPU
    instance."""
    if args.get("model_instance_kind") != "GPU":
        return None
    return GpuPlacement(args.get("model_name", "?"), int(args.get("model_instance_device_id", 0)),
                        environ.get(FALLBACK_ENV, "") == "1", on_fallback)


def cuda_driver_device_count(library: str = "libcuda.so.1") -> int | None:
    """How many GPUs the NVIDIA driver shows this process (CUDA_VISIBLE_DEVICES applies), without torch or
    a CUDA toolkit: None when the driver library is absent or does not initialize."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return None
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    return count.value


def device_id_problem(device_id: int, visible: int | None, seen_by: str) -> str | None:
    """What is wrong with `device_id` when `visible` GPUs are seen (None: the driver was not found)."""
    if visible is None:
        return f"no NVIDIA driver could be loaded (libcuda.so.1): {seen_by} sees no GPU"
    if not 0 <= device_id < visible:
        return (f"GPU {device_id} is out of range: {seen_by} sees {visible} GPU(s) "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    return None
