"""One `max_tokens` default on each side of the gRPC call: what the gateway counts for a key's token quota
and sends is what the generator applies when a request gives none (OpenAI's 16)."""
from __future__ import annotations

from codegen_common.generation_params import DEFAULT_MAX_TOKENS as GENERATOR_DEFAULT

from gateway.schemas.completions import DEFAULT_MAX_TOKENS as GATEWAY_DEFAULT, CompletionRequest


def test_gateway_and_generator_agree():
    assert GATEWAY_DEFAULT == GENERATOR_DEFAULT == 16


def test_a_request_without_max_tokens_gets_the_default():
    assert CompletionRequest(model="codegen", prompt="def f():").max_tokens == GATEWAY_DEFAULT
