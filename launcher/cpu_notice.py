"""The one line `make triton` prints on a machine without a usable GPU: Triton's build asks for CUDA and
DCGM at start-up and logs E/W lines when they are missing, which read like a failed start to a newcomer.
Triton's log is left as it is; this line says which of its lines are expected (docs/operations.md lists
each and what it means)."""
from __future__ import annotations

import ctypes

# What Triton 2.51 logs on a CPU-only machine (verified here); docs/operations.md explains each.
EXPECTED_MESSAGES = (
    "Unable to allocate pinned system memory",
    "CudaDriverHelper has not been initialized",
    "unable to create stream for <ensemble>: CUDA driver version is insufficient",
    "Failed to initialize NVML",
    "DCGM unable to start",
)


def cuda_devices() -> tuple[int, str]:
    """(usable CUDA devices, why none when 0), asked of the CUDA driver itself: libcuda loads, cuInit
    succeeds and it counts devices (CUDA_VISIBLE_DEVICES applies), as Triton will find them."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no CUDA driver (libcuda.so.1 not found)"
    status = cuda.cuInit(0)
    if status != 0:
        return 0, f"cuInit failed with CUDA error {status}"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return 0, f"cuDeviceGetCount failed with CUDA error {status}"
    return count.value, "" if count.value else "the CUDA driver sees no device"


def cpu_notice(devices: int, reason: str) -> str | None:
    """The line to print before Triton starts, or None when a GPU is usable (then its CUDA lines matter)."""
    if devices > 0:
        return None
    expected = "; ".join(f"'{m}'" for m in EXPECTED_MESSAGES)
    return (f"triton: no usable GPU ({reason}): serving on CPU. Triton's CUDA/DCGM start-up messages are "
            f"expected here and harmless: {expected} (docs/operations.md, 'Start-up messages'); the lines "
            f"that matter are a model's 'failed to load' and the launcher's own ready line.")
