"""A loaded embedding model as the gateway sees it: which Triton ensembles to call and what they give."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

BUILTIN_MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class ModelSpec:
    model_name: str  # as the user gave it (hub id or local path)
    pretrained: str | None  # open_clip pretrained tag for CLIP when given
    kind: str  # "sentence_transformer" | "clip"
    dimension: int
    max_tokens: int  # the tokenizer's truncation length
    text_model: str | None  # ensemble: "text" TYPE_STRING [1] -> "embedding" FP32 [dimension]
    image_model: str | None  # ensemble: "image" TYPE_STRING [1] (encoded bytes) -> "embedding"
    triton_models: tuple[str, ...]  # every model folder generated for it (empty for shipped models)
    normalized: bool  # the ensembles' output is already L2-normalized
    tokenizer_file: str | None = None  # tokenizer.json, for counting tokens (usage)
    max_batch_size: int = 32
    builtin: bool = False  # shipped in model_repository/: never unloaded or deleted by the gateway
    runtime: str = "torch"  # what runs its encoder: "onnx" (ONNX Runtime) or "torch"

    @property
    def ensembles(self) -> tuple[str, ...]:
        return tuple(m for m in (self.text_model, self.image_model) if m)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "ModelSpec":
        data = dict(data)
        data["triton_models"] = tuple(data.get("triton_models", ()))
        return cls(**data)


def configured_max_length(config_pbtxt: Path) -> int:
    """The `max_length` parameter of a tokenizer stage's config.pbtxt: the length the served model truncates
    to, so the gateway's checks follow the model as served."""
    found = re.search(r'key:\s*"max_length"\s*value:\s*{\s*string_value:\s*"(\d+)"', config_pbtxt.read_text())
    if not found:
        raise ValueError(f"{config_pbtxt} has no max_length parameter")
    return int(found.group(1))


def builtin_specs() -> list[ModelSpec]:
    """Shipped models reachable by name: the real all-MiniLM-L6-v2 is the `text_embedding` ensemble."""
    from gateway.settings import ROOT

    tokenizer = ROOT / "model_repository" / "text_embedding_tokenizer"
    return [ModelSpec(model_name=BUILTIN_MINILM, pretrained=None, kind="sentence_transformer", dimension=384,
                      max_tokens=configured_max_length(tokenizer / "config.pbtxt"), text_model="text_embedding",
                      image_model=None, triton_models=(),
                      normalized=True, max_batch_size=64, builtin=True, runtime="onnx",
                      tokenizer_file=str(tokenizer / "1" / "tokenizer.json"))]


@dataclass(frozen=True)
class ImageLimits:
    """The gateway's image limits, written into each generated image stage's config: one source (the
    gateway's settings) for both, so the stage never refuses an image the gateway let through."""
    max_image_bytes: int
    max_megapixels: float

    @classmethod
    def of(cls, settings=None) -> "ImageLimits":
        """From `settings` (default: the defaults of gateway.settings.Settings)."""
        from gateway.settings import Settings

        source = settings if settings is not None else Settings.from_env({})  # the defaults, whatever the environment
        return cls(int(source.max_image_bytes), float(source.max_image_megapixels))
