#!/usr/bin/env bash
# Creates .venv with every dependency and the Python backend runtime in backends/python/.
# Idempotent: a re-run with unchanged requirements only checks a stamp.
# GPU=1 (`make setup GPU=1`): the CUDA builds of torch and ONNX Runtime (requirements-gpu.txt) instead of the CPU
# ones; it has its own stamp, so switching either way installs again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
GPU=${GPU:-0}
if [ "$GPU" = 1 ]; then
  stamp_of() { { cat requirements.txt constraints.txt requirements-gpu.txt pyproject.toml launcher/setup.sh; echo GPU=1; } \
    | sha256sum | cut -d' ' -f1; }
else
  stamp_of() { cat requirements.txt constraints.txt pyproject.toml launcher/setup.sh | sha256sum | cut -d' ' -f1; }
fi
want=$(stamp_of)

if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$want" ] \
   && [ -x backends/python/triton_python_backend_stub ]; then
  echo "setup: .venv is up to date"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
# `onnxruntime` and `onnxruntime-gpu` install the same module: the one this run does not want goes first
drop_if_installed() { if "$PIP" show --quiet "$1" >/dev/null 2>&1; then "$PIP" uninstall --quiet --yes "$1"; fi; }
if [ "$GPU" = 1 ]; then
  drop_if_installed onnxruntime
  if ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
    drop_if_installed torch  # a CPU build satisfies torch==2.13.0 too: pip would keep it
  fi
  echo "setup: GPU=1: installing torch==2.13.0 (CUDA build) and onnxruntime-gpu first (requirements-gpu.txt)"
  "$PIP" install --quiet -c constraints.txt -r requirements-gpu.txt
  if ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
    built=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
    echo "setup: GPU=1 but pip installed a CPU-only torch ($built):" \
         "your pip configuration offers a CPU wheel (a find-links or index) that wins over PyPI's CUDA build." \
         "Run again with it off, e.g. PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null make setup GPU=1" >&2
    exit 1
  fi
  echo "setup: installing the rest in one resolver run (requirements.txt without onnxruntime)"
  grep -vE '^onnxruntime([[:space:]<>=!~;[]|$)' requirements.txt > "$VENV/requirements-without-onnxruntime.txt"
  "$PIP" install --quiet -c constraints.txt -r "$VENV/requirements-without-onnxruntime.txt" -r requirements-gpu.txt
else
  drop_if_installed onnxruntime-gpu
  echo "setup: installing torch==2.13.0 (CPU wheel) first"
  "$PIP" install --quiet torch==2.13.0
  echo "setup: installing the rest in one resolver run"
  "$PIP" install --quiet -c constraints.txt -r requirements.txt
fi
# The tree itself, editable (pyproject.toml): every room and stage imports by its name, no sys.path edits.
# An image's dependency layer runs this before the tree is copied in: its Dockerfile installs it after the copy.
if [ -d gateway ] && [ -d backends/stage_common ]; then
  "$PIP" install --quiet "setuptools>=68"  # the build backend pyproject.toml names (a 3.12 venv has none)
  "$PIP" install --quiet --no-deps --no-build-isolation -e .
fi
"$PIP" check
# The OpenVINO export tools `make model` runs (build/openvino_export.py, with PYTHONPATH=.export-tools), with
# --no-deps: optimum-intel requires torchvision, whose wheels here are CUDA builds that break transformers'
# imports beside torch's CPU wheel; everything else they import is in .venv already. Kept off .venv's path, so
# torchvision never lands there and its `pip check` stays clean.
rm -rf .export-tools
"$PIP" install --quiet --no-deps --target .export-tools -c constraints.txt \
  optimum-intel==2.2.0 optimum==2.3.0 nncf==3.4.0 ninja==1.13.2 pydot==4.0.1

# The Python backend (library, stub for this interpreter, utils) ships inside the nvidia-pytriton wheel.
"$VENV/bin/python" - <<'PY'
import os, shutil, sys
from pathlib import Path
import pytriton
root = Path(pytriton.__file__).parent / "tritonserver"
dest = Path("backends/python")
dest.mkdir(parents=True, exist_ok=True)
stub = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub"
for source in (root / "backends" / "python" / "libtriton_python.so",
               root / "backends" / "python" / "triton_python_backend_utils.py", stub):
    # copied beside, then renamed over: a running server's stub binary cannot be opened for writing (ETXTBSY)
    partial = dest / (source.name + ".partial")
    shutil.copy2(source, partial)
    os.replace(partial, dest / source.name)
print(f"setup: Python backend runtime copied to {dest}/")
PY
echo "$want" > "$VENV/.setup-stamp"
echo "setup: done"
