"""Every config.pbtxt parsed with tritonclient's model_config_pb2, and a loader that runs a
model's backend in-process (with the stubbed pb_utils) exactly as the server would."""
from __future__ import annotations

import importlib.util
import json
import sys

from google.protobuf import json_format

from tools.model_repo import MODEL_REPOSITORY, ROOT, all_models, parse_config  # noqa: F401 - re-exported


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
