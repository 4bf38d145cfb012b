"""No silent CPU fallback: a stage Triton placed on a GPU that its runtime cannot use refuses to load, naming the
stage, the GPU, what is missing and how to install it; ALLOW_CPU_FALLBACK=1 makes that one warning per stage and
a gauge. The instance kind, the CUDA provider and the GPUs are faked: this machine has none of them."""
from __future__ import annotations

import logging

import numpy as np
import onnxruntime
import pytest
import torch

import fake_pb_utils as pb
from model_configs import MODEL_REPOSITORY, _initialize, load_python_model, parse_config
from stage_common import gpu_placement, onnx_runtime, torch_runtime, triton_io
from stage_common.gpu_placement import GpuPlacement, GpuUnavailable, placement_from_args

ENCODER = "text_embedding_encoder"


class RecordedFamily(pb.MetricFamily):
    """pb_utils.MetricFamily that keeps every metric it makes, with its labels."""

    made: list = []

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels=None):
        metric = pb._Metric()
        RecordedFamily.made.append((self.name, self.kind, dict(labels or {}), metric))
        return metric


@pytest.fixture
def metrics(monkeypatch):
    RecordedFamily.made = []
    monkeypatch.setattr(pb, "MetricFamily", RecordedFamily)
    monkeypatch.setattr(triton_io, "_fallback_metrics", [])
    return RecordedFamily.made


@pytest.fixture
def fallback(monkeypatch):
    monkeypatch.setenv("ALLOW_CPU_FALLBACK", "1")


def _fake_cuda_onnxruntime(monkeypatch, visible: int = 1):
    """An onnxruntime that lists the CUDA provider (the CPU build cannot start it) and a driver with `visible` GPUs."""
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(onnx_runtime, "cuda_driver_device_count", lambda: visible)


def _encode_one(model) -> np.ndarray:
    request = pb.InferenceRequest({"input_ids": np.array([[101, 7592, 102]], np.int64),
                                   "attention_mask": np.ones((1, 3), np.int64)})
    (response,) = model.execute([request])
    assert not response.has_error(), response.error().message()
    return response.output("token_embeddings")


def test_refusal_names_stage_gpu_runtime_missing_and_install():
    placement = GpuPlacement("ner_tagger", 1)
    with pytest.raises(GpuUnavailable) as refused:
        placement.usable("torch", lambda device: f"no GPU {device} here")
    message = str(refused.value)
    for part in ("ner_tagger", "GPU 1", "torch cannot use it", "no GPU 1 here", "make setup GPU=1",
                 "requirements-gpu.txt", "ALLOW_CPU_FALLBACK=1"):
        assert part in message, (part, message)


def test_fallback_warns_and_records_once_per_stage_and_later_sessions_follow(caplog):
    recorded = []
    placement = GpuPlacement("food_captioning_captioner", 0, allow_cpu_fallback=True,
                             on_fallback=lambda runtime, missing: recorded.append((runtime, missing)))
    probes = []
    with caplog.at_level(logging.WARNING, logger="stage"):
        assert placement.usable("onnxruntime", lambda d: probes.append(d) or "no CUDA provider") is None
        assert placement.usable("onnxruntime", lambda d: probes.append(d) or None) is None  # decoder session
        placement.unusable("onnxruntime", "did not start")
    assert probes == [0], "after a fallback the instance stays on the CPU without probing again"
    assert recorded == [("onnxruntime", "no CUDA provider")]
    assert placement.device is None and placement.fell_back_because == "no CUDA provider"
    lines = [r.getMessage() for r in caplog.records if r.name == "stage"]
    assert len(lines) == 1 and "food_captioning_captioner" in lines[0] and "GPU 0" in lines[0] \
        and "ALLOW_CPU_FALLBACK=1" in lines[0], lines


def test_a_usable_gpu_is_returned_and_a_cpu_instance_has_no_placement():
    assert GpuPlacement("m", 2).usable("torch", lambda device: None) == 2
    assert placement_from_args({"model_instance_kind": "CPU", "model_instance_device_id": "0"}) is None
    gpu = placement_from_args({"model_name": "m", "model_instance_kind": "GPU", "model_instance_device_id": "3"},
                              environ={"ALLOW_CPU_FALLBACK": "1"})
    assert (gpu.stage, gpu.device_id, gpu.allow_cpu_fallback) == ("m", 3, True)
    assert not placement_from_args({"model_instance_kind": "GPU"}, environ={"ALLOW_CPU_FALLBACK": "yes"}) \
        .allow_cpu_fallback, "only 1 allows it"


