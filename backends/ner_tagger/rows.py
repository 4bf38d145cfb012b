"""The tagger's rows, without torch: one request's tensors (the preprocess stage's layout) checked and cut
into sentences, sentences padded into forward passes, and the emissions scattered back per request.

Every sentence of every batched request is a row of its own: a long text is many short rows, so memory
and time per forward stay bounded whatever one request sends."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stage_common.errors import BadInput, check_limit

DIRECTIONS = ("forward", "backward")  # the order of the preprocess stage's 2-sized axis


class TaggerRows:
    """What both runtimes share: `_forward` computes emissions [rows, tokens, tags] for rows that all have
    tokens; this class drops the empty rows and cuts a batch into bounded forward passes."""

    num_tags: int

    def _forward(self, char_ids: np.ndarray, char_count: np.ndarray, token_positions: np.ndarray,
                 token_count: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def emissions(self, char_ids: np.ndarray, char_count: np.ndarray, token_positions: np.ndarray,
                  token_count: np.ndarray) -> np.ndarray:
        """All rows at once; rows without tokens (flair skips them) get zeros."""
        counts = token_count.reshape(-1)
        out = np.zeros((len(counts), token_positions.shape[2], self.num_tags), dtype=np.float32)
        keep = np.flatnonzero(counts > 0)
        if len(keep):
            out[keep] = self._forward(*(np.ascontiguousarray(a[keep]) for a in (char_ids, char_count,
                                                                                  token_positions, counts)))
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
            emissions = self.emissions(*padded(s for _, s in chunk))
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


def padded(sentences) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
