#!/usr/bin/env bash
# Creates .venv with every dependency and the Python backend runtime in backends/python/.
# Idempotent: a re-run with unchanged requirements only checks a stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
stamp_of() { cat requirements.txt constraints.txt launcher/setup.sh | sha256sum | cut -d' ' -f1; }
want=$(stamp_of)

if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$want" ] \
   && [ -x backends/python/triton_python_backend_stub ]; then
  echo "setup: .venv is up to date"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
echo "setup: installing torch==2.13.0 (CPU wheel) first"
"$PIP" install --quiet torch==2.13.0
echo "setup: installing the rest in one resolver run"
"$PIP" install --quiet -c constraints.txt -r requirements.txt
"$PIP" check

# The Python backend (library, stub for this interpreter, utils) ships inside the nvidia-pytriton wheel.
"$VENV/bin/python" - <<'PY'
import shutil, sys
from pathlib import Path
import pytriton
root = Path(pytriton.__file__).parent / "tritonserver"
dest = Path("backends/python")
dest.mkdir(parents=True, exist_ok=True)
for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
    shutil.copy2(root / "backends" / "python" / name, dest / name)
stub = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub"
shutil.copy2(stub, dest / stub.name)
print(f"setup: Python backend runtime copied to {dest}/")
PY
echo "$want" > "$VENV/.setup-stamp"
echo "setup: done"
