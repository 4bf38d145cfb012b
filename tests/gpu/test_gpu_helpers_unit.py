"""The gpu tier's own helpers, on any machine: where greedy tokens part, and when that is kernel noise."""
from __future__ import annotations

import numpy as np
import pytest

from gpu_helpers import check_tokens, divergence, first_difference


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_flip_within_kernel_noise_is_a_near_tie_and_is_reported():
    cpu, gpu = np.array([0.0, 9.99999, 10.0]), np.array([0.0, 10.00001, 9.99999])
    near_tie, report = divergence(1, [7, 2], [7, 1], cpu, gpu)
    assert near_tie
    assert report.startswith("tokens part at position 1: cpu 2, gpu 1; largest logit difference there 2.00e-05")
    assert "cpu logits [2]=10.000000 [1]=9.999990" in report and "gpu logits [2]=9.999990 [1]=10.000010" in report
    with pytest.warns(UserWarning, match="near tie"):
        check_tokens("row", [7, 2], [7, 1], lambda position: (cpu, gpu))


def test_a_flip_beyond_kernel_noise_fails_with_the_report():
    cpu, gpu = np.array([0.0, 9.0, 10.0]), np.array([0.0, 10.0, 9.5])
    assert not divergence(1, [7, 2], [7, 1], cpu, gpu)[0]
    with pytest.raises(pytest.fail.Exception, match=r"row: tokens part at position 1: cpu 2, gpu 1"):
        check_tokens("row", [7, 2], [7, 1], lambda position: (cpu, gpu))
    check_tokens("row", [7, 2], [7, 2], lambda position: pytest.fail("equal tokens need no logits"))


def test_a_sequence_ending_early_is_reported_with_a_missing_token():
    near_tie, report = divergence(2, [7, 2], [7, 2, 5], np.zeros(8), np.zeros(8))
    assert near_tie and "cpu None, gpu 5" in report and "[None]=-" in report
