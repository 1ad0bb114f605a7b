"""Small statistics every part shares (one definition each): percentiles as numpy's default, the
median, nearest-rank quantiles for error summaries, and the overhead fit's robust estimators. Pure;
no import of the statistics module (it costs `kvplan size` milliseconds of start-up)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), interpolated linearly between the closest ranks (numpy's default
    ``linear`` method); None without values."""
    return percentiles(values, (q,))[0]


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float | None]:
    """`percentile` at each of ``qs``, the values sorted once."""
    if not values:
        return [None] * len(qs)
    data = sorted(values)
    if len(data) == 1:
        return [float(data[0])] * len(qs)
    out: list[float | None] = []
    for q in qs:
        pos = (len(data) - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(data) - 1)
        out.append(float(data[lo] + (data[hi] - data[lo]) * (pos - lo)))
    return out


def percent_error(predicted: float, reported: float) -> float | None:
    """(predicted - reported) / reported in %, or None when the reported value is 0."""
    if reported == 0:
        return None
    return 100.0 * (predicted - reported) / reported


def median(values: Sequence[float]) -> float:
    """The middle value, or the mean of the two middle ones (as statistics.median)."""
    if not values:
        raise ValueError("no values")
    return percentile(values, 50)  # type: ignore[return-value]


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank method: the smallest value with at least q of the
    values at or below it. With 10 values, p90 is the 9th smallest; with 7, the largest."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The lower weighted median: the first value (ascending) at which the cumulative weight
    reaches half the total. It minimises sum(w_i * |v_i - m|)."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        raise ValueError("no positive weights")
    cumulative = 0.0
    for value, weight in pairs:
        cumulative += weight
        if cumulative >= total / 2:
            return float(value)
    return float(pairs[-1][0])


def lad_through_origin(x: Sequence[float], y: Sequence[float]) -> float:
    """The slope b minimising sum |y_i - b * x_i| (least absolute deviations, no intercept):
    since |y - b x| = x |y/x - b| for x > 0, it is the x-weighted median of the ratios y/x."""
    if any(v <= 0 for v in x):
        raise ValueError("x must be positive")
    return weighted_median([yi / xi for xi, yi in zip(x, y)], list(x))


def quantile_interval(values: Sequence[float], q: float, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """A distribution-free confidence interval for the q-th percentile (0-100) of the population the values were
    drawn from: the order statistics ``[x_(l), x_(u)]`` (1-based, sorted) with ``l`` the largest and ``u`` the
    smallest rank such that ``P(B < l) <= a/2`` and ``P(B >= u) <= a/2`` for ``B ~ Binomial(n, q/100)``, the
    count of values below the true percentile (a = 1 - confidence). Exact coverage without resampling, so the
    same values always give the same interval. None for a bound the sample cannot give: a p99 of fewer than 368
    values has no upper bound at 95% (0.99^n > 0.025: none of its values is surely above the true p99)."""
    n = len(values)
    p = q / 100.0
    if n == 0 or not 0.0 < p < 1.0:
        return None, None
    data = sorted(values)
    alpha = (1.0 - confidence) / 2.0
    # The binomial's mass beyond ~12 standard deviations of its mean is below 1e-30: sum only the window.
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    start, stop = max(0, math.floor(mean - 12 * sd - 1)), min(n, math.ceil(mean + 12 * sd + 1))
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    lower = upper = None
    below = 0.0  # P(B < k)
    for k in range(start, stop + 1):
        if below <= alpha:
            lower = k  # P(B < k) <= a/2: x_(k) is a lower bound (k >= 1)
        if upper is None and 1.0 - below <= alpha:
            upper = k  # P(B >= k) <= a/2: x_(k) is an upper bound (k <= n)
        below += math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
    low = data[lower - 1] if lower is not None and lower >= 1 else None
    high = data[upper - 1] if upper is not None and 1 <= upper <= n else None
    return (None if low is None else float(low)), (None if high is None else float(high))


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line: the median of the pairwise slopes (pairs of distinct x), and the
    median of ``y - slope x``. Robust: up to ~29% of the points can be anywhere (a request a stall delayed)."""
    slopes = _pairwise_slopes(points)
    if not slopes:
        raise ValueError("fewer than two distinct x")
    slope = median(slopes)
    return median([y - slope * x for x, y in points]), slope


def theil_sen_interval(points: Sequence[tuple[float, float]], confidence: float = 0.95) -> tuple[float, float]:
    """Sen's (1968) distribution-free confidence interval for the Theil-Sen slope: the pairwise slopes of ranks
    (N - C) / 2 and (N + C) / 2 + 1 (1-based, sorted), N the count of pairs of distinct x, C = z sqrt(Var S), Var S
    Kendall's S variance with ties in x, z the normal quantile of ``confidence`` (Hollander & Wolfe, Nonparametric
    Statistical Methods, 3rd ed., section 9.4). It assumes only residuals exchangeable and independent of x, so
    it widens as they grow against the span of x: few distinct or close x price the slope loosely."""
    from statistics import NormalDist

    points = _bounded(points)  # (the points the slopes are of: n below counts them)
    slopes = sorted(_pairwise_slopes(points))
    if not slopes:
        raise ValueError("fewer than two distinct x")
    n, total = len(points), len(slopes)
    ties: dict[float, int] = {}
    for x, _ in points:
        ties[x] = ties.get(x, 0) + 1
    var_s = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18.0
    c = NormalDist().inv_cdf(0.5 + confidence / 2.0) * math.sqrt(max(var_s, 0.0))
    lower = max(1, math.floor((total - c) / 2.0))
    upper = min(total, math.ceil((total + c) / 2.0) + 1)
    return slopes[lower - 1], slopes[upper - 1]


#: Pairs of points Theil-Sen compares at most (~1.1 M): beyond, an evenly spaced subsample of the points (bounded time).
MAX_THEIL_SEN_POINTS = 1500


def _bounded(points: Sequence[tuple[float, float]]) -> Sequence[tuple[float, float]]:
    """``points``, or an evenly spaced `MAX_THEIL_SEN_POINTS` of them."""
    if len(points) <= MAX_THEIL_SEN_POINTS:
        return points
    step = len(points) / MAX_THEIL_SEN_POINTS
    return [points[int(i * step)] for i in range(MAX_THEIL_SEN_POINTS)]


def _pairwise_slopes(points: Sequence[tuple[float, float]]) -> list[float]:
    points = _bounded(points)
    return [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 != x1]
