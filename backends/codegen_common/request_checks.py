"""Limits every generation request must respect (torch-free: the preprocessing checks them too, so a
bad request fails before it reaches the generator, with INVALID_ARG on every path)."""
from __future__ import annotations

import math
from typing import Sequence

from stage_common.errors import BadInput, check_limit

GREEDY_TEMPERATURE = 1e-5  # below it sampling is greedy (dividing logits by less overflows)
MAX_TOP_K = 1_000_000  # top_k is bounded (0 = no limit; any value above the vocabulary means the same)


def check_lengths(prompt_tokens: int, max_tokens: int, context_window: int, max_tokens_limit: int,
                  min_tokens: int = 1) -> None:
    """min_tokens 0: a score-only request (echo with logprobs) generates nothing."""
    if prompt_tokens == 0:
        raise BadInput("the prompt is empty: send a prompt to continue")
    if not min_tokens <= max_tokens <= max_tokens_limit:
        raise BadInput(f"max_tokens must be between {min_tokens} and {max_tokens_limit}, got {max_tokens}"
                       f"{' (0 only with echo and logprobs: score the prompt)' if min_tokens else ''}")
    longest_prompt = context_window - max_tokens
    if prompt_tokens > longest_prompt:
        raise BadInput(f"the prompt has {prompt_tokens} tokens, but with max_tokens={max_tokens} the context "
                       f"window of {context_window} tokens leaves room for at most {longest_prompt}")


def check_token_ids(ids: Sequence[int], vocab_size: int) -> None:
    """A token-id prompt holds the model's own ids: the first one outside 0..vocab_size-1 is named by position."""
    for position, token in enumerate(ids):
        if not 0 <= int(token) < vocab_size:
            raise BadInput(f"the token id at position {position} is {int(token)}: not in this model's vocabulary "
                           f"(ids 0 to {vocab_size - 1})")


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"temperature must be >= 0 and finite (0 = greedy), got {temperature}")
    if not 0 <= top_k <= MAX_TOP_K:
        raise BadInput(f"top_k must be >= 0 (0 = no limit) and at most {MAX_TOP_K}, got {top_k}")
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise BadInput(f"top_p must be in (0, 1], got {top_p}")


def check_stop_words(stop_words: Sequence[str], max_count: int, max_chars: int) -> None:
    """Stop words are matched on the decode loop every sequence shares: their number and length are
    bounded (max_stop_words, max_stop_word_chars in the generator's and preprocessing's config)."""
    check_limit(len(stop_words), max_count, "the number of stop words", "max_stop_words")
    for word in stop_words:
        check_limit(len(word), max_chars, f"the length of stop word {word[:20]!r}... (characters)",
                    "max_stop_word_chars")


def check_rows(ids_shape: tuple, lengths: Sequence[int], params_rows: int) -> None:
    """codegen_collect's rows agree: input_ids [rows, width], one input_lengths and one generation_params per
    row, each length in 1..width (checked by the front itself, before any generator call)."""
    if len(ids_shape) != 2 or not ids_shape[0] == len(lengths) == params_rows:
        raise BadInput(f"input_ids {list(ids_shape)}, input_lengths ({len(lengths)}) and generation_params "
                       f"({params_rows}) must have one row per prompt")
    for row, length in enumerate(lengths):
        if not 1 <= int(length) <= ids_shape[1]:
            raise BadInput(f"input_lengths[{row}] = {int(length)} does not fit input_ids of {ids_shape[1]} tokens "
                           "(an empty prompt has nothing to continue)")
