"""Fuzzing the live gateway with schemathesis (issue 25), every operation, with an admin key and with none,
with every check schemathesis has (`--checks all`: tools/fuzz_gateway.py), none relaxed and no operation
excepted (issue 52: docs/gateway-api.md "Conformance"): no 5xx, every response conforms to the documented
statuses, content types, headers and schemas, schema-valid requests are served and invalid ones refused,
undeclared methods get a 405 with Allow, protected operations refuse a request without a key, and the
gateway is healthy afterwards: 0 failures. A few examples per operation here; `make fuzz` runs longer and
prints the counts."""
from __future__ import annotations

import subprocess

import httpx

import pytest

from security_helpers import KEYS, keyed_gateway
from tools.fuzz_gateway import ROOT, fuzz, healthy

pytestmark = pytest.mark.integration
EXAMPLES = 3  # per operation and phase; schemathesis' coverage phase adds its boundary cases on top


@pytest.fixture(scope="module")
def fuzzed_gateway(triton, tmp_path_factory):
    subprocess.run(["bash", str(ROOT / "tools" / "fuzz_venv.sh")], check=True, timeout=900)
    triton.load("text_embedding")
    process = keyed_gateway(triton, tmp_path_factory.mktemp("fuzz"))
    try:
        yield process
    finally:
        process.stop()


@pytest.mark.parametrize("key", ["admin", None], ids=["admin-key", "no-key"])
def test_schemathesis_finds_nothing(fuzzed_gateway, tmp_path, key):
    run = fuzz(fuzzed_gateway.url, KEYS[key] if key else None, EXAMPLES, tmp_path)
    print(f"\nfuzz ({key or 'no'} key): {run['operations']} operations, {run['examples']} examples, "
          f"checks {run['checks']}, {len(run['failures'])} failures")
    operations = sum(len(methods) for methods in httpx.get(f"{fuzzed_gateway.url}/openapi.json").json()["paths"].values())
    assert run["operations"] == operations and run["examples"] > operations * EXAMPLES, run["output"][-3000:]
    # --checks all: among them those that judge a status against the document and the data against the schema
    assert {"not_a_server_error", "status_code_conformance", "response_schema_conformance",
            "positive_data_acceptance", "negative_data_rejection", "unsupported_method"} <= set(run["checks"])
    assert run["failures"] == [] and run["exit"] == 0, run["output"][-6000:]
    assert healthy(fuzzed_gateway.url)
