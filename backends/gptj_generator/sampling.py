"""Every engine's token choice and logprobs, written once over numpy or torch (array_ops.py says why both): greedy,
or temperature / top-k / top-p sampling from the request's own seeded random source (so a request's samples depend
on its seed alone, never on its batch-mates), and the chosen token's logprob with its top alternatives.
Importing this module imports no torch (the OpenVINO engine's stubs never load it)."""
from __future__ import annotations

import math
import secrets

import numpy as np

from gptj_generator.array_ops import ops_for
from gptj_generator.seam import SamplingParams, TokenLogprob


def new_generator(params: SamplingParams, device=None):
    """The request's random source, seeded (by a fresh random seed when it has none); None when greedy. With a
    torch `device`, a torch.Generator there (the draw stays on the logits' device); without, numpy's."""
    if params.greedy:
        return None
    seed = secrets.randbits(63) if params.seed is None else params.seed
    if device is None:
        return np.random.default_rng(seed)
    import torch

    return torch.Generator(device=device).manual_seed(seed)


def sample(logits, params: SamplingParams, generator) -> int:
    """One id from a [vocab] row of raw logits (numpy or torch): the argmax when greedy, else drawn
    after temperature, then top-k, then top-p, by inverse CDF on one uniform of `generator` (new_generator's for
    the array's library; on numpy, the same id Generator.choice(n, p=probs) draws)."""
    ops = ops_for(logits)
    if params.greedy:
        return int(logits.argmax())
    scores = ops.as_float(logits) / params.temperature
    if 0 < params.top_k < scores.shape[0]:
        scores = ops.where(scores < ops.kth_largest(scores, params.top_k), -math.inf, scores)
    probs = ops.softmax(scores)
    if params.top_p < 1.0:
        order = ops.argsort_descending(probs)
        ordered = probs[order]
        before = ops.cumsum(ordered) - ordered  # mass of the likelier ids: once it reaches top_p, drop this one
        probs = ops.unsort(ops.where(before >= params.top_p, 0.0, ordered), order)
        probs = probs / probs.sum()
    cdf = ops.cumsum(probs)
    total = cdf[-1]
    cdf = cdf / total
    # NaN logits (or none left) give no distribution: -1 fails this request alone (one read of the device, with
    # the id's own)
    token = int(ops.where(total > 0, ops.searchsorted_right(cdf, ops.uniform(generator, cdf)), -1))
    if token < 0:
        raise FloatingPointError("the logits give no probability distribution to sample from")
    return token


def token_logprob(logits, token: int, top: int) -> TokenLogprob:
    """The chosen id's logprob under a [vocab] row of raw logits (what OpenAI reports, whatever the sampling
    settings; numpy or torch) and the `top` most likely ids with theirs, most likely first."""
    ops = ops_for(logits)
    logprobs = ops.log_softmax(logits)
    alternatives = ()
    if top:
        ids, values = ops.top(logprobs, top)
        alternatives = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(int(token), float(logprobs[token]), alternatives)
