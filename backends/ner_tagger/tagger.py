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

from ner_tagger.rows import DIRECTIONS, TaggerRows
from ner_tagger.segments import plan_segments

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


class NerTaggerRunner(TaggerRows):
    """The torch runtime: the weights `make model` extracted, on CPU or the GPU Triton placed the stage on."""

    runtime = "torch"

    def __init__(self, model_dir: Path, device: torch.device):
        self.device = device
        config = json.loads((Path(model_dir) / "tagger_config.json").read_text())
        self.model = NerTagger(config)
        self.model.load_state_dict(load_file(str(Path(model_dir) / "tagger.safetensors")))
        self.model.to(device).eval()
        self.num_tags = config["num_tags"]

    def _tensors(self, arrays):
        return [torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in arrays]

    @torch.inference_mode()
    def char_lm_embeddings(self, *arrays: np.ndarray) -> np.ndarray:
        """char_ids, char_count, token_positions -> [rows, tokens, dim], as OnnxNerTagger's."""
        return self.model.char_lm_embeddings(*self._tensors(arrays)).float().cpu().numpy()

    @torch.inference_mode()
    def _forward(self, *arrays: np.ndarray) -> np.ndarray:
        return self.model(*self._tensors(arrays)).float().cpu().numpy()
