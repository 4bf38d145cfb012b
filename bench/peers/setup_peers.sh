#!/usr/bin/env bash
# Installs the benchmark's peer embedding servers, each in a venv of its own under .peers/ (gitignored),
# never in the project's .venv: their pins (transformers, numpy, onnxruntime) differ from ours.
#   .peers/infinity-venv : infinity-emb[server,torch,optimum] 0.0.78 (torch and ONNX engines)
#   .peers/fastembed-venv: fastembed + fastapi + uvicorn (bench/peers/fastembed_app.py)
# Idempotent: a venv whose stamp matches this script is kept. Usage: bash bench/peers/setup_peers.sh [infinity|fastembed]
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
stamp=$(sha256sum bench/peers/setup_peers.sh | cut -d' ' -f1)
mkdir -p .peers

make_venv() {  # name, pip args...
  local dir=".peers/$1-venv"; shift
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then echo "peers: $dir is up to date"; return; fi
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  # infinity: the CPU torch wheel first (as launcher/setup.sh does), so the resolver does not pull a CUDA build
  # (pip's warnings about this machine's empty local index folders are filtered; its exit status is kept)
  if [ "$dir" = .peers/infinity-venv ]; then "$dir/bin/pip" install --quiet "torch==2.13.0" 2> >(grep -v "is ignored" >&2); fi
  "$dir/bin/pip" install --quiet "$@" 2> >(grep -v "is ignored" >&2)
  echo "$stamp" > "$dir/.stamp"
  echo "peers: $dir ready"
}

want=${1:-all}
if [ "$want" = all ] || [ "$want" = infinity ]; then
  make_venv infinity "infinity-emb[server,torch,optimum]==0.0.78"
fi
if [ "$want" = all ] || [ "$want" = fastembed ]; then
  make_venv fastembed "fastembed>=0.7,<1" fastapi uvicorn orjson
fi
