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


CODEGEN_MODELS = ["codegen_preprocess", "codegen_generator", "codegen_collect", "codegen_postprocess", "codegen",
                  "codegen_stream"]
SHIPPED_ENGINE = '{ key: "engine" value: { string_value: "auto" } }'  # the generator's config, as shipped


def repository_with_engine(folder: Path, engine: str) -> Path:
    """`folder` as a model repository of the codegen models, their artifacts linked from model_repository/, the
    generator's config.pbtxt saying `engine`: what a reload from disk (the supervisor's heal) reads too."""
    for model in CODEGEN_MODELS:
        (folder / model).mkdir(parents=True)
        config = (MODEL_REPOSITORY / model / "config.pbtxt").read_text()
        if model == "codegen_generator":
            assert SHIPPED_ENGINE in config, "the generator's config no longer ships engine: auto"
            config = config.replace(SHIPPED_ENGINE, SHIPPED_ENGINE.replace('"auto"', f'"{engine}"'))
        (folder / model / "config.pbtxt").write_text(config)
        (folder / model / "1").symlink_to(MODEL_REPOSITORY / model / "1", target_is_directory=True)
    return folder
