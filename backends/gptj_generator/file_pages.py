"""Dropping a memory-mapped file's resident pages (Linux): the OpenVINO engine's second copy of the weights.

The CPU plugin maps openvino_model.bin and repacks the weights into memory of its own while it compiles and runs
the first inference; after that it hardly reads the mapping again, yet its pages stay resident and count in the
process's RSS (the 350M-shape fp32 engine, loaded: 2719 MB with them, 1684 MB without; docs/performance.md,
"Codegen engines").
MADV_DONTNEED on a read-only file mapping frees those clean pages; any later read faults them back in from the
file, so nothing can break, it only costs a re-read.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import psutil

MADV_DONTNEED = 4


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """(start, end) of every mapping of `path` in this process."""
    target = os.path.realpath(path)
    ranges = []
    for mapping in psutil.Process().memory_maps(grouped=False):
        if mapping.path == target:
            start, end = (int(x, 16) for x in mapping.addr.split("-"))
            ranges.append((start, end))
    return ranges


def drop_file_pages(path: Path) -> int:
    """Release the resident pages of every mapping of `path`; returns the bytes of address space advised."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    for start, end in mapped_ranges(path):
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            advised += end - start
    return advised