def test_device_id_problems_and_a_missing_driver():
    assert gpu_placement.cuda_driver_device_count("libcuda-that-is-not-here.so.1") is None
    assert "no NVIDIA driver" in gpu_placement.device_id_problem(0, None, "the driver")
    assert "GPU 2 is out of range: the driver sees 1 GPU(s)" in gpu_placement.device_id_problem(2, 1, "the driver")
    assert gpu_placement.device_id_problem(0, 1, "the driver") is None


def test_onnx_stage_on_a_gpu_without_the_cuda_provider_refuses_to_load():
    assert "CUDAExecutionProvider" not in onnxruntime.get_available_providers(), "this test needs the CPU build"
    with pytest.raises(GpuUnavailable) as refused:
        load_python_model(ENCODER, instance_kind="GPU")
    message = str(refused.value)
    for part in (ENCODER, "GPU 0", "onnxruntime cannot use it", "has no CUDAExecutionProvider", "onnxruntime-gpu",
                 "make setup GPU=1"):
        assert part in message, (part, message)


def test_onnx_fallback_runs_on_cpu_with_one_warning_and_the_gauge(fallback, metrics, caplog):
    with caplog.at_level(logging.WARNING, logger="stage"):
        model = load_python_model(ENCODER, instance_kind="GPU")
    assert _encode_one(model).shape == (1, 3, 384)
    warnings = [r.getMessage() for r in caplog.records if r.name == "stage" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and ENCODER in warnings[0] and "running it on the CPU" in warnings[0], warnings
    assert [(name, kind, labels["model"], labels["gpu"], labels["runtime"], metric.value)
            for name, kind, labels, metric in metrics] == \
        [("stage_gpu_fallback", pb.MetricFamily.GAUGE, ENCODER, "0", "onnxruntime", 1)]


def test_onnx_cuda_provider_that_does_not_start_is_not_silent(monkeypatch):
    _fake_cuda_onnxruntime(monkeypatch)
    with pytest.raises(GpuUnavailable, match="CUDAExecutionProvider is installed but did not start on GPU 0"):
        load_python_model(ENCODER, instance_kind="GPU")


def test_onnx_device_id_out_of_range_is_named(monkeypatch):
    _fake_cuda_onnxruntime(monkeypatch, visible=0)
    with pytest.raises(GpuUnavailable, match=r"GPU 0 is out of range: the driver sees 0 GPU\(s\)"):
        load_python_model(ENCODER, instance_kind="GPU")


def test_torch_stage_on_a_gpu_without_cuda_refuses_to_load_and_falls_back_when_allowed(monkeypatch, metrics):
    assert torch.version.cuda is None, "this test needs the CPU build of torch"
    with pytest.raises(GpuUnavailable, match=r"ner_tagger: .*GPU 0, but torch cannot use it: torch \S+ is a "
                                             r"CPU-only build\. To fix it, install the GPU build with `make setup"):
        _initialize(parse_config("ner_tagger"), MODEL_REPOSITORY, "ner_tagger", "GPU", {"runtime": "torch"})
    monkeypatch.setenv("ALLOW_CPU_FALLBACK", "1")
    model = _initialize(parse_config("ner_tagger"), MODEL_REPOSITORY, "ner_tagger", "GPU", {"runtime": "torch"})
    assert model.runner.device == torch.device("cpu")
    assert [(labels["model"], labels["runtime"]) for _, _, labels, _ in metrics] == [("ner_tagger", "torch")]


def test_torch_cuda_problems(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch_runtime, "cuda_driver_device_count", lambda: None)
    assert "no NVIDIA driver could be loaded" in torch_runtime.torch_cuda_problem(0)
    monkeypatch.setattr(torch_runtime, "cuda_driver_device_count", lambda: 2)
    assert "cannot initialize CUDA although the driver shows 2 GPU(s)" in torch_runtime.torch_cuda_problem(0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert torch_runtime.torch_cuda_problem(0) is None
    assert "GPU 1 is out of range" in torch_runtime.torch_cuda_problem(1)


def test_configure_torch_of_the_generator_checks_the_gpu_too():
    args = {"model_name": "codegen_generator", "model_instance_kind": "GPU", "model_instance_device_id": "0"}
    with pytest.raises(GpuUnavailable, match="codegen_generator: .*CPU-only build"):
        torch_runtime.configure_torch(args, {"name": "codegen_generator"})
    assert torch_runtime.configure_torch({"model_instance_kind": "CPU"}, {"name": "m"}) == torch.device("cpu")
