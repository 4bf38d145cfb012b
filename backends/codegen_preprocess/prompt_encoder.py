"""Prompt -> token ids with the generator's own BPE tokenizer (tokenizer.json, no torch), after the
checks that let a bad request fail here with a clear message instead of inside the generator. A token-id prompt
skips the tokenizer: its ids are checked against the vocabulary and sent as they are (no decode/encode round trip,
which could change them)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from codegen_common.request_checks import check_lengths, check_sampling, check_token_ids
from stage_common.errors import BadInput


@dataclass(frozen=True)
class PromptRequest:
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def check(self) -> "PromptRequest":
        if not self.prompt:
            raise BadInput("text_input is empty: send a prompt to continue")
        check_sampling(self.temperature, self.top_k, self.top_p)
        return self


def context_window(model_config_file: Path) -> int:
    """The generator's context length, from its transformers config.json."""
    config = json.loads(Path(model_config_file).read_text())
    return int(config.get("n_positions") or config["max_position_embeddings"])


def model_vocab_size(model_config_file: Path) -> int | None:
    """The generator's embedding rows (config.json's vocab_size; GPT-J pads it past the tokenizer's), if stated."""
    size = json.loads(Path(model_config_file).read_text()).get("vocab_size")
    return int(size) if size else None


class PromptEncoder:
    def __init__(self, tokenizer_file: Path, context_window: int, max_tokens_limit: int,
                 model_vocab: int | None = None):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()  # a too-long prompt is an error that names the limit
        self.context_window, self.max_tokens_limit = context_window, max_tokens_limit
        # a token-id prompt's ids: those the tokenizer can give (and the fronts can spell) that the model embeds
        vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.vocab_size = min(vocab, model_vocab) if model_vocab else vocab

    def check_ids(self, ids: np.ndarray, max_tokens: int, zero_tokens_ok: bool) -> np.ndarray | BadInput:
        """A token-id prompt as int32 ids, or its error (an id outside the vocabulary, named by position)."""
        try:
            check_token_ids(ids, self.vocab_size)
            check_lengths(len(ids), max_tokens, self.context_window, self.max_tokens_limit,
                          min_tokens=0 if zero_tokens_ok else 1)
            return np.asarray(ids, dtype=np.int32)
        except BadInput as exc:
            return exc

    def encode(self, requests: list[PromptRequest], zero_tokens_ok: list[bool] | None = None
               ) -> list[np.ndarray | BadInput]:
        """int32 ids per request, exactly as the transformers tokenizer gives them (and never
        token_type_ids: GPT-J would embed them at every position), or the request's error."""
        out: list[np.ndarray | BadInput] = []
        zero_tokens_ok = zero_tokens_ok or [False] * len(requests)
        for request, encoding, zero_ok in zip(requests, self.tokenizer.encode_batch([r.prompt for r in requests]),
                                              zero_tokens_ok):
            try:
                check_lengths(len(encoding.ids), request.max_tokens, self.context_window, self.max_tokens_limit,
                              min_tokens=0 if zero_ok else 1)
                out.append(np.asarray(encoding.ids, dtype=np.int32))
            except BadInput as exc:
                out.append(exc)
        return out

    def encode_rows(self, requests: list[list]) -> list[list[np.ndarray] | BadInput]:
        """encode for requests of several rows (PromptRow: prompt or ids, + params): one list of ids per request,
        or the error of its first bad row (a request is the client's one unit)."""
        texts = [row for rows in requests for row in rows if row.ids is None]
        # score only (max_tokens 0) is allowed with the prompt's logprobs
        encoded = iter(self.encode([PromptRequest(row.prompt, row.params.max_tokens) for row in texts],
                                   [row.params.prompt_logprobs for row in texts]))
        out: list = []
        for rows in requests:
            ids = [next(encoded) if row.ids is None else
                   self.check_ids(row.ids, row.params.max_tokens, row.params.prompt_logprobs) for row in rows]
            bad = [(i, e) for i, e in enumerate(ids) if isinstance(e, BadInput)]
            if bad:
                i, error = bad[0]
                out.append(BadInput(f"row {i}: {error}") if len(rows) > 1 else error)
            else:
                out.append(ids)
        return out
