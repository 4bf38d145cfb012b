"""The body of POST /v1/completions (OpenAI's legacy completions). Unknown fields are ignored (as the
gateway's other endpoints do); parameters the model cannot honour are refused by name, never silently
dropped (gateway/completions/checks.py)."""
from __future__ import annotations

from typing import Union

from pydantic import BaseModel

from gateway.schemas.text_input import TextInput

# max_tokens when a request leaves it out or sends null: OpenAI's default, and the generator's own
# (backends/codegen_common/generation_params.py DEFAULT_MAX_TOKENS; tests check that they agree)
DEFAULT_MAX_TOKENS = 16


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model: str
    prompt: Union[TextInput, None] = None  # token ids are refused by name (gateway/completions/checks.py)
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float | None = None  # OpenAI's default: 1
    top_p: float | None = None  # OpenAI's default: 1
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    user: str | None = None
    logprobs: int | None = None  # 0-5: each token's logprob and that many alternatives (with echo: the prompt's too)
    token_healing: bool | None = None  # not OpenAI's: null/true heals a prompt ending mid-token (docs/clients.md)
    # accepted by OpenAI, not by this model: refused when set to anything but their no-op value
    best_of: int | None = None
    suffix: str | None = None
    logit_bias: dict | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
