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
