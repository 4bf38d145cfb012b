"""bench/stats.py: the one definition of a percentile (numpy's linear interpolation), and no other computed
anywhere in bench/ or tools/."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from bench import stats

ROOT = Path(__file__).resolve().parent.parent
VALUES = [0.012, 0.003, 0.250, 0.041, 0.007, 0.019, 0.102, 0.008, 0.033, 0.015, 0.011]


@pytest.mark.parametrize("p", [0, 5, 25, 50, 90, 95, 99, 100])
def test_percentiles_are_numpys_default(p):
    assert stats.percentile(VALUES, p) == pytest.approx(float(np.percentile(VALUES, p)), abs=1e-15)


def test_linear_interpolation_between_ranks():
    ten = list(range(1, 11))
    assert stats.percentile(ten, 95) == pytest.approx(9.55)  # nearest rank would say 10
    assert stats.percentile(ten, 50) == stats.median(ten) == 5.5
    assert stats.percentiles(ten, (50, 90)) == {50: 5.5, 90: pytest.approx(9.1)}
    assert stats.median(iter([3.0, 1.0, 2.0])) == 2.0  # any iterable


def test_an_empty_sample_is_nan():
    assert math.isnan(stats.percentile([], 50)) and math.isnan(stats.median([])) and math.isnan(stats.mean([]))
    assert all(math.isnan(v) for v in stats.percentiles([], (50, 95)).values())


def test_summary():
    s = stats.summary([0.001, 0.002, 0.003, 0.004], scale=1e3)
    assert s["count"] == 4 and s["mean"] == pytest.approx(2.5) and s["p50"] == pytest.approx(2.5)
    assert s["p95"] == pytest.approx(3.85) and s["stdev"] == pytest.approx(np.std([1, 2, 3, 4]))


# a percentile or median computed any other way: numpy's or the statistics module's own, or an index into a
# sorted sample (the nearest-rank forms: sorted(x)[int(q * len(x))], values[min(len(values) - 1, ...)])
OTHER_WAYS = re.compile(r"np\.(percentile|quantile|median|nanpercentile)\(|numpy\.(percentile|quantile|median)\("
                        r"|statistics\.(median\w*|quantiles)\(|\[\s*min\(\s*len\(|\[\s*int\([^]]*len\(")


def test_no_percentile_is_computed_outside_bench_stats():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("bench", "tools") for path in sorted((ROOT / folder).rglob("*.py"))
             if path != ROOT / "bench" / "stats.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if OTHER_WAYS.search(line)]
    assert not found, "compute percentiles with bench/stats.py:\n" + "\n".join(found)


def test_the_check_sees_each_other_way():
    for line in ("p95 = np.percentile(lat, 95)", "statistics.median(xs)", "gaps[min(len(gaps) - 1, int(q * n))]",
                 "values[int(0.95 * len(values))]", "np.median(a)"):
        assert OTHER_WAYS.search(line), line
    assert not OTHER_WAYS.search("stats.percentile(lat, 95)")
