"""Limits every generation request must respect (torch-free: the preprocessing checks them too, so a
bad request fails before it reaches the generator, with INVALID_ARG on every path)."""
from __future__ import annotations

import math

from stage_common.errors import BadInput


def check_lengths(prompt_tokens: int, max_tokens: int, context_window: int, max_tokens_limit: int) -> None:
    if prompt_tokens == 0:
        raise BadInput("the prompt is empty: send a prompt to continue")
    if not 1 <= max_tokens <= max_tokens_limit:
        raise BadInput(f"max_tokens must be between 1 and {max_tokens_limit}, got {max_tokens}")
    longest_prompt = context_window - max_tokens
    if prompt_tokens > longest_prompt:
        raise BadInput(f"the prompt has {prompt_tokens} tokens, but with max_tokens={max_tokens} the context "
                       f"window of {context_window} tokens leaves room for at most {longest_prompt}")


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k < 0:
        raise BadInput(f"top_k must be >= 0 (0 = no limit), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise BadInput(f"top_p must be in (0, 1], got {top_p}")
