"""Every config.pbtxt parsed with tritonclient's model_config_pb2, and a loader that runs a
model's backend in-process (with the stubbed pb_utils) exactly as the server would."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from google.protobuf import json_format, text_format

from bench.model_repo import MODEL_REPOSITORY, ROOT, all_models, parse_config  # noqa: F401 - re-exported


def _initialize(config, repository: Path, model: str, instance_kind: str = "CPU", params: dict | None = None):
    """Import backends/<backend>/model.py under a unique name and initialize it on repository/<model>,
    with `params` overriding the config's parameters (as a config override of a load would)."""
    path = ROOT / "backends" / config.backend / "model.py"
    spec = importlib.util.spec_from_file_location(f"backend_model_{config.backend}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    instance = module.TritonPythonModel()
    config_json = json_format.MessageToDict(config, preserving_proto_field_name=True)
    for key, value in (params or {}).items():
        config_json.setdefault("parameters", {})[key] = {"string_value": str(value)}
    instance.initialize({
        "model_config": json.dumps(config_json), "model_name": model, "model_version": "1",
        "model_repository": str(repository / model), "model_instance_kind": instance_kind,
        "model_instance_name": f"{model}_0", "model_instance_device_id": "0",
    })
    return instance


def load_python_model(model: str, instance_kind: str = "CPU", params: dict | None = None):
    """A model of model_repository/, initialized as the server would (`params`: a config override's parameters)."""
    return _initialize(parse_config(model), MODEL_REPOSITORY, model, instance_kind, params)


def load_generated(repository: Path, model: str, params: dict | None = None):
    """A model the gateway generated into `repository`, initialized as the server would."""
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig()
    text_format.Parse((Path(repository) / model / "config.pbtxt").read_text(), config)
    return _initialize(config, Path(repository), model, params=params)
