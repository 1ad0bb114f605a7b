"""Per-point latency statistics (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvplan.stats import percentile, quantile_interval

if TYPE_CHECKING:
    from kvplan.bench.results import LatencyStats

QUANTILES = (50, 90, 95, 99)


#: The percentiles whose 95% confidence interval a point carries.
INTERVALS = (50, 99)


def describe(values: Sequence[float], chosen: Sequence[float] = ()) -> dict[str, object]:
    """{"mean", "p50", "p90", "p95", "p99", "n", "p50_ci", "p99_ci"} of a list of seconds (None when empty), and
    ``chosen`` percentiles as {"chosen": {"p99.9": ...}}; a bench point holds them as
    kvplan.bench.results.LatencyStats (LatencyStats.of)."""
    out: dict[str, object] = {"n": len(values), "mean": (sum(values) / len(values)) if values else None}
    for q in QUANTILES:
        out[f"p{q}"] = percentile(values, q)
    if values:  # an empty point keeps only the keys it always had
        for q in INTERVALS:
            out[f"p{q}_ci"] = quantile_interval(values, q)
        if chosen:
            data = sorted(values)
            out["chosen"] = {percentile_name(q): percentile(data, q) for q in chosen}
    return out


def percentile_name(q: float) -> str:
    """99.9 -> "p99.9", 50 -> "p50"."""
    return f"p{q:g}"


def min_samples(q: float) -> int:
    """Fewest samples for which a q-th percentile is not just the largest (or smallest) sample:
    100 for p99, 20 for p95, 10 for p90, 2 for p50."""
    tail = min(q, 100 - q)
    return 2 if tail <= 0 else max(2, math.ceil(100 / tail - 1e-9))


def sample_warnings(name: str, stats: LatencyStats) -> list[str]:
    """One line per percentile of ``stats`` that rests on too few samples."""
    n = stats.count
    if n == 0:
        return []
    low = [q for q in QUANTILES if stats.stat(f"p{q}") is not None and n < min_samples(q)]
    if not low:
        return []
    worst = max(low)
    return [f"{name} p{worst} rests on {n} sample{'s' if n != 1 else ''} (a p{worst} needs >= {min_samples(worst)}): "
            f"it is close to the largest sample; raise --requests or --duration"]
