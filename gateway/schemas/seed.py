"""Bodies of the seed service's endpoints (seed 001): load, unload, delete, infer. Unknown fields are
ignored, as the seed did."""
from __future__ import annotations

from pydantic import BaseModel, Field

from gateway.modelgen.sources import MAX_NAME
from gateway.schemas.images import Image
from gateway.schemas.text_input import TextListInput


# A name to load, as gateway/modelgen/sources.py checks it (its messages say which rule a name breaks, so the
# document states the rules and the route keeps its refusal): not blank, at most MAX_NAME characters, no NUL
# or backslash, no '..' path segment. (An absolute path outside MODEL_ROOTS is a 403: that depends on the
# settings and the disk.)
SOURCE_PATTERN = r"^(?!(?:[^/]*/)*\.\.(?:/|$))[^\\\x00]*[^\s\\\x00][^\\\x00]*$"
SOURCE_RULES = {"minLength": 1, "maxLength": MAX_NAME, "pattern": SOURCE_PATTERN}


class LoadSentenceTransformer(BaseModel):
    model_name: str = Field(description="hub id (org/name) or a folder under MODEL_ROOTS",
                            json_schema_extra=SOURCE_RULES)
    replace: bool = Field(False, description="already loaded: read its files again and switch to them without "
                                             "downtime (the old one unloads once its requests are done)")


class LoadClip(BaseModel):
    model_name: str = Field(description="open_clip name (ViT-B-32), hub id, or a folder under MODEL_ROOTS",
                            json_schema_extra=SOURCE_RULES)
    pretrained: str | None = Field(None, description="open_clip pretrained tag, e.g. laion2b_s34b_b79k")
    replace: bool = Field(False, description="already loaded: read its files again and switch to them without "
                                             "downtime (the old one unloads once its requests are done)")


class ModelRef(BaseModel):
    model_name: str
    pretrained: str | None = None


class InferRequest(BaseModel):
    model_name: str
    pretrained: str | None = None
    text: TextListInput | None = Field(None, description="a list of strings (token-id arrays are refused)")
    image: list[Image] | None = Field(None, description="images: base64, data: URLs, or allowlisted http(s) URLs")
    normalize: bool = True
    truncate: bool | None = Field(None, description="embed the first tokens of a text over the model's maximum "
                                                    "sequence length instead of refusing it "
                                                    "(default: TRUNCATE_DEFAULT)")
