"""The demo models train with the math libraries held to one instruction set (build/instruction_set.py),
so that `make model` trains the same bytes on every x86-64 CPU, and a model trained otherwise is
trained again."""
from __future__ import annotations

import importlib
import subprocess
import sys

from build import common, instruction_set
from build.common import trained, training_stamp
from model_configs import ROOT


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_pinned_before_torch_loads_holds_its_kernels_to_avx2():
    done = run_python("import os; from build import instruction_set; instruction_set.pin(); import torch; "
                      "print(torch.backends.cpu.get_cpu_capability(), os.environ['MKL_CBWR'])")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["AVX2", "COMPATIBLE,STRICT"]


def test_pinning_after_torch_is_loaded_is_refused():
    done = run_python("import torch; from build import instruction_set; instruction_set.pin()")
    assert done.returncode != 0 and "before torch is imported" in done.stderr


def test_make_model_trained_every_demo_model_pinned(monkeypatch):
    """The stamps `make model` wrote (in its training workers) are those of the pinned setting: the
    workers inherited it from build_models.py."""
    from build.build_models import TRAINED_BY

    monkeypatch.delenv(common.RETRAIN_ENV, raising=False)
    for name, value in instruction_set.PINNED.items():
        monkeypatch.setenv(name, value)
    modules = [importlib.import_module(f"build.{m}") for ms in TRAINED_BY.values() for m in ms]
    assert len(modules) == 5
    assert [m.NAME for m in modules if not common.trained_is_current(m)] == []


def test_the_stamp_changes_with_the_instruction_set(tmp_path, monkeypatch):
    code = tmp_path / "train_code.py"
    code.write_text("x = 1\n")
    for name, value in instruction_set.PINNED.items():
        monkeypatch.setenv(name, value)
    pinned = training_stamp([code])
    assert training_stamp([code]) == pinned
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    assert training_stamp([code]) != pinned
    monkeypatch.delenv("MKL_CBWR")
    assert training_stamp([code]) != pinned


def test_a_model_trained_on_another_instruction_set_is_trained_again(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(common, "TRAINED_DIR", tmp_path / "trained")
    monkeypatch.delenv(common.RETRAIN_ENV, raising=False)
    code = tmp_path / "train_code.py"
    code.write_text("x = 1\n")
    seen = []

    def train(dest):  # what the trainer runs under
        seen.append((torch.get_num_threads(), torch.backends.mkldnn.enabled))
        (dest / "weights.bin").write_bytes(b"%d" % len(seen))

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    trained("toy", train, [code])
    trained("toy", train, [code])
    assert len(seen) == 1
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert (trained("toy", train, [code]) / "weights.bin").read_bytes() == b"2"
    assert seen == [(1, False), (1, False)]
    assert torch.backends.mkldnn.enabled, "oneDNN is back on after training"
