"""Export a transformers encoder to ONNX (dynamic batch and sequence axes) and check it against torch.

`make model` calls this for every encoder the stages can run with ONNX Runtime; the largest absolute
difference to torch on a padded batch of mixed lengths is printed and must stay under `tolerance`."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

OPSET = 17


def _probe_batch(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three rows of different lengths, right-padded: checks the mask path as well as the values."""
    rng = np.random.default_rng(seed)
    lengths = [5, 17, 11]
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(100, min(vocab_size, 30000), n)
        mask[row, :n] = 1
    return ids, mask


def export_encoder(model_dir: Path, out_path: Path, tolerance: float = 1e-4) -> float:
    """model_dir (transformers AutoModel folder) -> out_path (ONNX: input_ids, attention_mask ->
    last_hidden_state). Returns the max abs difference to torch over the real (unpadded) tokens."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    def load():
        # eager attention traces to plain ops; sdpa's mask handling does not export cleanly
        return AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    reference_model = load()  # exporting may change a model's settings: compare against an untouched one
    ids, mask = _probe_batch(reference_model.config.vocab_size)
    with torch.inference_mode():
        reference = reference_model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHiddenState(load()), (torch.from_numpy(ids), torch.from_numpy(mask)), str(out_path),
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
                          opset_version=OPSET, dynamo=False)
    session = ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    out = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    real = mask.astype(bool)
    diff = float(np.abs(out[real] - reference[real]).max())
    if not diff <= tolerance:
        out_path.unlink(missing_ok=True)
        raise SystemExit(f"{out_path}: ONNX differs from torch by {diff:.2e} (> {tolerance:.0e})")
    return diff


def export_image_classifier(model_dir: Path, out_path: Path, tolerance: float = 1e-4) -> float:
    """model_dir (transformers image-classification folder) -> out_path (ONNX: pixel_values [batch, 3,
    height, width] -> logits [batch, classes]). Returns the max abs difference of the logits to torch on
    two probe sizes (the export's dynamic axes must hold for sizes other than the traced one)."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForImageClassification

    def load():
        return AutoModelForImageClassification.from_pretrained(str(model_dir)).eval()

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).logits

    reference_model = load()
    size = reference_model.config.image_size if hasattr(reference_model.config, "image_size") else 224
    rng = np.random.default_rng(0)
    probes = [rng.standard_normal((3, 3, size, size)).astype(np.float32),
              rng.standard_normal((2, 3, size + 32, size - 32)).astype(np.float32)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(load()), (torch.from_numpy(probes[0]),), str(out_path),
                          input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}},
                          opset_version=OPSET, dynamo=False)
    session = ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    diff = 0.0
    for pixels in probes:
        with torch.inference_mode():
            reference = reference_model(pixel_values=torch.from_numpy(pixels)).logits.numpy()
        diff = max(diff, float(np.abs(session.run(None, {"pixel_values": pixels})[0] - reference).max()))
    if not diff <= tolerance:
        out_path.unlink(missing_ok=True)
        raise SystemExit(f"{out_path}: ONNX differs from torch by {diff:.2e} (> {tolerance:.0e})")
    return diff
