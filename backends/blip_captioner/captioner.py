"""BLIP conditional captioning: the prompt is built from each image's label; images whose prompts have
the same number of tokens are generated together, unpadded. Padding prompts of different lengths into
one generate call would change the outputs (BLIP's text decoder uses absolute positions and its
generate strips the trailing [SEP])."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import BlipForConditionalGeneration, BlipProcessor


class BlipCaptioner:
    def __init__(self, model_dir: Path, device: torch.device, prompt_template: str = "a photo of {label}",
                 max_new_tokens: int = 20, num_beams: int = 1):
        prompt_template.format(label="")  # a malformed template fails at load, not per request
        self.device, self.template = device, prompt_template
        self.generate_kwargs = {"max_new_tokens": max_new_tokens, "num_beams": num_beams, "do_sample": False}
        self.tokenizer = BlipProcessor.from_pretrained(str(model_dir), use_fast=False).tokenizer
        self.model = BlipForConditionalGeneration.from_pretrained(str(model_dir)).to(device).eval()
        self._prompts: dict[str, dict[str, torch.Tensor]] = {}

    def prompt(self, label: str) -> str:
        return self.template.format(label=label).lower()

    def _prompt_ids(self, label: str) -> dict[str, torch.Tensor]:
        """Tokenized once per label (the classifier has a handful), as BlipProcessor tokenizes text."""
        if label not in self._prompts:
            encoded = self.tokenizer(self.prompt(label), return_tensors="pt")
            self._prompts[label] = {k: encoded[k] for k in ("input_ids", "attention_mask")}
        return self._prompts[label]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        size = self.model.config.vision_config.image_size
        return 3, size, size

    def _trim(self, sequence: list[int], prompt_length: int) -> list[int]:
        """A batched row as a lone generate returns it: without the padding after its [SEP]."""
        eos = self.model.config.text_config.sep_token_id
        new = sequence[prompt_length:]
        return sequence[:prompt_length + new.index(eos) + 1] if eos in new else sequence

    @torch.inference_mode()
    def generate_ids(self, images: list[np.ndarray], labels: list[str]) -> list[list[int]]:
        """images: [3, H, W] pixel_values each, one label each -> generated token ids (prompt included)."""
        out: list[list[int]] = [[] for _ in labels]
        prompts = [self._prompt_ids(label) for label in labels]
        groups: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(prompt["input_ids"].shape[1], []).append(i)
        for length, rows in groups.items():
            # torch.cat copies: generate overwrites input_ids[:, 0] with [DEC] in place.
            sequences = self.model.generate(
                pixel_values=torch.from_numpy(np.stack([images[i] for i in rows])).to(self.device),
                input_ids=torch.cat([prompts[i]["input_ids"] for i in rows]).to(self.device),
                attention_mask=torch.cat([prompts[i]["attention_mask"] for i in rows]).to(self.device),
                **self.generate_kwargs)
            for row, sequence in zip(rows, sequences.tolist()):
                out[row] = self._trim(sequence, length - 1)  # generate drops the prompt's trailing [SEP]
        return out

    def caption(self, images: list[np.ndarray], labels: list[str]) -> list[str]:
        return self.tokenizer.batch_decode(self.generate_ids(images, labels), skip_special_tokens=True)

    def caption_per_request(self, requests: list[tuple[np.ndarray, list[str]]]) -> list[list[str]]:
        """All requests' images share generate calls; captions come back per request."""
        captions = self.caption([image for pixels, _ in requests for image in pixels],
                                [label for _, labels in requests for label in labels])
        out, row = [], 0
        for _, labels in requests:
            out.append(captions[row:row + len(labels)])
            row += len(labels)
        return out
