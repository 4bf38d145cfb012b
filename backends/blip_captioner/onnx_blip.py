"""BLIP generation over ONNX Runtime: vision.onnx once per image (the cross-attention keys/values),
then decoder.onnx per token with a key/value cache (exported and checked against torch by `make model`,
gateway/modelgen/onnx_export.py). Imports neither torch nor transformers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from blip_captioner.greedy import decoder_prompt, greedy_generate
from stage_common.gpu_placement import GpuPlacement
from stage_common.onnx_runtime import onnx_session

ONNX_FILES = ("vision.onnx", "decoder.onnx", "blip_generation.json")


class OnnxBlip:
    def __init__(self, model_dir: Path, threads: int, gpu: GpuPlacement | None = None):
        self.vision = onnx_session(Path(model_dir) / "vision.onnx", threads, gpu)
        self.decoder = onnx_session(Path(model_dir) / "decoder.onnx", threads, gpu)
        # the token ids generate uses and the image size, written by the export
        self.generation = json.loads((Path(model_dir) / "blip_generation.json").read_text())
        self.cross_names = [o.name for o in self.vision.get_outputs()]
        self.past_inputs = [i for i in self.decoder.get_inputs() if i.name.startswith("past_")]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return 3, self.generation["image_size"], self.generation["image_size"]

    def _empty_past(self, batch: int) -> list[np.ndarray]:
        """The prompt step's cache: [batch, heads, 0, head_dim] per layer (heads, head_dim from the graph)."""
        return [np.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=np.float32) for i in self.past_inputs]

    def generate(self, pixel_values: np.ndarray, prompt_ids: np.ndarray, max_new_tokens: int) -> list[list[int]]:
        """pixel_values [n, 3, H, W], prompt_ids [n, length] ([CLS] ... [SEP], one length) -> ids per row."""
        cross = self.vision.run(self.cross_names, {"pixel_values": np.ascontiguousarray(pixel_values, np.float32)})
        fixed = dict(zip(self.cross_names, cross))
        past_names = [i.name for i in self.past_inputs]

        def step(new: np.ndarray, past: list[np.ndarray]):
            logits, *present = self.decoder.run(None, {"input_ids": new, **dict(zip(past_names, past)), **fixed})
            return logits, present

        tokens = self.generation
        return greedy_generate(decoder_prompt(prompt_ids, tokens["bos_token_id"]), step,
                               self._empty_past(len(pixel_values)), tokens["eos_token_id"], tokens["pad_token_id"],
                               max_new_tokens)
