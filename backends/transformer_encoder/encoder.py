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
    def __init__(self, model_dir: Path, device: torch.device, rows_per_forward: int = 8):
        self.device, self.rows_per_forward = device, rows_per_forward
        self.model = AutoModel.from_pretrained(str(model_dir)).to(device).eval()
        self.hidden_size = self.model.config.hidden_size

    @torch.inference_mode()
    def last_hidden_state(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = self.model(input_ids=torch.from_numpy(input_ids).to(self.device),
                         attention_mask=torch.from_numpy(attention_mask).to(self.device))
        return out.last_hidden_state.float().cpu().numpy()

    def encode_per_request(self, requests: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """[rows_i, len_i, hidden] token embeddings per request (zeros at padding). The rows of all
        requests are sorted by length and run `rows_per_forward` at a time, so a row is padded only to
        rows of about its own length: on CPU, padding waste costs more than small forwards do. A row's
        result does not depend on the rows it shares a forward with (padding is masked)."""
        rows = [row for ids, mask in requests for row in _unpad_rows(ids, mask)]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        hidden: list[np.ndarray] = [np.empty(0)] * len(rows)
        for start in range(0, len(order), self.rows_per_forward):
            chunk = order[start:start + self.rows_per_forward]
            ids = pad_together([rows[i][None] for i in chunk])
            mask = (np.arange(ids.shape[1])[None] < np.array([len(rows[i]) for i in chunk])[:, None])
            out = self.last_hidden_state(ids, mask.astype(np.int64))
            for k, i in enumerate(chunk):
                hidden[i] = out[k, : len(rows[i])]
        results, row = [], 0
        for ids, _ in requests:
            block = np.zeros((*ids.shape, self.hidden_size), dtype=np.float32)
            for r in range(ids.shape[0]):
                block[r, : len(hidden[row])] = hidden[row]
                row += 1
            results.append(block)
        return results


def _unpad_rows(values: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """Each row cut to its real tokens (right padding removed)."""
    return [values[r, : int(mask[r].sum())] for r in range(values.shape[0])]
