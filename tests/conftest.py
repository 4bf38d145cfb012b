"""Unit tests run every stage without a server: triton_python_backend_utils is stubbed here, once.
Integration tests (marked `integration`) share one live tritonserver per session."""
from __future__ import annotations

import os
import sys
from pathlib import Path

# No test, fixture or process they start may reach the real Hugging Face hub (no internet here, and no
# traffic to outside addresses is allowed): HF_ENDPOINT points at 127.0.0.1 for this session and every
# process it starts (they inherit os.environ: launcher/gateway_process.py, launcher/stack.py), before
# anything imports huggingface_hub (it reads HF_ENDPOINT once, at import). A test that needs a hub starts
# tests/fake_hub.py and passes its address; otherwise this closed port refuses every connection.
# test_hub.py asserts that this holds.
CLOSED_HUB = "http://127.0.0.1:9"
if not os.environ.get("HF_ENDPOINT", "").startswith("http://127.0.0.1:"):
    os.environ["HF_ENDPOINT"] = CLOSED_HUB
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
# a developer's own settings; an OTLP endpoint would have every gateway and Triton a test starts send traces there
for _name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUB_DOWNLOADS", "HUB_CACHE_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT",
              "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
    os.environ.pop(_name, None)
if "huggingface_hub.constants" in sys.modules:  # imported before this file: its endpoint must be local all the same
    assert sys.modules["huggingface_hub.constants"].ENDPOINT.startswith("http://127.0.0.1:"), \
        "huggingface_hub was imported before tests/conftest.py with a hub endpoint that is not 127.0.0.1"

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "backends", ROOT / "client", ROOT / "tests"):
    sys.path.insert(0, str(path))

import fake_pb_utils  # noqa: E402

sys.modules.setdefault("triton_python_backend_utils", fake_pb_utils)

pytest_plugins = ["triton_fixtures"]
