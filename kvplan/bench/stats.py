"""Percentiles and per-point latency statistics (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence

QUANTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default ``linear`` method)."""
    if not values:
        return None
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def describe(values: Sequence[float]) -> dict[str, float | None]:
    """{"mean", "p50", "p90", "p95", "p99", "n"} of a list of seconds (None when empty)."""
    out: dict[str, float | None] = {"n": len(values), "mean": (sum(values) / len(values)) if values else None}
    for q in QUANTILES:
        out[f"p{q}"] = percentile(values, q)
    return out
