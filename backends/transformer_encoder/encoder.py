"""A transformers encoder run once over the rows of many requests, padded together."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel


def pad_together(arrays: list[np.ndarray], pad_value: int = 0) -> np.ndarray:
    """Stack [rows_i, len_i] int arrays into [sum(rows_i), max(len_i)], right-padded."""
    longest = max(a.shape[1] for a in arrays)
    out = np.full((sum(a.shape[0] for a in arrays), longest), pad_value, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[row:row + a.shape[0], : a.shape[1]] = a
        row += a.shape[0]
    return out


class TransformerEncoder:
    def __init__(self, model_dir: Path, device: torch.device):
        self.device = device
        self.model = AutoModel.from_pretrained(str(model_dir)).to(device).eval()

    @torch.inference_mode()
    def last_hidden_state(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = self.model(input_ids=torch.from_numpy(input_ids).to(self.device),
                         attention_mask=torch.from_numpy(attention_mask).to(self.device))
        return out.last_hidden_state.float().cpu().numpy()

    def encode_per_request(self, requests: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """[rows_i, len_i, hidden] token embeddings per request from one padded forward pass."""
        hidden = self.last_hidden_state(pad_together([ids for ids, _ in requests]),
                                        pad_together([mask for _, mask in requests]))
        out, row = [], 0
        for ids, _ in requests:
            out.append(np.ascontiguousarray(hidden[row:row + ids.shape[0], : ids.shape[1]]))
            row += ids.shape[0]
        return out
