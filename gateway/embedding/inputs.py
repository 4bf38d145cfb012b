"""What an embeddings request's `input` may be (gateway/schemas/embeddings.py parses OpenAI's four forms):
text, as a string or a list of strings. Token-id arrays are refused with the reason and the fix, because
ids from another tokenizer (tiktoken's, which LangChain's OpenAIEmbeddings sends by default) are not this
model's ids: embedding them would embed some other text, silently."""
from __future__ import annotations

from gateway.errors import BadRequest
from gateway.schemas.text_input import input_form

TOKEN_IDS_REFUSED = (
    "{what} is {form}: this gateway embeds text only. Token ids made by another tokenizer (tiktoken's, which "
    "LangChain's OpenAIEmbeddings sends by default) are not this model's ids, so they would embed different "
    "text. Send the text itself; with LangChain: OpenAIEmbeddings(..., check_embedding_ctx_length=False).")
FORMS = {"tokens": "a list of token ids", "token_arrays": "a list of token-id arrays"}


def texts_of(value, what: str = "input") -> list[str]:
    """The texts of `value` (a string or a list of strings); a 400 for token ids, naming the fix."""
    form = input_form(value)
    if form in FORMS:
        raise BadRequest(TOKEN_IDS_REFUSED.format(what=what, form=FORMS[form]), param=what,
                         code="token_ids_not_supported")
    return [value] if isinstance(value, str) else list(value)
