"""A transformer encoder run once over the rows of many requests, padded together.

Two runtimes compute the same last hidden state: ONNX Runtime over `model.onnx` (exported and checked
against torch by `make model`; no torch import in the stub, ~230 MiB less per instance) and torch over
the transformers folder. `make_encoder` picks one from the model's `runtime` parameter."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from stage_common.gpu_placement import GpuPlacement
from stage_common.onnx_runtime import onnx_session
from stage_common.padding import pad_together

ONNX_FILE = "model.onnx"


Forward = Callable[[np.ndarray, np.ndarray], np.ndarray]


class TransformerEncoder:
    """`forward(input_ids, attention_mask) -> [rows, len, hidden] float32` run over sorted row chunks.

    `small_forward`, when given, serves executions of at most `small_rows` rows: a lone request gets
    more threads (latency) while full batches keep one thread per instance (throughput)."""

    def __init__(self, forward: Forward, hidden_size: int, rows_per_forward: int = 8,
                 small_forward: Forward | None = None, small_rows: int = 0):
        self.forward, self.hidden_size, self.rows_per_forward = forward, hidden_size, rows_per_forward
        self.small_forward, self.small_rows = small_forward, small_rows

    def forward_for(self, rows: int) -> Forward:
        return self.small_forward if self.small_forward is not None and rows <= self.small_rows else self.forward

    def last_hidden_state(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.forward(input_ids, attention_mask)

    def encode_per_request(self, requests: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """[rows_i, len_i, hidden] token embeddings per request (zeros at padding). The rows of all
        requests are sorted by length and run `rows_per_forward` at a time, so a row is padded only to
        rows of about its own length: on CPU, padding waste costs more than small forwards do. A row's
        result does not depend on the rows it shares a forward with (padding is masked)."""
        rows = [row for ids, mask in requests for row in _unpad_rows(ids, mask)]
        forward = self.forward_for(len(rows))
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        hidden: list[np.ndarray] = [np.empty(0)] * len(rows)
        for start in range(0, len(order), self.rows_per_forward):
            chunk = order[start:start + self.rows_per_forward]
            ids = pad_together([rows[i][None] for i in chunk])
            mask = (np.arange(ids.shape[1])[None] < np.array([len(rows[i]) for i in chunk])[:, None])
            out = forward(ids, mask.astype(np.int64))
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


def torch_forward(model_dir: Path, device, threads: int | None = None):
    """(forward, hidden_size) of the transformers model in `model_dir` run by torch on `device`."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir)).to(device).eval()

    @torch.inference_mode()
    def forward(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = model(input_ids=torch.from_numpy(input_ids).to(device),
                    attention_mask=torch.from_numpy(attention_mask).to(device))
        return out.last_hidden_state.float().cpu().numpy()

    return forward, model.config.hidden_size


def onnx_forward(model_dir: Path, threads: int, gpu: GpuPlacement | None = None):
    """(forward, hidden_size) of `model_dir/model.onnx` (inputs input_ids, attention_mask)."""
    session = onnx_session(Path(model_dir) / ONNX_FILE, threads, gpu)
    hidden_size = session.get_outputs()[0].shape[-1]
    if not isinstance(hidden_size, int):
        import json

        hidden_size = json.loads((Path(model_dir) / "config.json").read_text())["hidden_size"]

    def forward(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return session.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]

    return forward, hidden_size


def token_bounds(model_dir: Path) -> tuple[int | None, int | None]:
    """(vocabulary size, position embeddings) from the transformers config.json (None where absent): an id
    at or over the first, or a row longer than the second, makes a forward raise for every row in it."""
    import json

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config.get("vocab_size"), config.get("max_position_embeddings")


def make_encoder(model_dir: Path, runtime: str, threads: int, rows_per_forward: int = 8,
                 gpu: GpuPlacement | None = None, small_batch_threads: int = 0,
                 small_batch_rows: int = 0) -> TransformerEncoder:
    """runtime "onnx" (model.onnx, ONNX Runtime) or "torch" (the transformers folder); `gpu` set when
    Triton placed the instance on a GPU. With ONNX on CPU, `small_batch_threads` > `threads` adds a
    second session (the same weights, ~1x the model's size more memory) for executions of at most
    `small_batch_rows` rows."""
    if runtime == "onnx":
        forward, hidden = onnx_forward(model_dir, threads, gpu)
        on_cpu = gpu is None or gpu.device is None  # a CPU instance, or one that fell back
        if on_cpu and small_batch_threads > threads and small_batch_rows > 0:
            small, _ = onnx_forward(model_dir, small_batch_threads)
            return TransformerEncoder(forward, hidden, rows_per_forward, small, small_batch_rows)
    elif runtime == "torch":
        from stage_common.torch_runtime import torch_device

        forward, hidden = torch_forward(model_dir, torch_device(threads, gpu))
    else:
        raise ValueError(f"runtime must be 'onnx' or 'torch', not {runtime!r}")
    return TransformerEncoder(forward, hidden, rows_per_forward)


def _unpad_rows(values: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """Each row cut to its real tokens (right padding removed)."""
    return [values[r, : int(mask[r].sum())] for r in range(values.shape[0])]
