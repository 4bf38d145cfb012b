"""Unit tests run every stage without a server: triton_python_backend_utils is stubbed here, once.
Integration tests (marked `integration`) share one live tritonserver per session."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "backends", ROOT / "client", ROOT / "tests"):
    sys.path.insert(0, str(path))

import fake_pb_utils  # noqa: E402

sys.modules.setdefault("triton_python_backend_utils", fake_pb_utils)

pytest_plugins = ["triton_fixtures"]
