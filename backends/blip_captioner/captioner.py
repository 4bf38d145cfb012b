"""BLIP conditional captioning: the prompt is built from each image's label; images whose prompts have
the same number of tokens are generated together, unpadded. Padding prompts of different lengths into
one generate call would change the outputs (BLIP's text decoder uses absolute positions and its
generate strips the trailing [SEP]).

Two runtimes give the same token ids: ONNX Runtime (onnx_blip.py over the graphs `make model` exports
and checks; tokenizer.json through `tokenizers`; no torch or transformers in the stub) and torch
(torch_blip.py, transformers' generate). `make_captioner` picks one from the model's `runtime` parameter."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from blip_captioner.onnx_blip import ONNX_FILES
from blip_captioner.text import TOKENIZER_FILE
from stage_common.gpu_placement import GpuPlacement


class Generator(Protocol):
    image_shape: tuple[int, int, int]

    def generate(self, pixel_values: np.ndarray, prompt_ids: np.ndarray, max_new_tokens: int) -> list[list[int]]: ...


class Text(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, sequences: list[list[int]]) -> list[str]: ...


class BlipCaptioner:
    def __init__(self, generator: Generator, text: Text, prompt_template: str = "a photo of {label}",
                 max_new_tokens: int = 20):
        prompt_template.format(label="")  # a malformed template fails at load, not per request
        self.generator, self.text = generator, text
        self.template, self.max_new_tokens = prompt_template, max_new_tokens
        self._prompts: dict[str, list[int]] = {}

    def prompt(self, label: str) -> str:
        return self.template.format(label=label).lower()

    def _prompt_ids(self, label: str) -> list[int]:
        """Tokenized once per label (the classifier has a handful), as BlipProcessor tokenizes text."""
        if label not in self._prompts:
            self._prompts[label] = self.text.encode(self.prompt(label))
        return self._prompts[label]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.generator.image_shape

    def generate_ids(self, images: list[np.ndarray], labels: list[str]) -> list[list[int]]:
        """images: [3, H, W] pixel_values each, one label each -> generated token ids (prompt included)."""
        out: list[list[int]] = [[] for _ in labels]
        prompts = [self._prompt_ids(label) for label in labels]
        groups: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(len(prompt), []).append(i)
        for rows in groups.values():
            sequences = self.generator.generate(np.stack([images[i] for i in rows]),
                                                np.array([prompts[i] for i in rows], dtype=np.int64),
                                                self.max_new_tokens)
            for row, sequence in zip(rows, sequences):
                out[row] = sequence
        return out

    def caption(self, images: list[np.ndarray], labels: list[str]) -> list[str]:
        return self.text.decode(self.generate_ids(images, labels))

    def caption_per_request(self, requests: list[tuple[np.ndarray, list[str]]]) -> list[list[str]]:
        """All requests' images share generate calls; captions come back per request."""
        captions = self.caption([image for pixels, _ in requests for image in pixels],
                                [label for _, labels in requests for label in labels])
        out, row = [], 0
        for _, labels in requests:
            out.append(captions[row:row + len(labels)])
            row += len(labels)
        return out


def has_onnx(model_dir: Path) -> bool:
    """Whether `make model` exported this BLIP for the ONNX runtime."""
    return all((Path(model_dir) / name).is_file() for name in (*ONNX_FILES, TOKENIZER_FILE))


def make_captioner(model_dir: Path, runtime: str, threads: int, gpu: GpuPlacement | None = None,
                   prompt_template: str = "a photo of {label}", max_new_tokens: int = 20,
                   num_beams: int = 1) -> BlipCaptioner:
    """runtime "onnx" (greedy only: num_beams > 1 is refused here, at load) or "torch"; `gpu` set when
    Triton placed the instance on a GPU."""
    if runtime == "onnx":
        if num_beams != 1:
            raise ValueError(f"num_beams {num_beams}: runtime 'onnx' decodes greedily (num_beams 1); "
                             "beam search needs runtime 'torch'")
        from blip_captioner.onnx_blip import OnnxBlip
        from blip_captioner.text import BlipText

        generator, text = OnnxBlip(model_dir, threads, gpu), BlipText(model_dir)
    elif runtime == "torch":
        from blip_captioner.torch_blip import TorchBlip
        from stage_common.torch_runtime import torch_device

        generator = text = TorchBlip(model_dir, torch_device(threads, gpu), num_beams)
    else:
        raise ValueError(f"runtime must be 'onnx' or 'torch', not {runtime!r}")
    return BlipCaptioner(generator, text, prompt_template, max_new_tokens)
