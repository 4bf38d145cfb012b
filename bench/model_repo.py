"""Reading model_repository/ configs with tritonclient's protobuf classes (benchmarks and tests)."""
from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = ROOT / "model_repository"


def parse_config(model: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((MODEL_REPOSITORY / model / "config.pbtxt").read_text(), config)
    return config


def all_models() -> list[str]:
    return sorted(p.parent.name for p in MODEL_REPOSITORY.glob("*/config.pbtxt"))


def parameter(model: str, name: str, default: str | None = None) -> str | None:
    params = parse_config(model).parameters
    return params[name].string_value if name in params else default
