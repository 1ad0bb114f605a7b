"""Results of other harnesses as kvplan bench summaries: ``vllm bench serve --save-result`` JSON.

What such a file can show: the latency percentiles it saved (``--metric-percentiles``, 99 by default,
plus mean and median) of TTFT, TPOT, ITL and E2E at one load (``max_concurrency`` closed-ish loop, or
``request_rate`` open loop with ``burstiness``), request and token throughput, vLLM's own goodput
when it was run with ``--goodput``. What it cannot show: preemptions, requests waiting for KV, KV
fill, the engine's KV pool (vLLM's client never reads /metrics), so no onset and no preemption
gate; nor per-request latencies unless saved with ``--save-detailed``; nor sample counts of ITL
(estimated as output tokens - completed requests).

One file is one point. A folder of such files is one sweep (a run), its points ordered by load.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError

VLLM_SOURCE = "vllm bench serve"
CAN_SHOW = ("TTFT/TPOT/ITL/E2E mean, median and saved percentiles", "request and output throughput", "load")
CANNOT_SHOW = ("preemptions", "KV waits and KV fill", "the engine's KV pool", "onsets")
_METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}


def is_vllm_result(data: Any) -> bool:
    return isinstance(data, dict) and "request_throughput" in data and any(
        k in data for k in ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_e2el_ms"))


def _num(data: dict, key: str) -> float | None:
    v = data.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def _stats(data: dict, name: str, n: int | None) -> dict[str, float | None]:
    ms = {"mean": _num(data, f"mean_{name}_ms"), "p50": _num(data, f"median_{name}_ms")}
    for q in ("50", "90", "95", "99"):
        v = _num(data, f"p{q}_{name}_ms")
        if v is not None:
            ms[f"p{q}"] = v
    out: dict[str, float | None] = {"n": n}
    for key in ("mean", "p50", "p90", "p95", "p99"):
        v = ms.get(key)
        out[key] = None if v is None else v / 1000
    return out


def vllm_point(data: dict, seq: int, file: str) -> Any:
    """One saved result -> a kvplan PointResult (mode rate when request_rate is finite)."""
    from kvplan.bench.runner import PointResult
    from kvplan.bench.stats import sample_warnings

    completed = int(_num(data, "completed") or 0)
    failed = int(_num(data, "failed") or 0)
    out_tokens = int(_num(data, "total_output_tokens") or 0)
    rate_raw = data.get("request_rate")
    rate = _num(data, "request_rate") if not isinstance(rate_raw, str) else None
    cap = data.get("max_concurrency")
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
    peak = data.get("max_concurrent_requests")
    peak = peak if isinstance(peak, int) and not isinstance(peak, bool) else None
    mode = "rate" if rate is not None else "concurrency"
    concurrency = cap or peak or 0
    if mode == "concurrency" and not concurrency:
        raise KvplanError(f"{file}: neither a finite request_rate nor max_concurrency: the load is unknown")
    stats = {m: _stats(data, name, completed if m != "itl" else max(0, out_tokens - completed))
             for m, name in _METRICS.items()}
    warnings = [w for label, m in (("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"), ("E2E", "e2e"))
                for w in sample_warnings(label, stats[m])]
    duration = _num(data, "duration") or 0.0
    goodput = _num(data, "request_goodput")
    return PointResult(
        seq=seq, concurrency=concurrency, status="failed" if failed or not completed else "ok",
        error=f"{failed} requests failed" if failed else (None if completed else "no request completed"),
        started_at=str(data.get("date") or ""), wall_s=round(duration, 4), first_index=0,
        requests=completed + failed, requests_ok=completed, requests_failed=failed, output_tokens=out_tokens,
        throughput_tok_s=_num(data, "output_throughput"), ttft=stats["ttft"], itl=stats["itl"], tpot=stats["tpot"],
        e2e=stats["e2e"], server={}, waited_for_kv=False, preempted=False, label="not measured",
        notes=[f"from {file} ({VLLM_SOURCE}): no server metrics, so no preemption, KV wait or KV fill"],
        mode=mode, rate=rate, burstiness=_num(data, "burstiness") if mode == "rate" else None,
        max_concurrency=cap if mode == "rate" else None, latency_from="sent (vllm bench serve: from each request's send)",
        request_throughput=_num(data, "request_throughput"), warnings=warnings, goodput_req_s=goodput,
    )


def read_vllm_results(path: Path) -> Any:
    """A saved result file, or a folder of them, as a BenchSummary (source ``vllm bench serve``)."""
    from kvplan.bench.runner import BenchSummary
    from kvplan.paths import load_user_json

    files = [path] if path.is_file() else sorted(path.glob("*.json"))
    results = []
    for f in files:
        try:
            data = load_user_json(f)
        except KvplanError:
            if path.is_file():
                raise
            continue
        if is_vllm_result(data):
            results.append((f, data))
    if not results:
        raise KvplanError(f"{path}: no `vllm bench serve --save-result` JSON found",
                          "pass a kvplan bench run folder, a saved vllm result, or a folder of them")
    points = [vllm_point(d, i, f.name) for i, (f, d) in enumerate(results)]
    modes = {p.mode for p in points}
    if len(modes) > 1:
        raise KvplanError(f"{path}: mixes request-rate and max-concurrency results", "keep one kind per folder")
    first = results[0][1]
    model = str(first.get("model_id") or first.get("tokenizer_id") or "unknown")
    points.sort(key=lambda p: p.load)
    return BenchSummary(
        status="complete", run_dir=str(path), mode="attach", base_url="", model=model,
        workload=f"{VLLM_SOURCE} ({first.get('backend') or first.get('endpoint_type') or '?'}, "
                 f"{int(_num(first, 'num_prompts') or 0)} prompts a point)",
        capacity={}, measured={}, points=points, load_mode=modes.pop(),
        load_description=f"{VLLM_SOURCE}: " + ("request rate" if points[0].mode == "rate" else "max concurrency")
        + " per file", latency_from="sent", source=VLLM_SOURCE,
    )
