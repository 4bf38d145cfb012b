"""The one definition of a percentile for every bench and tool, so that a p95 from one bench compares with
another's.

Method: numpy's default, linear interpolation between the two closest ranks (`np.percentile(..., method="linear")`,
type 7 of Hyndman & Fan, also what `statistics.median` and spreadsheets' PERCENTILE compute). It is kept because
it is numpy's default (any figure computed with plain numpy agrees with ours) and because it is smooth: on the
few hundred requests of a short window, a nearest-rank p95 jumps from one sample to the next as the count changes.

An empty sample has no percentile, mean or median: each is NaN (a bench prints "nan" for a level whose every
request failed, rather than stopping)."""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

METHOD = "linear"


def _array(values: Iterable[float]) -> np.ndarray:
    return np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)


def percentile(values: Iterable[float], p: float) -> float:
    """The p-th percentile (0-100) of `values`; NaN when there are none."""
    found = _array(values)
    return float(np.percentile(found, p, method=METHOD)) if found.size else math.nan


def percentiles(values: Iterable[float], ps: Iterable[float]) -> dict[float, float]:
    """{p: the p-th percentile} for each of `ps`, in one pass."""
    found, ps = _array(values), list(ps)
    if not found.size:
        return {p: math.nan for p in ps}
    return dict(zip(ps, (float(v) for v in np.percentile(found, ps, method=METHOD))))


def median(values: Iterable[float]) -> float:
    """The 50th percentile (NaN when there are none)."""
    return percentile(values, 50)


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean (NaN when there are none)."""
    found = _array(values)
    return float(found.mean()) if found.size else math.nan


def stdev(values: Iterable[float]) -> float:
    """The population standard deviation (perf_analyzer's "standard deviation"); NaN when there are none."""
    found = _array(values)
    return float(found.std()) if found.size else math.nan


def summary(values: Iterable[float], ps: Iterable[float] = (50, 95), scale: float = 1.0) -> dict[str, float]:
    """{"count", "mean", "stdev", "p50", "p95", ...} of `values`, each figure (count aside) times `scale`
    (1e3: seconds to milliseconds)."""
    found = _array(values)
    out = {"count": int(found.size), "mean": mean(found) * scale, "stdev": stdev(found) * scale}
    out.update({f"p{p:g}": v * scale for p, v in percentiles(found, ps).items()})
    return out
