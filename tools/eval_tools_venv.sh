#!/usr/bin/env bash
# EleutherAI's lm-evaluation-harness in a venv of its own (.eval-tools): its dependency tree (datasets,
# evaluate, sacrebleu, ...) stays out of the project's venv. transformers (no torch) is its local-completions
# model's tokenizer backend, in the project's own range. Made on first use by bench/lm_eval_check.py; idempotent:
# a stamp holding the packages below skips the install until they change.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.eval-tools
PACKAGES=('lm-eval[api]>=0.4.8,<0.5' 'transformers>=4.46,<5')
STAMP="$VENV/.stamp"
if [ -x "$VENV/bin/lm_eval" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "${PACKAGES[*]}" ]; then exit 0; fi
PYTHON="$(.venv/bin/python -c 'import sys; print(sys.executable)' 2>/dev/null || command -v python3)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "${PACKAGES[@]}"
"$VENV/bin/lm_eval" --help > /dev/null
echo "${PACKAGES[*]}" > "$STAMP"
