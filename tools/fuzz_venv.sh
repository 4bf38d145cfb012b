#!/usr/bin/env bash
# schemathesis in a venv of its own (.fuzz-venv): its dependencies (hypothesis, jsonschema, ...) stay out
# of the project's venv. Used by `make fuzz` and tests/test_security_fuzz.py; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.fuzz-venv
if [ -x "$VENV/bin/schemathesis" ]; then exit 0; fi
PYTHON="$(.venv/bin/python -c 'import sys; print(sys.executable)' 2>/dev/null || command -v python3)"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q 'schemathesis>=4.3,<5'
"$VENV/bin/schemathesis" --version
