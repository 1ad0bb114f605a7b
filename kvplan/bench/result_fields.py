"""The numbers of another harness's result file, as kvplan takes them: a finite, non-negative number, or a whole
count from 1 to MAX_COUNT; anything else (a string, a bool, NaN, 1e308, 400 digits) is None, never a figure."""

from __future__ import annotations

import math
from typing import Any

#: The largest count (requests, tokens, concurrency) a result file may claim: past it, the figure is a lie.
MAX_COUNT = 10**12


def number(data: Any, key: str) -> float | None:
    """``data[key]`` as a finite number >= 0; None when ``data`` is not a dict or the value is not one."""
    v = data.get(key) if isinstance(data, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:  # an integer past float's range
        return None
    return v if math.isfinite(v) and v >= 0 else None


def count(data: Any, key: str) -> int | None:
    """``data[key]`` as a whole count, 1 to MAX_COUNT; None otherwise."""
    v = data.get(key) if isinstance(data, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_COUNT else None
