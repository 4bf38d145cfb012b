"""A codegen request's rows as prompts with their resolved GenerationParams (torch-free): each row is
its own sequence; every bound a request controls is checked here, naming its config parameter. A row's prompt is
text (text_input, tokenized by prompt_encoder.py) or the model's own token ids (input_ids, sent as they are)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from codegen_common.generation_params import DEFAULT_MAX_TOKENS, GenerationParams, parse_sampling_parameters
from stage_common.errors import BadInput, decode_utf8
from stage_common.request_inputs import row_stop_words, row_values
from stage_common.triton_io import input_array, text_rows

PAD = -1  # input_ids rows of several lengths are right-padded with it (as codegen_collect's output_ids)


@dataclass(frozen=True)
class RowLimits:
    max_prompt_bytes: int
    max_stop_words: int
    max_stop_word_chars: int


@dataclass(frozen=True)
class PromptRow:
    prompt: str  # "" for a token-id prompt
    params: GenerationParams
    ids: np.ndarray | None = None  # a token-id prompt (input_ids): never tokenized, never healed


def id_rows(request) -> list[np.ndarray] | None:
    """input_ids as one int64 array per row, its trailing PAD dropped; None when the request sends no ids."""
    ids = input_array(request, "input_ids", optional=True)
    if ids is None:
        return None
    rows = ids.astype(np.int64).reshape(ids.shape[0] if ids.ndim > 1 else 1, -1)
    out = []
    for row in rows:
        end = len(row)
        while end and row[end - 1] == PAD:
            end -= 1
        out.append(row[:end])
    return out


def prompt_rows(request, limits: RowLimits) -> tuple[list[str], list[np.ndarray] | None]:
    """(texts, ids): the prompt of each row, as text or, from input_ids, as ids ("" for each text)."""
    ids = id_rows(request)
    if ids is None:
        return text_rows(request, "text_input", limits.max_prompt_bytes, "max_prompt_bytes"), None
    if input_array(request, "text_input", optional=True) is not None:
        raise BadInput("send the prompt as text_input (text) or as input_ids (token ids), not both")
    return [""] * len(ids), ids


def _at(values: list | None, row: int, default):
    return default if values is None else values[row]


def parse_rows(request, limits: RowLimits) -> list[PromptRow]:
    prompts, ids = prompt_rows(request, limits)
    n = len(prompts)
    max_tokens = row_values(request, "request_output_len", n)
    temperature, top_k = row_values(request, "temperature", n), row_values(request, "runtime_top_k", n)
    top_p, seed = row_values(request, "runtime_top_p", n), row_values(request, "random_seed", n)
    exclude, stream = row_values(request, "exclude_input_in_output", n), row_values(request, "stream", n)
    del stream  # a valid BOOL per row is all the unary model asks of it (checked by row_values)
    logprobs, healing = row_values(request, "logprobs", n), row_values(request, "token_healing", n)
    sampling = row_values(request, "sampling_parameters", n)
    stop = row_stop_words(request, n)
    rows = []
    for i, prompt in enumerate(prompts):
        if not prompt and ids is None:
            raise BadInput(f"text_input{'' if n == 1 else f' row {i}'} is empty: send a prompt to continue")
        params = GenerationParams(max_tokens=int(_at(max_tokens, i, DEFAULT_MAX_TOKENS)),
                                  temperature=float(_at(temperature, i, 0.0)), top_k=int(_at(top_k, i, 0)),
                                  top_p=float(_at(top_p, i, 1.0)),
                                  seed=None if seed is None else int(seed[i]), stop=tuple(stop[i]),
                                  exclude_input=bool(_at(exclude, i, True)),
                                  logprobs=None if logprobs is None or logprobs[i] < 0 else int(logprobs[i]),
                                  # ids are sent as they are: healing would re-spell their last one
                                  token_healing=ids is None and bool(_at(healing, i, True)))
        if sampling is not None:
            raw = sampling[i]
            text = decode_utf8(raw if isinstance(raw, bytes) else str(raw).encode(), "sampling_parameters")
            params = replace(params, **parse_sampling_parameters(text))
        rows.append(PromptRow(prompt, params.check(limits.max_stop_words, limits.max_stop_word_chars),
                              None if ids is None else ids[i]))
    return rows
