"""Service-level objectives: parsing ``ttft_p99=500ms,itl_p99=50ms,e2e_p99=10s`` (the same keys as
``slo:`` in kvplan.yaml), per-request and per-point checks, goodput.

A key is ``<metric>_<statistic>``: metric ``ttft``, ``itl``, ``tpot`` or ``e2e``; statistic ``p50``,
``p90``, ``p95``, ``p99`` or ``mean``. Values take ``us``, ``ms``, ``s`` or ``min``; a bare number is
milliseconds (as ``vllm bench serve --goodput``).

- A **point meets the SLOs** when each of its percentiles (over every completed request of the
  point, kvplan.bench.stats.percentile) is within its target.
- A **request meets the SLOs** when its own TTFT, E2E and TPOT are within every target of those
  metrics, and its own ITL percentile (over its tokens) is within the ITL target; ``goodput`` =
  requests meeting every SLO (and their output tokens) / the point's wall time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from kvplan.bench.results import SloResult
from kvplan.errors import KvplanError
from kvplan.stats import percentile

METRICS = ("ttft", "itl", "tpot", "e2e")
STATS = ("p50", "p90", "p95", "p99", "mean")
_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "": 1e-3}
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*$")


def parse_duration(value: object, what: str, bare_unit: str = "ms") -> float:
    """'500ms' -> 0.5 (seconds); a bare number is ``bare_unit``."""
    if isinstance(value, bool):
        raise KvplanError(f"invalid {what}: {value!r}", "use a duration: 500ms, 2s")
    if isinstance(value, (int, float)):
        text = f"{value}{bare_unit}"
    else:
        text = str(value)
    m = _VALUE.match(text.lower())
    unit = m.group(2) if m else None
    if m is None or unit not in _UNITS:
        raise KvplanError(f"invalid {what}: {text!r:.80}", "use a duration: 500ms, 2s, 1.5min")
    seconds = float(m.group(1)) * (_UNITS[bare_unit] if unit == "" else _UNITS[unit])
    if not math.isfinite(seconds) or seconds <= 0 or seconds > 7 * 86400:
        raise KvplanError(f"invalid {what}: {text!r:.80} must be above 0 and at most a week")
    return seconds


def check_key(key: str) -> str:
    k = str(key).strip().lower()
    metric, _, stat = k.rpartition("_")
    if metric == "e2el":
        metric = "e2e"
    if metric not in METRICS or stat not in STATS:
        raise KvplanError(f"invalid SLO key {key!r:.60}",
                          "use <metric>_<statistic>: ttft, itl, tpot or e2e with p50, p90, p95, p99 or mean "
                          "(ttft_p99=500ms)")
    return f"{metric}_{stat}"


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft_p99=500ms,e2e_p99=10s' -> {'ttft_p99': 0.5, 'e2e_p99': 10.0} (seconds)."""
    out: dict[str, float] = {}
    if not text or not text.strip():
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise KvplanError(f"invalid --slo part {part.strip()!r:.60}", "use key=value: ttft_p99=500ms")
        name = check_key(key)
        out[name] = parse_duration(value.strip(), f"SLO {name}")
    return out


def slo_from_mapping(data: Mapping[str, object]) -> dict[str, float]:
    """kvplan.yaml's ``slo:`` mapping -> seconds."""
    return {check_key(k): parse_duration(v, f"slo {k}") for k, v in data.items()}


def describe_slo(slo: Mapping[str, float]) -> str:
    return ", ".join(f"{k} <= {fmt_s(v)}" for k, v in slo.items())


def fmt_s(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 10 else f"{seconds * 1000:g} ms"


def request_meets(rec, slo: Mapping[str, float]) -> bool:
    """Does one completed request (a loadgen.RequestRecord) meet every target?"""

    if not rec.ok:
        return False
    for key, target in slo.items():
        metric, _, stat = key.rpartition("_")
        if metric == "itl":
            gaps = rec.itl_s
            if not gaps:
                continue
            value = sum(gaps) / len(gaps) if stat == "mean" else percentile(gaps, float(stat[1:]))
        else:
            value = {"ttft": rec.ttft_s, "tpot": rec.tpot_s, "e2e": rec.e2e_s}[metric]
            if value is None:
                if metric == "tpot":
                    continue  # one output token: no TPOT to hold against a target
                return False
        if value is None or value > target:
            return False
    return True


def _stat(stats: object, name: str) -> float | None:
    if stats is None:
        return None
    if isinstance(stats, Mapping):
        return stats.get(name)
    return stats.stat(name)  # kvplan.bench.results.LatencyStats


def slo_results(stats: Mapping[str, object], slo: Mapping[str, float]) -> dict:
    """SLO key -> kvplan.bench.results.SloResult (target, value, met) of a point's latencies
    (metric name -> LatencyStats, or a mapping with the same keys)."""

    out = {}
    for key, target in slo.items():
        metric, _, stat = key.rpartition("_")
        value = _stat(stats.get(metric), stat)
        out[key] = SloResult(target=target, value=value, met=None if value is None else value <= target)
    return out


def point_checks(stats: Mapping[str, object], slo: Mapping[str, float]) -> dict[str, dict]:
    """{key: {"target": s, "value": s | None, "met": bool | None}}: slo_results as plain mappings."""
    return {key: r.model_dump() for key, r in slo_results(stats, slo).items()}
