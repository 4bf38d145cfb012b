"""The gpu tier: every stage's compute on cuda:0 against the same stage on the CPU, in process. Inside the whole
suite each test skips with one line where no GPU is visible (CI has none). On a GPU machine tools/gpu_check.sh
runs this folder alone (`--confcutdir tests/gpu`: the suite's conftest and its live-server fixtures, which need
tritonclient and the gateway's packages, stay out), so this file sets up what these tests need by itself."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT / "tests" / "gpu", ROOT / "tests", ROOT / "backends", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
# nothing here may reach a hub: the models are local folders (tests/conftest.py does the same for the suite)
if not os.environ.get("HF_ENDPOINT", "").startswith("http://127.0.0.1:"):
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import fake_pb_utils  # noqa: E402 - numpy only: stands in for Triton's utils when a model.py is driven here

sys.modules.setdefault("triton_python_backend_utils", fake_pb_utils)
