"""kvplan.stats: the one percentile and median every part uses, against hand values and the
standard library's definitions."""

import statistics

import pytest

from kvplan.stats import median, nearest_rank, percentile


def test_percentile_interpolates_between_ranks_like_numpy():
    # numpy.percentile([1, 2, 3, 4], 90, method="linear") = 3.7: position 0.9 x 3 = 2.7 -> 3 + 0.7 x (4 - 3)
    assert percentile([4, 1, 3, 2], 90) == pytest.approx(3.7)
    assert percentile([5], 99) == 5.0 and percentile([], 50) is None
    assert percentile([10, 20], 0) == 10 and percentile([10, 20], 100) == 20


@pytest.mark.parametrize("values", [[3], [1, 9], [7, 1, 4], [2.5, 1, 9, 4], list(range(101))])
def test_median_is_the_standard_librarys(values):
    assert median(values) == statistics.median(values)


def test_nearest_rank_and_empty_input():
    assert nearest_rank([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == 9
    with pytest.raises(ValueError):
        median([])


# ----------------------------------------------------------------------------- percentile intervals

def _binomial_below(n: int, p: float) -> list:
    """[P(B < k) for k = 0..n+1], B ~ Binomial(n, p), exactly: integer arithmetic over p's decimal fraction."""
    from fractions import Fraction
    from itertools import accumulate
    from math import comb

    f = Fraction(str(p))
    a, b = f.numerator, f.denominator
    terms = [comb(n, i) * a**i * (b - a) ** (n - i) for i in range(n + 1)]
    return [Fraction(c, b**n) for c in accumulate([0] + terms)]


@pytest.mark.parametrize("n, q", [(100, 50), (101, 50), (1000, 99), (400, 99), (50, 90), (800, 99.5)])
def test_the_interval_is_the_tightest_with_its_coverage(n, q):
    """[x_(l), x_(u)] with P(B < l) <= 2.5% < P(B < l + 1) and P(B >= u) <= 2.5% < P(B >= u - 1), from the
    binomial computed exactly here, on the values 1..n (so the bounds are their ranks)."""
    from kvplan.stats import quantile_interval

    low, high = quantile_interval(list(range(1, n + 1)), q)
    below = _binomial_below(n, q / 100)
    lo, hi = int(low), int(high)
    assert below[lo] <= 0.025 < below[lo + 1]
    assert 1 - below[hi] <= 0.025 < 1 - below[hi - 1]
    assert below[hi] - below[lo] >= 0.95  # the coverage


def test_textbook_median_interval_and_the_bounds_a_sample_cannot_give():
    from kvplan.stats import quantile_interval

    assert quantile_interval(list(range(1, 101)), 50) == (40.0, 61.0)  # the tabulated 95% interval for n = 100
    # an upper bound of a p99 needs P(all n below it) = 0.99^n <= 2.5%: 0.99^367 = 0.02501, 0.99^368 = 0.02476
    assert quantile_interval(list(range(1, 368)), 99)[1] is None
    assert quantile_interval(list(range(1, 369)), 99)[1] == 368.0
    assert quantile_interval([], 50) == (None, None) and quantile_interval([1.0], 50) == (None, None)


def test_a_p99_interval_narrows_as_the_requests_grow_on_recorded_itls():
    """Issue 27: recorded inter-token latencies of a real CPU-engine run (tests/data/recorded-itl-cpu-engine.json):
    the p99's interval from the first 400, 1,600 and 4,000 of them narrows, and holds the p99 of all 4,000."""
    import json
    from pathlib import Path

    from kvplan.stats import percentile, quantile_interval

    itl = json.loads((Path(__file__).parent / "data" / "recorded-itl-cpu-engine.json").read_text())["itl_ms"]
    assert len(itl) == 4000
    widths = []
    for n in (400, 1600, 4000):
        low, high = quantile_interval(itl[:n], 99)
        assert low is not None and high is not None and low <= percentile(itl[:n], 99) <= high
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2] > 0
    low, high = quantile_interval(itl, 99)
    assert low <= percentile(itl, 99) <= high
