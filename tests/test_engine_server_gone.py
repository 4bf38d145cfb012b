"""A Triton failure the status does not explain (INTERNAL: 'Internal error from Core', seen on a stream the
instant tritonserver was killed) is a 503 to retry while the server is not live, and stays a 500 (with an
error id) while it is: issue 26's 'clients see only 503 or UNAVAILABLE' across a server death."""
from __future__ import annotations

import asyncio

import pytest
from tritonclient.utils import InferenceServerException

from gateway import errors
from gateway.triton.engine import TritonEngine


class FakeClient:
    def __init__(self, live):
        self.live = live

    async def is_server_live(self):
        if isinstance(self.live, Exception):
            raise self.live
        return self.live


def failure(live, status="StatusCode.INTERNAL", message="Internal error from Core"):
    engine = TritonEngine.__new__(TritonEngine)  # no channel: only the classification is under test
    engine.client = FakeClient(live)
    return asyncio.run(engine._failure(InferenceServerException(message, status=status), "codegen_stream"))


@pytest.mark.parametrize("live", [False, InferenceServerException("connection refused", status="UNAVAILABLE")])
def test_an_unexplained_failure_while_the_server_is_down_is_a_503(live):
    err = failure(live)
    assert isinstance(err, errors.Unavailable) and err.status == 503 and err.code == "server_unavailable"


def test_an_unexplained_failure_while_the_server_lives_is_internal():
    assert isinstance(failure(True), errors.Internal)


def test_a_client_fault_is_never_hidden_behind_the_liveness_check():
    err = failure(False, status="StatusCode.INVALID_ARGUMENT", message="input_ids must lie in [0, 10)")
    assert isinstance(err, errors.BadRequest)
