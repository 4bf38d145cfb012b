#!/usr/bin/env bash
# The GPU check (docs/deployment.md, "Checking a GPU node"). On a machine with one NVIDIA GPU, Python 3.12 and torch
# with CUDA but no network, from a copy of this repository plus the carry `tools/gpu_carry.py gather` made
# (.gpu-carry/, at most 60 MiB; CARRY=<folder> for another): the gpu tests (tests/gpu/), then the pipelines served
# by Triton on KIND_CPU and on KIND_GPU, one request each compared, and the load at concurrency 16 (meant to take
# under 8 minutes).
# On a machine set up by `make setup GPU=1 && make model` no carry is needed. Where no GPU is visible, or with
# --cpu-dry-run, it says so and runs the CPU parts it can (the tests skip; Triton serves the CPU run only).
# Exit status 0 when every step passed. The gpu tests pass only when some ran and, where a GPU is visible, none
# skipped (on the carry path the ONNX Runtime variants skip: no onnxruntime-gpu there, so the check says failed).
set -uo pipefail
cd "$(dirname "$0")/.."
# the rooms and the stages by their own names, as `make setup`'s editable install gives them: the GPU machine's copy
# of the tree is not installed (no network there), and its Python may be the carry's venv or the machine's own
export PYTHONPATH="$PWD:$PWD/backends${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.gpu-carry}
WORK=.gpu-check
LOAD_SECONDS=${LOAD_SECONDS:-10}
start=$(date +%s)
failed=()
step() { echo; echo "== gpu_check [$(($(date +%s) - start))s] $*"; }

cpu_only=0
[ "${1:-}" = --cpu-dry-run ] && cpu_only=1

step "environment"
"$PYTHON" - <<'PY' || { echo "gpu_check: $PYTHON cannot import torch: nothing to check"; exit 1; }
import platform, torch
cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
print(f"Python {platform.python_version()}, torch {torch.__version__} ({cuda}), GPUs: {gpus or 'none visible'}")
PY
if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "gpu_check: no GPU visible (torch.cuda.is_available() is false): the GPU parts are skipped, the CPU parts run"
  cpu_only=1
elif [ $cpu_only = 1 ]; then
  echo "gpu_check: --cpu-dry-run: the GPU parts are skipped, the CPU parts run"
fi

version=$("$PYTHON" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
if [ -d "$CARRY" ] && [ "$version" != 3.12 ]; then
  echo "gpu_check: $CARRY was packed for Python 3.12 (its stub and numpy), this is $version: not installed," \
       "this Python's own packages and backends/python/ are used"
elif [ -d "$CARRY" ]; then
  step "install the carry from $CARRY"
  "$PYTHON" tools/gpu_carry.py install --carry "$CARRY" --work "$WORK" || { echo "gpu_check: install failed"; exit 1; }
  # from here on the check's venv: numpy<2 (string tensors in the 2.51 stub) and the carried Triton first, then
  # this machine's packages; Triton's stubs take their packages from the first python3 on PATH, this one
  PYTHON="$PWD/$WORK/venv/bin/python"
fi
"$PYTHON" tools/gpu_carry.py stand-ins || failed+=("stand-ins")

step "gpu tests (tests/gpu/)"
# an exit status of 0 is not enough: a run in which every test skipped exits 0 too. The junit report is judged:
# nothing ran fails, and where a GPU is visible any skip fails (gpu_check.py --gpu-tests-report)
mkdir -p "$WORK"
junit="$WORK/gpu-tests.xml"
rm -f "$junit"
timeout 300 "$PYTHON" -m pytest tests/gpu --confcutdir tests/gpu -q -rs -p no:cacheprovider --junitxml "$junit" \
  || failed+=("gpu tests")
"$PYTHON" tools/gpu_check.py --gpu-tests-report "$junit" $([ $cpu_only = 1 ] && echo --cpu-only) \
  || failed+=("gpu tests: skipped or none ran")

step "Triton: the pipelines on KIND_CPU$([ $cpu_only = 0 ] && echo ' and on KIND_GPU')"
serve=1
if ! "$PYTHON" -c 'import sys, numpy; sys.exit(int(numpy.__version__.split(".")[0]) >= 2)'; then
  echo "gpu_check: numpy $("$PYTHON" -c 'import numpy; print(numpy.__version__)') here: Triton 2.51's stub fails on" \
       "string tensors with numpy 2 (carry numpy<2: tools/gpu_carry.py gather); Triton part skipped"
  serve=0
fi
if ! "$PYTHON" -c 'import pytriton' 2>/dev/null; then
  echo "gpu_check: no Triton (neither nvidia-pytriton nor the carry's): Triton part skipped"
  serve=0
fi
if ! "$PYTHON" - <<'PY'; then
import sys, sysconfig
from pathlib import Path
version = f"{sys.version_info.major}.{sys.version_info.minor}"
lib = Path(sysconfig.get_config_var("LIBDIR") or "") / f"libpython{version}.so.1.0"
if not lib.exists():
    sys.exit(f"gpu_check: {lib} is missing: Triton's Python stub embeds that library (a static Python build has none)")
PY
  serve=0
fi
if [ $serve = 1 ]; then
  timeout 420 "$PYTHON" tools/gpu_check.py $([ $cpu_only = 1 ] && echo --cpu-only) --load-seconds "$LOAD_SECONDS" \
    --work "$WORK" || failed+=("Triton pipelines")
  for log in "$WORK"/triton-*.log; do
    [ -f "$log" ] && grep -E " E[0-9]{4}|Traceback|Error" "$log" | head -n 5 | sed "s|^|$log: |"
  done
else
  failed+=("Triton not run")
fi

step "done"
if [ ${#failed[@]} = 0 ]; then
  echo "gpu_check: passed$([ $cpu_only = 1 ] && echo ' (CPU parts only: no GPU run)')"
else
  echo "gpu_check: failed: ${failed[*]}"
  exit 1
fi
