"""Fixtures for the live-server tier: one tritonserver per test session on free ports, models
loaded on demand (explicit model control), always stopped."""
from __future__ import annotations


from pathlib import Path

import pytest

from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer


class LiveServer:
    def __init__(self, server: TritonServer):
        self.server = server
        self.grpc_url, self.http_url = server.grpc_url, server.http_url
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(self.grpc_url)
        self._loaded: set[str] = set()

    def load(self, *models: str) -> None:
        for model in models:
            if model not in self._loaded:
                self.client.load_model(model)  # an ensemble's composing models load with it
                self._loaded.add(model)

    def stats(self, model: str):
        return self.client.get_inference_statistics(model).model_stats[0]

    def log_tail(self, lines: int = 60) -> str:
        text = self.server.log_file.read_text(errors="replace") if self.server.log_file else ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The session's DATA_DIR: the gateway's generated models (a second Triton model repository),
    collections and state, as `data/` is for `make triton`."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def triton(tmp_path_factory, data_dir) -> LiveServer:
    from codegen_engines import exact_repository

    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    # model_repository/ with the generator in f32, the exact mode the tests hold served codegen to transformers in
    repository = exact_repository(tmp_path_factory.mktemp("models"))
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          model_repository=repository, explicit_models=[], log_file=log,
                          extra_repositories=[data_dir / "triton_models"])
    server.start(timeout=120)
    try:
        yield LiveServer(server)
    finally:
        server.stop()



class LiveGateway:
    def __init__(self, process: GatewayProcess, triton: LiveServer):
        import httpx

        self.process, self.triton, self.url = process, triton, process.url
        self.http = httpx.Client(base_url=self.url, timeout=300)

    def log_tail(self, lines: int = 80) -> str:
        log = self.process.log_file
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log else ""


@pytest.fixture(scope="session")
def extra_model_root(tmp_path_factory) -> Path:
    """A second allowed model root (MODEL_ROOTS) where tests put model copies of their own."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def gateway(triton, data_dir, extra_model_root, tmp_path_factory) -> LiveGateway:
    """The gateway (python -m gateway) on a free port in front of the session's Triton, DATA_DIR=data_dir."""
    import os

    from gateway.settings import default_model_roots

    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    roots = [*default_model_roots(), extra_model_root]
    process = GatewayProcess(triton.grpc_url, port=free_port(), data_dir=data_dir, log_file=log,
                             env={"MODEL_ROOTS": os.pathsep.join(str(r) for r in roots)})
    process.start(timeout=180)
    live = LiveGateway(process, triton)
    try:
        yield live
    finally:
        live.http.close()
        process.stop()


def concurrently(call, jobs: list) -> list:
    """call(job) for every job at once, so that they share dynamic batches; a request's
    InferenceServerException is returned in its place, not raised."""
    from concurrent.futures import ThreadPoolExecutor

    from tritonclient.utils import InferenceServerException

    def guarded(job):
        try:
            return call(job)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(guarded, jobs))


def assert_invalid_argument(result, message: str) -> None:
    from tritonclient.utils import InferenceServerException

    assert isinstance(result, InferenceServerException), f"expected an error, got {result!r}"
    assert "INVALID_ARGUMENT" in str(result.status()), result
    assert message in result.message(), result.message()
