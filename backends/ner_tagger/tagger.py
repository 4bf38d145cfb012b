"""flair's SequenceTagger forward for ner-english-fast, re-written in plain torch over the weights the
build extracted: both character LMs (read at each token's boundary), reprojection, BiLSTM, linear ->
emission scores. The CRF transitions are added by the decoder stage."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

DIRECTIONS = ("forward", "backward")  # the order of the preprocess stage's 2-sized axis


class CharLM(nn.Module):
    """flair's LanguageModel without the decoder head."""

    def __init__(self, vocab_size: int, embedding_size: int, hidden_size: int, nlayers: int, nout=None, **_):
        super().__init__()
        self.encoder = nn.Embedding(vocab_size, embedding_size)
        self.rnn = nn.LSTM(embedding_size, hidden_size, nlayers)
        self.proj = nn.Linear(hidden_size, nout) if nout else None

    def read_at(self, char_ids: torch.Tensor, lengths: list[int], positions: torch.Tensor) -> torch.Tensor:
        """char_ids [rows, chars] (row i valid up to lengths[i]), positions [rows, tokens] -> the LM's output at
        each position [rows, tokens, hidden].

        flair pads every text of a batch to the longest and runs all of them to the end. Here rows are
        sorted longest first and run in time segments, each over only the rows not yet finished, the LSTM
        state carried from one segment to the next. This is exact, not an approximation: the unpacked
        LSTM kernel flair uses gives a row the same numbers to the last bit whatever its batch-mates and
        wherever the sequence is cut (tests compare with flair), and padding only ever follows a text."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        index = torch.tensor(order, device=char_ids.device)
        ids, pos = char_ids[index].t(), positions[index]
        out = None
        state, start = None, 0
        for end, active in plan_segments([lengths[i] for i in order]):
            if state is not None:
                state = tuple(s[:, :active].contiguous() for s in state)
            segment, state = self.rnn(self.encoder(ids[start:end, :active]), state)
            if self.proj is not None:
                segment = self.proj(segment)
            if out is None:
                out = segment.new_zeros((len(order), pos.shape[1], segment.shape[2]))
            p = pos[:active]
            rows, tokens = ((p >= start) & (p < end)).nonzero(as_tuple=True)
            out[rows, tokens] = segment[p[rows, tokens] - start, rows]
            start = end
        unsorted = torch.empty_like(out)
        unsorted[index] = out
        return unsorted


# The cost of one LSTM step over a batch, in units of one row's share (measured on CPU, hidden 1024: 1.4 ms
# per step at batch 1, +0.18 ms per row), and of starting one more segment (one more LSTM call).
STEP_COST_IN_ROWS = 8
SEGMENT_COST_IN_ROW_STEPS = 20


def plan_segments(lengths_desc: list[int]) -> list[tuple[int, int]]:
    """Cheapest cut of time into segments for rows sorted longest first: [(end, active rows), ...], each
    segment running from the previous end to its own over the first `active` rows (those longer than its
    start). Cost of a segment = its steps * (STEP_COST + active) + SEGMENT_COST."""
    points = [0] + sorted(set(lengths_desc))
    active = [sum(1 for n in lengths_desc if n > p) for p in points]
    best, cut = [0.0] + [float("inf")] * (len(points) - 1), [0] * len(points)
    for j in range(1, len(points)):
        for i in range(j):
            cost = best[i] + (points[j] - points[i]) * (STEP_COST_IN_ROWS + active[i]) + SEGMENT_COST_IN_ROW_STEPS
            if cost < best[j]:
                best[j], cut[j] = cost, i
    segments, j = [], len(points) - 1
    while j > 0:
        segments.append((points[j], active[cut[j]]))
        j = cut[j]
    return segments[::-1]


class NerTagger(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.lm_order = [lm["direction"] for lm in config["char_lms"]]  # flair's concatenation order
        for lm in config["char_lms"]:  # attributes char_lm_forward / char_lm_backward, as the weights are named
            self.add_module(f"char_lm_{lm['direction']}", CharLM(**lm))
        embedding_dim = sum(lm["nout"] or lm["hidden_size"] for lm in config["char_lms"])
        self.embedding2nn = nn.Linear(embedding_dim, embedding_dim) if config["reproject_embeddings"] else None
        self.rnn = nn.LSTM(embedding_dim, config["hidden_size"], num_layers=config["rnn_layers"],
                           bidirectional=config["bidirectional"], batch_first=True)
        self.linear = nn.Linear(config["hidden_size"] * (2 if config["bidirectional"] else 1), config["num_tags"])

    def char_lm_embeddings(self, char_ids: torch.Tensor, char_count: torch.Tensor,
                           token_positions: torch.Tensor) -> torch.Tensor:
        """Each token's char-LM embeddings [rows, tokens, dim], in flair's concatenation order."""
        parts = {direction: getattr(self, f"char_lm_{direction}").read_at(
                     char_ids[:, d], char_count[:, d].tolist(), token_positions[:, d])
                 for d, direction in enumerate(DIRECTIONS)}
        return torch.cat([parts[d] for d in self.lm_order], dim=2)

    def forward(self, char_ids: torch.Tensor, char_count: torch.Tensor, token_positions: torch.Tensor,
                token_count: torch.Tensor) -> torch.Tensor:
        """char_ids [rows, 2, chars], char_count [rows, 2], token_positions [rows, 2, tokens], token_count [rows]
        (rows with at least one token) -> emissions [rows, tokens, tags]."""
        tokens = token_positions.shape[2]
        mask = (torch.arange(tokens, device=token_count.device).unsqueeze(0) < token_count.unsqueeze(1)).unsqueeze(2)
        embeddings = self.char_lm_embeddings(char_ids, char_count, token_positions) * mask  # flair zero-pads
        if self.embedding2nn is not None:
            embeddings = self.embedding2nn(embeddings)
        packed = pack_padded_sequence(embeddings, token_count.cpu(), batch_first=True, enforce_sorted=False)
        output, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=tokens)
        return self.linear(output)


class NerTaggerRunner:
    def __init__(self, model_dir: Path, device: torch.device):
        self.device = device
        config = json.loads((Path(model_dir) / "tagger_config.json").read_text())
        self.model = NerTagger(config)
        self.model.load_state_dict(load_file(str(Path(model_dir) / "tagger.safetensors")))
        self.model.to(device).eval()
        self.num_tags = config["num_tags"]

    @torch.inference_mode()
    def emissions(self, char_ids: np.ndarray, char_count: np.ndarray, token_positions: np.ndarray,
                  token_count: np.ndarray) -> np.ndarray:
        """All rows at once; rows without tokens (flair skips them) get zeros."""
        counts = token_count.reshape(-1)
        out = np.zeros((len(counts), token_positions.shape[2], self.num_tags), dtype=np.float32)
        keep = np.flatnonzero(counts > 0)
        if len(keep):
            tensors = [torch.from_numpy(np.ascontiguousarray(a[keep])).to(self.device)
                       for a in (char_ids, char_count, token_positions, counts)]
            out[keep] = self.model(*tensors).float().cpu().numpy()
        return out

    def emissions_per_request(self, requests: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """One forward pass over every row of every request, split back per request."""
        rows = [r["token_count"].shape[0] for r in requests]
        chars = max(r["char_ids"].shape[2] for r in requests)
        tokens = max(r["token_positions"].shape[2] for r in requests)
        char_ids = np.concatenate([_pad_last(r["char_ids"], chars) for r in requests])
        positions = np.concatenate([_pad_last(r["token_positions"], tokens) for r in requests])
        emissions = self.emissions(char_ids, np.concatenate([r["char_count"] for r in requests]), positions,
                                   np.concatenate([r["token_count"] for r in requests]))
        out, start = [], 0
        for r, n in zip(requests, rows):
            out.append(np.ascontiguousarray(emissions[start:start + n, : r["token_positions"].shape[2]]))
            start += n
        return out


def _pad_last(array: np.ndarray, size: int) -> np.ndarray:
    """Right-pad the last axis with zeros (beyond each row's char_count / token_count: never read)."""
    if array.shape[-1] == size:
        return array
    pad = [(0, 0)] * (array.ndim - 1) + [(0, size - array.shape[-1])]
    return np.pad(array, pad)
