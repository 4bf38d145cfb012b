"""The torch engine's per-request token choice: greedy, or temperature / top-k / top-p sampling from the
request's own seeded generator (so a request's samples depend on its seed alone, never on its batch-mates),
and the chosen token's logprob with its top alternatives."""
from __future__ import annotations

import math
import secrets

import torch

from gptj_generator.seam import SamplingParams, TokenLogprob


def new_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """On the logits' device (multinomial refuses a generator on another device); None when greedy."""
    if params.greedy:
        return None
    seed = secrets.randbits(63) if params.seed is None else params.seed
    return torch.Generator(device=device).manual_seed(seed)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from a [vocab] row of logits."""
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) >= params.top_p  # mass before this token already reaches top_p
        scores = scores.scatter(0, order, ordered.masked_fill(drop, -math.inf))
    return int(torch.multinomial(scores.softmax(-1), 1, generator=generator))


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """The chosen id's logprob under the raw logits (what OpenAI reports, whatever the sampling settings) and
    the `top` most likely ids with theirs."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    alternatives = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist()))
    return TokenLogprob(token, float(logprobs[token]), alternatives)
