"""Which runtime computes the emissions: `runtime` onnx (the graphs `make model` wrote and checked; no torch
import in the stub) or torch (the same weights through the plain-torch tagger)."""
from __future__ import annotations

from pathlib import Path

from ner_tagger.onnx_tagger import HEAD_FILE, OnnxNerTagger
from ner_tagger.rows import TaggerRows

RUNTIMES = ("onnx", "torch")


def default_runtime(model_dir: Path) -> str:
    return "onnx" if (Path(model_dir) / HEAD_FILE).is_file() else "torch"


def make_tagger(model_dir: Path, runtime: str, threads: int, gpu_device: int | None = None) -> TaggerRows:
    if runtime == "onnx":
        return OnnxNerTagger(model_dir, threads, gpu_device)
    if runtime == "torch":
        from ner_tagger.tagger import NerTaggerRunner
        from stage_common.torch_runtime import torch_device

        return NerTaggerRunner(model_dir, torch_device(threads, gpu_device))
    raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
