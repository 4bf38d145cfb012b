"""The forms a text field may take in OpenAI's API: a string, a list of strings, a list of token ids or a
list of token-id arrays. All four are parsed, so that token ids reach the route and get a 400 that says why
and what to change (gateway/embedding/inputs.py, gateway/completions/checks.py), instead of a validation
error about strings. Which form a value is in is read from its first item (a callable discriminator), so a
list is validated once, as one form; a list of strings stops at its first bad item, and token ids are not
validated here: embeddings refuse them whatever they hold, completions check each against the model's
vocabulary (gateway/completions/checks.py). (Pydantic's plain union took 19 s and a 380 MB
message for a 14 MB list of integers.)"""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Field, SkipValidation, Tag


def input_form(value: Any) -> str:
    """"text", "texts", "tokens" or "token_arrays", from the value's type and its first item's."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, list):
            return "token_arrays"
        if isinstance(first, int) and not isinstance(first, bool):
            return "tokens"
    return "texts"


TEXT = Annotated[str, Tag("text")]
TEXTS = Annotated[list[str], Tag("texts"), Field(fail_fast=True)]
TOKENS = Annotated[SkipValidation[list[int]], Tag("tokens")]
TOKEN_ARRAYS = Annotated[SkipValidation[list[list[int]]], Tag("token_arrays")]
TextInput = Annotated[Union[TEXT, TEXTS, TOKENS, TOKEN_ARRAYS], Discriminator(input_form)]
# the seed's /infer takes a list only (a lone string stays a 400, as in the seed)
TextListInput = Annotated[Union[TEXTS, TOKENS, TOKEN_ARRAYS],
                          Discriminator(input_form, custom_error_type="list_type")]
