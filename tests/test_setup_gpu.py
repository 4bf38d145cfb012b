"""`make setup` and `make setup GPU=1` (launcher/setup.sh) run against a fake venv whose pip only records what it
is asked: the CPU path's commands and stamp stay as they were; GPU=1 swaps in requirements-gpu.txt, drops the CPU
ONNX Runtime, refuses a CPU-only torch, and has a stamp of its own."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = ("launcher/setup.sh", "requirements.txt", "constraints.txt", "requirements-gpu.txt", "pyproject.toml")

FAKE_PIP = """#!/usr/bin/env bash
here=$(dirname "$0")
echo "$*" >> "$here/../../pip.log"
if [ "$1" = show ]; then grep -qx "${@: -1}" "$here/../installed" ; exit; fi
if [ "$1" = uninstall ]; then grep -vx "${@: -1}" "$here/../installed" > "$here/../installed.new" || true;
  mv "$here/../installed.new" "$here/../installed"; fi
exit 0
"""
# python -c '...torch.version.cuda...' answers as FAKE_TORCH_CUDA says; the backend copy (python -) is skipped
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = - ]; then cat > /dev/null; exit 0; fi
case "$2" in
  *torch.__version__*) echo 2.13.0+cpu ;;
  *torch.version.cuda*) [ "${FAKE_TORCH_CUDA:-1}" = 1 ] ;;
esac
"""


@pytest.fixture
def tree(tmp_path):
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("pip", FAKE_PIP), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / ".venv" / "installed").write_text("torch\nonnxruntime\n")
    stub = tmp_path / "backends" / "python" / "triton_python_backend_stub"
    stub.parent.mkdir(parents=True)
    stub.write_text("")
    stub.chmod(0o755)
    return tmp_path


def run_setup(tree: Path, gpu: str | None = None, torch_cuda: str = "1") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GPU"}
    env["FAKE_TORCH_CUDA"] = torch_cuda
    if gpu is not None:
        env["GPU"] = gpu
    (tree / "pip.log").write_text("")
    return subprocess.run(["bash", "launcher/setup.sh"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=60)


# the OpenVINO export tools, off .venv's path, on both paths alike (launcher/setup.sh)
EXPORT_TOOLS = ("install --quiet --no-deps --target .export-tools -c constraints.txt optimum-intel==2.2.0 optimum==2.3.0 "
                "nncf==3.4.0 ninja==1.13.2 pydot==4.0.1")


def pip_calls(tree: Path) -> list[str]:
    return (tree / "pip.log").read_text().splitlines()


def stamp(tree: Path) -> str:
    return (tree / ".venv" / ".setup-stamp").read_text().strip()


def cpu_stamp_formula(tree: Path) -> str:
    """The CPU stamp: requirements.txt, constraints.txt, pyproject.toml (the editable install of the tree) and
    setup.sh, nothing GPU."""
    return hashlib.sha256(b"".join((tree / n).read_bytes() for n in
                                   ("requirements.txt", "constraints.txt", "pyproject.toml",
                                    "launcher/setup.sh"))).hexdigest()


def test_cpu_path_commands_and_stamp_are_the_plain_ones(tree):
    done = run_setup(tree)
    assert done.returncode == 0, done.stderr
    assert pip_calls(tree) == ["show --quiet onnxruntime-gpu", "install --quiet torch==2.13.0",
                               "install --quiet -c constraints.txt -r requirements.txt", "check", EXPORT_TOOLS]
    assert stamp(tree) == cpu_stamp_formula(tree)
    (tree / "requirements-gpu.txt").write_text("# edited\n")
    assert run_setup(tree).stdout.strip() == "setup: .venv is up to date", "requirements-gpu.txt is not in it"


def test_gpu_path_swaps_onnxruntime_for_the_gpu_build_with_its_own_stamp(tree):
    assert run_setup(tree).returncode == 0
    cpu = stamp(tree)
    done = run_setup(tree, gpu="1")
    assert done.returncode == 0, done.stderr
    calls = pip_calls(tree)
    assert calls == ["show --quiet onnxruntime", "uninstall --quiet --yes onnxruntime",
                     "install --quiet -c constraints.txt -r requirements-gpu.txt",
                     "install --quiet -c constraints.txt -r .venv/requirements-without-onnxruntime.txt "
                     "-r requirements-gpu.txt", "check", EXPORT_TOOLS]
    kept = (tree / ".venv" / "requirements-without-onnxruntime.txt").read_text().splitlines()
    original = (tree / "requirements.txt").read_text().splitlines()
    assert "onnxruntime" in original and "onnxruntime" not in kept
    assert [line for line in original if line != "onnxruntime"] == kept
    assert stamp(tree) != cpu
    assert run_setup(tree, gpu="1").stdout.strip() == "setup: .venv is up to date"
    assert run_setup(tree).returncode == 0 and stamp(tree) == cpu, "back to CPU installs again"


def test_the_tree_itself_is_installed_editable_when_it_is_there(tree):
    """An image's dependency layer runs setup.sh before the tree is copied in (no editable install then); a
    checkout has the tree, and setup installs it editable so every room and stage imports by its name."""
    (tree / "gateway").mkdir()
    (tree / "backends" / "stage_common").mkdir(parents=True)
    assert run_setup(tree).returncode == 0
    calls = pip_calls(tree)
    assert calls[-4:-2] == ["install --quiet setuptools>=68", "install --quiet --no-deps --no-build-isolation -e ."]
    assert calls[-2:] == ["check", EXPORT_TOOLS]


def test_gpu_path_refuses_a_cpu_only_torch(tree):
    done = run_setup(tree, gpu="1", torch_cuda="0")
    assert done.returncode == 1
    assert "GPU=1 but pip installed a CPU-only torch (2.13.0+cpu)" in done.stderr
    assert "uninstall --quiet --yes torch" in pip_calls(tree), "a CPU torch already there is dropped first"
    assert not (tree / ".venv" / ".setup-stamp").exists()


def test_gpu_requirements_pin_cuda_builds_for_every_supported_python():
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements-gpu.txt").read_text().splitlines()]
    pins = [line for line in lines if line]
    assert "torch==2.13.0" in pins and "torch==2.13.0" in (ROOT / "constraints.txt").read_text()
    assert 'onnxruntime-gpu[cuda,cudnn]==1.31.1; python_version >= "3.11"' in pins
    assert 'onnxruntime-gpu[cuda,cudnn]==1.23.2; python_version < "3.11"' in pins
