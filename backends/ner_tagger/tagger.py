"""flair's SequenceTagger forward for ner-english-fast, re-written in plain torch over the weights the
build extracted: both character LMs (read at each token's boundary), reprojection, BiLSTM, linear ->
emission scores. The CRF transitions are added by the decoder stage."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from stage_common.errors import BadInput, check_limit

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

    def emissions_per_request(self, requests: list["SentenceRows"], chars_per_forward: int = 16000) -> list[np.ndarray]:
        """Every sentence of every request as a row of its own, longest first, in forwards of at most
        `chars_per_forward` characters (the LM outputs held at once grow with it: memory stays bounded
        whatever the batch), scattered back as each request's [rows, tokens, tags]."""
        out = [np.zeros((r.rows, r.tokens, self.num_tags), dtype=np.float32) for r in requests]
        sentences = sorted(((i, s) for i, r in enumerate(requests) for s in r.sentences),
                           key=lambda item: -max(len(ids) for ids in item[1].char_ids))
        chunks: list[list] = [[]]
        size = 0
        for item in sentences:
            length = max(len(ids) for ids in item[1].char_ids)
            if chunks[-1] and size + length > chars_per_forward:
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += length
        for chunk in chunks:
            if not chunk:
                continue
            emissions = self.emissions(*_padded(s for _, s in chunk))
            for (i, s), rows in zip(chunk, emissions):
                out[i][s.row, s.first_token:s.first_token + s.tokens] = rows[:s.tokens]
        return out


@dataclass
class Sentence:
    row: int  # of its request
    first_token: int  # in that row
    tokens: int
    char_ids: list[np.ndarray]  # per direction
    positions: list[np.ndarray]  # per direction, into its own char_ids


@dataclass
class SentenceRows:
    rows: int
    tokens: int
    sentences: list[Sentence]


@dataclass(frozen=True)
class Bounds:
    """What one request may ask of the tagger, in char-LM steps (the preprocess stage's own limits, in
    characters of text, keep well inside these; they hold for clients calling ner_tagger directly)."""
    request_chars: int = 1_000_000
    sentence_chars: int = 1_000_000


def sentence_rows(char_ids: np.ndarray, sentence_chars: np.ndarray, sentence_tokens: np.ndarray,
                  token_positions: np.ndarray, token_count: np.ndarray, bounds: Bounds = Bounds()) -> SentenceRows:
    """One request's rows (the preprocess stage's layout) -> its sentences, each checked to lie inside its
    row's tensors."""
    rows, directions, chars = char_ids.shape
    tokens = token_positions.shape[2]
    if not (sentence_chars.shape[0] == sentence_tokens.shape[0] == token_positions.shape[0]
            == token_count.shape[0] == rows) or sentence_chars.shape[1] != sentence_tokens.shape[1]:
        raise BadInput("inputs disagree on the number of rows or sentences")
    if (sentence_chars < 0).any() or (sentence_tokens < 0).any():
        raise BadInput("sentence_chars and sentence_tokens must not be negative")
    check_limit(int(sentence_chars.sum(axis=(0, 1)).max(initial=0)), bounds.request_chars,
                "the request's char-LM input (characters)", "model parameter max_request_lm_characters")
    check_limit(int(sentence_chars.max(initial=0)), bounds.sentence_chars, "a sentence's char-LM input (characters)",
                "model parameter max_sentence_lm_characters")
    if (sentence_chars.sum(axis=1) > chars).any():
        raise BadInput(f"a row's sentence_chars add up to more than its {chars} char_ids")
    if (sentence_tokens.sum(axis=1) != token_count.reshape(-1)).any() or (token_count > tokens).any():
        raise BadInput(f"sentence_tokens must add up to token_count, at most {tokens}")
    found = []
    for r in range(rows):
        char_at, token_at = [0] * directions, 0
        for s in range(sentence_tokens.shape[1]):
            n, sizes = int(sentence_tokens[r, s]), sentence_chars[r, s].tolist()
            if n:
                ids = [char_ids[r, d, char_at[d]:char_at[d] + sizes[d]] for d in range(directions)]
                pos = [token_positions[r, d, token_at:token_at + n] for d in range(directions)]
                if any(p.min() < 0 or p.max() >= sizes[d] for d, p in enumerate(pos)):
                    raise BadInput(f"token_positions of row {r}, sentence {s} fall outside its characters")
                found.append(Sentence(r, token_at, n, ids, pos))
            char_at = [a + b for a, b in zip(char_at, sizes)]
            token_at += n
    return SentenceRows(rows, tokens, found)


def _padded(sentences) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sentences -> the tagger's row tensors: char_ids [n, 2, chars], char_count [n, 2], token_positions
    [n, 2, tokens], token_count [n] (padding beyond each count is never read)."""
    sentences = list(sentences)
    directions = len(sentences[0].char_ids)
    chars = max(len(ids) for s in sentences for ids in s.char_ids)
    tokens = max(s.tokens for s in sentences)
    char_ids = np.zeros((len(sentences), directions, chars), dtype=np.int64)
    positions = np.zeros((len(sentences), directions, tokens), dtype=np.int64)
    for k, s in enumerate(sentences):
        for d in range(directions):
            char_ids[k, d, :len(s.char_ids[d])] = s.char_ids[d]
            positions[k, d, :s.tokens] = s.positions[d]
    char_count = np.array([[len(ids) for ids in s.char_ids] for s in sentences], dtype=np.int64)
    return char_ids, char_count, positions, np.array([s.tokens for s in sentences], dtype=np.int64)
