"""Per-request token choice: greedy, or temperature / top-k / top-p sampling from the request's own
seeded generator (so a request's samples depend on its seed alone, never on its batch-mates)."""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from codegen_common.request_checks import GREEDY_TEMPERATURE, check_sampling


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 (or below GREEDY_TEMPERATURE) = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    seed: int | None = None  # None = a fresh random seed

    def validate(self) -> "SamplingParams":
        check_sampling(self.temperature, self.top_k, self.top_p)
        return self

    @property
    def greedy(self) -> bool:
        # logits / 1e-40 overflow to inf and softmax to nan: a tiny temperature is the greedy limit
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def new_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """On the logits' device (multinomial refuses a generator on another device)."""
        if self.greedy:
            return None
        seed = secrets.randbits(63) if self.seed is None else self.seed
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
