"""Every config.pbtxt parsed with tritonclient's model_config_pb2, and a loader that runs a
model's backend in-process (with the stubbed pb_utils) exactly as the server would."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = ROOT / "model_repository"


def parse_config(model: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((MODEL_REPOSITORY / model / "config.pbtxt").read_text(), config)
    return config


def all_models() -> list[str]:
    return sorted(p.parent.name for p in MODEL_REPOSITORY.glob("*/config.pbtxt"))


def load_python_model(model: str, instance_kind: str = "CPU"):
    """Import backends/<backend>/model.py under a unique name and initialize it for <model>."""
    config = parse_config(model)
    path = ROOT / "backends" / config.backend / "model.py"
    spec = importlib.util.spec_from_file_location(f"backend_model_{config.backend}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    instance = module.TritonPythonModel()
    config_json = json_format.MessageToDict(config, preserving_proto_field_name=True)
    instance.initialize({
        "model_config": json.dumps(config_json), "model_name": model, "model_version": "1",
        "model_repository": str(MODEL_REPOSITORY / model), "model_instance_kind": instance_kind,
        "model_instance_name": f"{model}_0", "model_instance_device_id": "0",
    })
    return instance
