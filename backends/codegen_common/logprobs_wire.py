"""The generator's `logprobs` output (TYPE_STRING, JSON; only on responses of requests that asked): the logprobs of
the ids in that response's output_ids and, on the first response of a request with prompt_logprobs, of the prompt's
ids. Each entry is [logprob, [[id, logprob], ...]] (the top alternatives, most likely first); the prompt's first
entry is null (nothing predicts the first id). Torch-free: the generator writes it, the fronts read it."""
from __future__ import annotations

import json


def _entry(lp) -> list | None:
    return None if lp is None else [lp.logprob, [[token, logprob] for token, logprob in lp.top]]


def encode(logprobs: list, prompt_logprobs: list | None = None) -> str:
    """logprobs / prompt_logprobs: the engine seam's TokenLogprob (prompt's first None)."""
    data = {"ids": [_entry(lp) for lp in logprobs]}
    if prompt_logprobs is not None:
        data["prompt"] = [_entry(lp) for lp in prompt_logprobs]
    return json.dumps(data, separators=(",", ":"))


def decode(text: str | bytes) -> tuple[list, list | None]:
    """(entries of the output ids, entries of the prompt's ids or None)."""
    if not text:
        return [], None
    data = json.loads(text)
    return data.get("ids", []), data.get("prompt")
