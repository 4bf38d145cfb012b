"""tools/gpu_check.sh's judgement of the gpu tests' run (tools/gpu_check.py --gpu-tests-report), on any machine:
an exit status of 0 is not a pass when every test skipped, and where a GPU is visible no test may skip."""
from __future__ import annotations

import sys

import pytest

from tools import gpu_check

PASSED = '<testcase classname="tests.gpu.test_gpu_stages" name="test_clip_features_on_cuda_equal_cpu" time="1.0" />'
UNIT = '<testcase classname="tests.gpu.test_gpu_helpers_unit" name="test_first_difference" time="0.0" />'
SKIPPED = ('<testcase classname="tests.gpu.test_gpu_stages" name="test_food_labels_on_cuda_equal_cpu[onnx]" time="0">'
           '<skipped type="pytest.skip" message="onnxruntime 1.32.0 has no CUDAExecutionProvider">skip</skipped>'
           '</testcase>')
FAILED = ('<testcase classname="tests.gpu.test_gpu_codegen" name="test_greedy_codegen_tokens_on_cuda_equal_cpu">'
          '<failure message="not a near tie">...</failure></testcase>')


def report(tmp_path, *cases: str):
    """A pytest --junitxml report holding `cases`."""
    path = tmp_path / "gpu-tests.xml"
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
                    f'<testsuite name="pytest" tests="{len(cases)}">{"".join(cases)}</testsuite></testsuites>')
    return path


def test_a_run_in_which_nothing_ran_fails_with_or_without_a_gpu(tmp_path):
    for gpu_visible in (True, False):
        assert gpu_check.gpu_tests_verdict(report(tmp_path), gpu_visible) == (
            False, "no gpu test ran (0 passed, 0 failed, 0 skipped)")
        passed, summary = gpu_check.gpu_tests_verdict(report(tmp_path, SKIPPED, SKIPPED), gpu_visible)
        assert not passed and summary.startswith("no gpu test ran (0 passed, 0 failed, 2 skipped)")
    assert gpu_check.gpu_tests_verdict(tmp_path / "missing.xml", True)[0] is False


def test_with_a_gpu_visible_any_skip_fails_and_says_why(tmp_path):
    passed, summary = gpu_check.gpu_tests_verdict(report(tmp_path, PASSED, UNIT, SKIPPED), gpu_visible=True)
    assert not passed
    assert summary.startswith("2 passed, 0 failed, 1 skipped: a GPU is visible, so none may skip")
    assert "test_food_labels_on_cuda_equal_cpu[onnx]: onnxruntime 1.32.0 has no CUDAExecutionProvider" in summary
    assert gpu_check.gpu_tests_verdict(report(tmp_path, PASSED, UNIT), gpu_visible=True) == (
        True, "2 passed, 0 failed, 0 skipped")


def test_without_a_gpu_the_skips_pass_when_something_ran_and_failures_fail(tmp_path):
    assert gpu_check.gpu_tests_verdict(report(tmp_path, UNIT, SKIPPED), gpu_visible=False)[0]
    assert not gpu_check.gpu_tests_verdict(report(tmp_path, UNIT, FAILED), gpu_visible=False)[0]


@pytest.mark.parametrize("cpu_only, status", [([], 1), (["--cpu-only"], 0)])
def test_the_command_line_gpu_check_sh_runs(tmp_path, monkeypatch, capsys, cpu_only, status):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--gpu-tests-report", str(report(tmp_path, UNIT, SKIPPED)),
                                      *cpu_only])
    assert gpu_check.main() == status
    assert capsys.readouterr().out.startswith(f"gpu tests: {'passed' if status == 0 else 'FAILED'}: 1 passed")


def test_triton_s_own_view_of_the_placement_must_be_kind_gpu():
    """The instance groups of a model's config as Triton serves it (GET /v2/models/<model>/config)."""
    on_gpu = {"name": "ner_tagger", "instance_group": [{"name": "ner_tagger_0", "kind": "KIND_GPU", "count": 1,
                                                         "gpus": [0]}]}
    assert gpu_check.gpu_placement_problem(on_gpu) is None
    on_cpu = {"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}, {"kind": "KIND_CPU", "count": 2}]}
    assert gpu_check.gpu_placement_problem(on_cpu) == \
        "Triton placed instance group(s) on KIND_CPU gpus [], not KIND_GPU"
    assert gpu_check.gpu_placement_problem({"instance_group": [{"kind": "KIND_GPU", "gpus": []}]}).endswith(
        "KIND_GPU gpus [], not KIND_GPU")
    assert gpu_check.gpu_placement_problem({"error": "no such model"}).startswith("Triton's config shows no instance")
