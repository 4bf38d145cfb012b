"""Token healing, the preprocessing's half (issue 44): a prompt that ends inside what the tokenizer would merge with
the text that follows (trailing whitespace or a newline, a partial identifier) ends on a token the model rarely saw
at that place, and greedy decoding often ends at once ("def f(x):\n" -> end-of-text). So the last id is backed off
and the generator makes its first id(s) spell the removed text (gptj_generator/healing.py), i.e. lets the model
choose the merged token it knows. The fronts cut the removed text from the answer, which starts right after the
user's prompt as always.

Only when the prompt ends in whitespace or a word character (a prompt ending on punctuation is a clean boundary and
is left alone, so its greedy output is unchanged), the last id decodes to whole characters, and something is left
before it. Not for score-only or echo-with-logprobs requests (their prompt ids are what is scored)."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from codegen_common.generation_params import GenerationParams

_MERGEABLE_END = re.compile(r"[\s\w]\Z")


def heal(ids: np.ndarray, params: GenerationParams, decode) -> tuple[np.ndarray, str]:
    """(ids to send, text backed off); `decode(list_of_ids) -> str` is the tokenizer's."""
    if not params.token_healing or params.prompt_logprobs or params.max_tokens == 0 or len(ids) < 2:
        return ids, ""
    removed = decode([int(ids[-1])])
    if not removed or "\ufffd" in removed or not _MERGEABLE_END.search(removed):
        return ids, ""
    return ids[:-1], removed


def heal_rows(requests: list[list], encoded: list, decode) -> list:
    """encode_rows' answer (per request: its rows' ids, or its error) as (ids, params) per row, healed."""
    out = []
    for rows, ids in zip(requests, encoded):
        if isinstance(ids, Exception):
            out.append(ids)
            continue
        healed = []
        for row, row_ids in zip(rows, ids):
            row_ids, removed = heal(row_ids, row.params, decode)
            healed.append((row_ids, replace(row.params, heal_prefix=removed)))
        out.append(healed)
    return out
