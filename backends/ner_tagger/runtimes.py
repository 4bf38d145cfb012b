"""Which runtime computes the emissions: `runtime` onnx (the graphs `make model` wrote and checked; no torch
import in the stub) or torch (the same weights through the plain-torch tagger)."""
from __future__ import annotations

from pathlib import Path

from ner_tagger.onnx_tagger import HEAD_FILE, OnnxNerTagger
from ner_tagger.rows import TaggerRows
from stage_common.gpu_placement import GpuPlacement

RUNTIMES = ("onnx", "torch")


def has_onnx(model_dir: Path) -> bool:
    """Whether `make model` wrote the ONNX graphs (the head is written last)."""
    return (Path(model_dir) / HEAD_FILE).is_file()


def make_tagger(model_dir: Path, runtime: str, threads: int, gpu: GpuPlacement | None = None) -> TaggerRows:
    if runtime == "onnx":
        return OnnxNerTagger(model_dir, threads, gpu)
    if runtime == "torch":
        from ner_tagger.tagger import NerTaggerRunner
        from stage_common.torch_runtime import torch_device

        return NerTaggerRunner(model_dir, torch_device(threads, gpu))
    raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
