"""A Triton with the completions models and a gateway in front of it, on free ports and a temporary data
folder, both stopped on exit (as the test fixtures start them): for the benches that go through the gateway's
/v1/completions (bench/lm_eval_check.py, bench/completions_burst.py)."""
from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import tritonclient.grpc as grpcclient

from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer

MODELS = ["codegen_generator", "codegen_preprocess", "codegen_stream"]  # what /v1/completions calls


@contextlib.contextmanager
def completions_stack(env: dict[str, str] | None = None,
                      generator_parameters: dict[str, str] | None = None) -> Iterator[str]:
    """-> the gateway's base URL. generator_parameters: codegen_generator reloaded with these config parameters
    overridden (e.g. precision f32, the exact mode) before the gateway starts; the fronts call it by name."""
    with tempfile.TemporaryDirectory() as data:
        server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                              explicit_models=MODELS, log_file=Path(data) / "tritonserver.log")
        server.start(timeout=600)
        try:
            if generator_parameters:
                override_generator(server.grpc_url, generator_parameters)
            gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=Path(data), env=env,
                                     log_file=Path(data) / "gateway.log")
            gateway.start(timeout=180)
            try:
                yield gateway.url
            finally:
                gateway.stop()
        finally:
            server.stop()


def override_generator(grpc_url: str, parameters: dict[str, str]) -> None:
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        config = client.get_model_config("codegen_generator", as_json=True)["config"]
        config["parameters"] = {**config.get("parameters", {}),
                                **{key: {"string_value": value} for key, value in parameters.items()}}
        client.load_model("codegen_generator", config=json.dumps(config), client_timeout=600)
    finally:
        client.close()
