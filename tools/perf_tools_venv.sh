#!/usr/bin/env bash
# Triton's perf_analyzer in a venv of its own (.perf-tools): the tritonclient 2.51 wheel still ships the
# perf_analyzer binary (later wheels dropped it; the PyPI perf-analyzer package needs glibc 2.38), and the
# project's .venv keeps its newer tritonclient. The binary links libb64.so.0d (Debian's libb64-0d, unpacked
# into .perf-tools/native, not installed system-wide) and libcudart.so.12 (the nvidia-cuda-runtime-cu12
# wheel; loaded, never used without --shared-memory=cuda): bench/perf_analyzer.py puts both folders on
# LD_LIBRARY_PATH. Made on first use by bench/perf_analyzer.py; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.perf-tools
STAMP="$VENV/.complete"
if [ -f "$STAMP" ]; then exit 0; fi
PYTHON="$(.venv/bin/python -c 'import sys; print(sys.executable)' 2>/dev/null || command -v python3)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check 'tritonclient==2.51.0' 'nvidia-cuda-runtime-cu12>=12,<13'
mkdir -p "$VENV/native"
DEBS="$(mktemp -d)"
trap 'rm -rf "$DEBS"' EXIT
(cd "$DEBS" && { apt-get download libb64-0d 2>/dev/null || { apt-get update -qq && apt-get download libb64-0d; }; })
dpkg-deb -x "$DEBS"/libb64-0d_*.deb "$DEBS/x"
cp -a "$DEBS"/x/usr/lib/*/libb64.so.0d* "$VENV/native/"
LD_LIBRARY_PATH="$PWD/$VENV/native:$(echo "$PWD/$VENV"/lib/python3*/site-packages/nvidia/cuda_runtime/lib)" \
  "$VENV/bin/perf_analyzer" --version
touch "$STAMP"
