"""What a run of paired rounds can decide: the mean of per-round differences (or ratios) between two
contenders measured in the same round, and the half-width of its 95% interval (Student's t). A goal
narrower than the interval is one the run cannot show met or missed; the benches say so."""
from __future__ import annotations

import statistics

# Student's t at 97.5% for n - 1 degrees of freedom (n rounds); past 30, t(30) itself: a little wide, never
# narrower than the truth (t falls towards 1.96), so a longer run cannot read as more decided than it is
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
        12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09, 20: 2.09, 21: 2.08, 22: 2.07,
        23: 2.07, 24: 2.06, 25: 2.06, 26: 2.06, 27: 2.05, 28: 2.05, 29: 2.05, 30: 2.04}


def interval(deltas: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval) of per-round paired differences."""
    mean = statistics.mean(deltas)
    if len(deltas) < 2:
        return mean, float("inf")
    return mean, T975.get(len(deltas) - 1, T975[30]) * statistics.stdev(deltas) / len(deltas) ** 0.5


def verdict(deltas: list[float], goal: float, higher_is_better: bool) -> str:
    """'met', 'missed' or 'not decided' for a goal of `goal` or better, from the rounds' 95% interval."""
    mean, half = interval(deltas)
    low, high = mean - half, mean + half
    if (low >= goal) if higher_is_better else (high <= goal):
        return "met"
    if (high < goal) if higher_is_better else (low > goal):
        return "missed"
    return "not decided"
