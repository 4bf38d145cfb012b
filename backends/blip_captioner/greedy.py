"""Greedy decoding as BlipForConditionalGeneration.generate does it (num_beams 1, no sampling; BLIP's
generation config adds no logits processor: `make model` refuses a model that would), in numpy."""
from __future__ import annotations

from typing import Callable

import numpy as np

# (new input_ids [n, new], past keys/values) -> (logits of the last position [n, vocab], present keys/values)
Step = Callable[[np.ndarray, list[np.ndarray]], tuple[np.ndarray, list[np.ndarray]]]


def decoder_prompt(prompt_ids: np.ndarray, bos: int) -> np.ndarray:
    """The tokenizer's [CLS] ... [SEP] rows as generate feeds them: [DEC] first, the trailing [SEP] dropped."""
    ids = np.array(prompt_ids, dtype=np.int64)[:, :-1]
    ids[:, 0] = bos
    return ids


def greedy_generate(prompt: np.ndarray, step: Step, past: list[np.ndarray], eos: int, pad: int,
                    max_new_tokens: int) -> list[list[int]]:
    """prompt [n, length] (as `decoder_prompt` makes it), past: the empty cache -> each row's ids, prompt
    included, up to and including its eos: what a lone generate returns for it. After its eos a row
    gets `pad` tokens until every row has ended, as in a batched generate, so the rows still running
    see the batch that generate would run."""
    sequences, new = prompt, prompt
    running = np.ones(len(prompt), dtype=bool)
    for _ in range(max_new_tokens):
        logits, past = step(new, past)
        tokens = np.where(running, logits.argmax(axis=-1), pad)
        sequences = np.concatenate([sequences, tokens[:, None]], axis=1)
        running &= tokens != eos
        if not running.any():
            break
        new = tokens[:, None]
    return [until_eos(row, prompt.shape[1], eos) for row in sequences.tolist()]


def until_eos(row: list[int], prompt_length: int, eos: int) -> list[int]:
    """A batched row as a lone generate returns it: without the padding after its eos."""
    new = row[prompt_length:]
    return row[:prompt_length + new.index(eos) + 1] if eos in new else row
