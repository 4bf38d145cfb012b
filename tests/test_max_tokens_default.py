"""One definition of each codegen limit the gateway and the generator share (codegen_common/limits.py):
max_tokens' default is what the gateway states, counts for a key's token quota and sends, and what the
generator applies when a request gives none (OpenAI's 16); the most logprobs alternatives is what the
generator checks, and the gateway offers no more."""
from __future__ import annotations

import pytest

from codegen_common import limits
from codegen_common.generation_params import GenerationParams
from gateway.completions import checks
from gateway.schemas.completions import CompletionRequest
from gateway.settings import Settings
from stage_common.errors import BadInput


def test_max_tokens_default_is_the_shared_one():
    assert limits.DEFAULT_MAX_TOKENS == 16
    assert GenerationParams().max_tokens == limits.DEFAULT_MAX_TOKENS
    assert CompletionRequest.model_json_schema()["properties"]["max_tokens"]["default"] == limits.DEFAULT_MAX_TOKENS
    for body in ({"model": "codegen", "prompt": "def f():"}, {"model": "codegen", "prompt": "def f():", "max_tokens": None}):
        assert checks.resolve(CompletionRequest(**body), Settings()).max_tokens == limits.DEFAULT_MAX_TOKENS


def test_logprobs_limit_is_the_shared_one():
    assert checks.MAX_LOGPROBS <= limits.MAX_LOGPROBS == 20  # OpenAI's 5 at the gateway, what the engines give
    assert GenerationParams(logprobs=limits.MAX_LOGPROBS).check(4, 100).logprobs == 20
    with pytest.raises(BadInput, match="between 0 and 20"):
        GenerationParams(logprobs=limits.MAX_LOGPROBS + 1).check(4, 100)
