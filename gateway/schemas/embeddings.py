"""The body of POST /v1/embeddings (OpenAI's shape). Unknown fields are ignored, as OpenAI's API does.
`input` is parsed in each of OpenAI's four forms (gateway/schemas/text_input.py): token-id arrays, what
LangChain's OpenAIEmbeddings sends by default, get a 400 naming the cause and the fix."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from gateway.schemas.text_input import TextInput

# the widest embedding `dimensions` may ask for, whatever the model: a static bound, so that the schema refuses
# an absurd value (3.6e18) as the gateway does; up to it, a value over the named model's own dimension is a
# 409 (it depends on which model the name is: gateway/routers/embeddings.py)
MAX_DIMENSIONS = 8192


class EmbeddingsRequest(BaseModel):
    model: str = Field(description="a loaded model's name, e.g. sentence-transformers/all-MiniLM-L6-v2",
                       examples=["sentence-transformers/all-MiniLM-L6-v2"])
    input: TextInput = Field(description="a string or a list of strings (up to MAX_INPUTS, 2,048); token-id "
                                         "arrays are refused (ids of another tokenizer would embed other text)",
                             examples=["hello world"])
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=MAX_DIMENSIONS)] | None = Field(
        None, description="keep the first N values and re-normalize (at most the model's own dimension: 409 over it)")
    user: str | None = None
    truncate: bool | None = Field(None, description="embed the first tokens of an input over the model's maximum "
                                                    "sequence length instead of refusing it (default: "
                                                    "TRUNCATE_DEFAULT, false)")
