"""BLIP generation through transformers (torch): the reference the ONNX path reproduces."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import BlipForConditionalGeneration, BlipProcessor

from blip_captioner.greedy import until_eos


class TorchBlip:
    def __init__(self, model_dir: Path, device: torch.device, num_beams: int = 1):
        self.device, self.num_beams = device, num_beams
        self.model = BlipForConditionalGeneration.from_pretrained(str(model_dir)).to(device).eval()
        self.tokenizer = BlipProcessor.from_pretrained(str(model_dir), use_fast=False).tokenizer

    @property
    def image_shape(self) -> tuple[int, int, int]:
        size = self.model.config.vision_config.image_size
        return 3, size, size

    @torch.inference_mode()
    def generate(self, pixel_values: np.ndarray, prompt_ids: np.ndarray, max_new_tokens: int) -> list[list[int]]:
        """pixel_values [n, 3, H, W], prompt_ids [n, length] ([CLS] ... [SEP], one length) -> ids per row."""
        # a fresh tensor: generate overwrites input_ids[:, 0] with [DEC] in place
        input_ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        sequences = self.model.generate(pixel_values=torch.from_numpy(pixel_values).to(self.device),
                                        input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                        max_new_tokens=max_new_tokens, num_beams=self.num_beams, do_sample=False)
        # generate drops the prompt's trailing [SEP]; its end token is [SEP]
        eos = self.model.config.text_config.sep_token_id
        return [until_eos(row, prompt_ids.shape[1] - 1, eos) for row in sequences.tolist()]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text).input_ids

    def decode(self, sequences: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=True)
