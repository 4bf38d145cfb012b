"""bench/paired.py: what paired rounds can decide (the 95% interval of per-round differences)."""
from __future__ import annotations

import math
import statistics

from bench.paired import interval, verdict


def test_interval_of_paired_rounds():
    mean, half = interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and math.isclose(half, 4.30 * 1.0 / 3 ** 0.5)  # t(2 dof) x sd / sqrt(n)
    assert interval([0.5, 0.5, 0.5, 0.5]) == (0.5, 0.0)  # identical rounds: the run decides exactly
    assert interval([0.2]) == (0.2, math.inf)  # one round says nothing about its spread
    wide, narrow = interval([-9.8, 1.2, -6.7, 9.6])[1], interval([0.1, 0.2, 0.15, 0.25])[1]
    assert wide > 0.3 > narrow  # a 0.3 ms goal: undecidable from the first rounds, decided by the second
    # many rounds: t for their own degrees of freedom (12 rounds: 2.20), and past the table t(30), not 1.96
    assert math.isclose(interval([0.0, 1.0] * 6)[1], 2.20 * statistics.stdev([0.0, 1.0] * 6) / 12 ** 0.5)
    assert math.isclose(interval([0.0, 1.0] * 50)[1], 2.04 * statistics.stdev([0.0, 1.0] * 50) / 100 ** 0.5)


def test_verdicts():
    assert verdict([0.95, 0.96, 0.94, 0.95], 0.9, higher_is_better=True) == "met"
    assert verdict([0.85, 0.86, 0.84], 0.9, higher_is_better=True) == "missed"
    assert verdict([0.85, 0.95, 0.90], 0.9, higher_is_better=True) == "not decided"
    assert verdict([0.7, 0.8, 0.9], 1.5, higher_is_better=False) == "met"  # added ms: lower is better
    assert verdict([2.0, 2.1, 1.9], 1.5, higher_is_better=False) == "missed"
