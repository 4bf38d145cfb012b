#!/usr/bin/env bash
# The client libraries of tests/clients/ (the OpenAI SDK, LangChain, LlamaIndex, LiteLLM) in a venv of
# their own (.clients-venv): their dependency trees stay out of the project's venv. Idempotent: a stamp
# holding the hash of tests/clients/requirements.txt skips the install until that file changes.
# Used by the clients tier's fixture (tests/clients/conftest.py), so `make test` makes it on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.clients-venv
REQUIREMENTS=tests/clients/requirements.txt
STAMP="$VENV/.stamp"
WANT="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then exit 0; fi
PYTHON="$(.venv/bin/python -c 'import sys; print(sys.executable)' 2>/dev/null || command -v python3)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQUIREMENTS"
echo "$WANT" > "$STAMP"
