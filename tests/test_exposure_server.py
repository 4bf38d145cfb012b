"""With the restriction flags on (forced on 127.0.0.1, as TRITON_RESTRICT_API=1 does for `make triton`),
model control needs the admin key header over gRPC and HTTP; inference does not."""
from __future__ import annotations

import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from launcher.exposure import restricted_api_args
from launcher.processes import free_port
from launcher.triton_server import TritonServer
from supervisor.monitor import admin_headers

pytestmark = pytest.mark.integration
KEY = "test-admin-key-123"
MODEL = "text_embedding_pooling"  # torch-free, loads fast


@pytest.fixture(scope="module")
def restricted(tmp_path_factory):
    log = tmp_path_factory.mktemp("exposure") / "tritonserver.log"
    with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), explicit_models=[],
                      log_file=log, extra_args=restricted_api_args(), env={"TRITON_ADMIN_KEY": KEY}) as server:
        yield server


def http_load(server, headers: dict) -> int:
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/{MODEL}/load", data=b"{}",
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_load_without_the_key_is_refused_and_with_it_works(restricted):
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.load_model(MODEL)
    assert "UNAVAILABLE" in str(refused.value.status()) or "PERMISSION" in str(refused.value.status()) \
        or "restricted" in refused.value.message().lower(), refused.value
    with pytest.raises(InferenceServerException):
        client.load_model(MODEL, headers={"triton-admin-key": "wrong"})
    assert not client.is_model_ready(MODEL)
    client.load_model(MODEL, headers=admin_headers(KEY))
    assert client.is_model_ready(MODEL)  # inference-side APIs stay open
    with pytest.raises(InferenceServerException):
        client.unload_model(MODEL)
    with pytest.raises(InferenceServerException):
        client.register_system_shared_memory("x", "/x", 64)
    with pytest.raises(InferenceServerException):
        client.get_model_repository_index()
    assert client.get_model_repository_index(headers=admin_headers(KEY), as_json=True)["models"]
    assert http_load(restricted, {}) >= 400
    assert http_load(restricted, {"triton-admin-key": KEY}) == 200
    client.unload_model(MODEL, headers=admin_headers(KEY))
