"""AIPerf's results (https://github.com/ai-dynamo/aiperf) as a kvplan bench summary: one point per run, from its
``profile_export_aiperf.json`` (a file, a run's artifact folder, or a folder of such folders: a sweep).

Their shape: ``JsonExportData`` in aiperf/common/models/export_models.py@0.13.0 (schema_version 1.4): one
``JsonMetricResult`` per metric (``unit``, ``avg``, ``p1`` ... ``p99``, ``min``, ``max``, ``std``, ``count``),
e.g. ``time_to_first_token`` and ``request_latency`` in ms, ``request_count`` and ``error_request_count`` in requests,
``output_token_throughput`` in tokens/sec, ``benchmark_duration`` in sec; and the ``input_config`` it ran with, whose
``profiling`` phase (aiperf/config, 0.13) says the load: ``type`` ``concurrency`` with ``concurrency``, or
``poisson`` / ``constant`` with ``rate`` (older AIPerf: ``loadgen.concurrency`` / ``loadgen.request_rate``, as
llm-d-benchmark's native_to_br0_2.py import_aiperf reads it).

AIPerf's ``inter_token_latency`` is one figure a request, (request latency - TTFT) / (output tokens - the first
chunk's): kvplan's TPOT (aiperf/metrics/types/inter_token_latency_metric.py). kvplan's ITL (every gap a token) is not
in the file: ``inter_chunk_latency`` is a gap a chunk, and a chunk may carry several tokens.

AIPerf scrapes the server's /metrics during the run (on by default): its ``server_metrics_export.json`` beside the
results gives the increase of ``vllm:num_preemptions`` over the profiling phase (``CounterStats.total``,
aiperf/common/models/server_metrics_models.py), which a counter keeps between scrapes. Its gauges are not read: it
samples them a few times a second, and the shipped sample (tests/bench/data/aiperf/concurrency-2) says a peak
``vllm:kv_cache_usage_perc`` of 0.0 for a run whose two requests at once held 6 of the pool's 16 blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.bench.result_fields import MAX_COUNT, count, number
from kvplan.bench.results import BenchSummary, LatencyStats, PointResult, ServerFigures
from kvplan.bench.stats import sample_warnings
from kvplan.errors import KvplanError
from kvplan.paths import load_user_json

SOURCE = "AIPerf"
CAN_SHOW = ("TTFT/TPOT/E2E mean and percentiles", "request and output throughput", "load (concurrency or request rate)",
            "preemptions, when it scraped the server's /metrics")
CANNOT_SHOW = ("ITL per token (its inter-token latency is per request: kvplan's TPOT)", "KV waits",
               "peak KV usage (its gauges are sampled too sparsely)", "the engine's KV pool", "onsets")
RESULT_FILE = "profile_export_aiperf.json"
SERVER_METRICS_FILE = "server_metrics_export.json"
#: A JSONMetricResult's unit -> seconds per unit.
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}
_METRICS = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "e2e": "request_latency"}
_RATE_TYPES = ("poisson", "constant", "request_rate", "gamma")


def is_aiperf_result(data: Any) -> bool:
    """AIPerf's ``profile_export_aiperf.json``: the config it ran with and a request-count or latency metric with its
    unit."""
    return isinstance(data, dict) and isinstance(data.get("input_config"), dict) and any(
        isinstance(data.get(k), dict) and "unit" in data[k] for k in ("request_count", "request_latency"))


def result_files(folder: Path) -> list[Path]:
    """The folder's own result, else those of the folders in it (a sweep: one artifact folder a run)."""
    own = folder / RESULT_FILE
    return [own] if own.is_file() else sorted(folder.glob(f"*/{RESULT_FILE}"))


def _stats(metric: Any, n: int | None) -> LatencyStats:
    """One JsonMetricResult as a LatencyStats in seconds; empty when its unit is not a time kvplan knows."""
    if not isinstance(metric, dict) or metric.get("unit") not in _SECONDS or number(metric, "avg") is None:
        return LatencyStats()
    scale = _SECONDS[metric["unit"]]
    values = {k: number(metric, src) for k, src in (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p95", "p95"),
                                                   ("p99", "p99"))}
    return LatencyStats(n=count(metric, "count") or n, **{k: None if v is None else v * scale for k, v in values.items()})


def _load(config: dict) -> tuple[str, int | None, float | None, str]:
    """(mode, concurrency, rate, arrival) of the profiling phase (AIPerf 0.13), else of ``loadgen`` (older)."""
    phases = config.get("phases") if isinstance(config.get("phases"), list) else []
    profiling = next((p for p in phases if isinstance(p, dict) and p.get("kind") == "profiling"), None)
    if profiling is not None:
        kind = str(profiling.get("type") or "")
        rate = number(profiling, "rate") if kind in _RATE_TYPES else None
        cap = count(profiling, "concurrency")
        return ("rate" if rate else "concurrency"), cap, rate, kind
    loadgen = config.get("loadgen") if isinstance(config.get("loadgen"), dict) else {}
    rate = number(loadgen, "request_rate")
    return ("rate" if rate else "concurrency"), count(loadgen, "concurrency"), rate, "request_rate" if rate else "concurrency"


def _server(folder: Path) -> ServerFigures:
    """Preemptions over the profiling phase, from AIPerf's server metrics export beside the results."""
    path = folder / SERVER_METRICS_FILE
    data = load_user_json(path) if path.is_file() else None
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, dict):
        return ServerFigures()

    def series(name: str) -> list[dict]:
        entry = metrics.get(name)
        found = entry.get("series") if isinstance(entry, dict) else None
        return [s.get("stats") for s in found or [] if isinstance(s, dict) and isinstance(s.get("stats"), dict)]

    totals = [t for t in (number(s, "total") for s in series("vllm:num_preemptions")) if t is not None]
    return ServerFigures(preemptions=sum(totals)) if totals else ServerFigures()


def aiperf_point(data: dict, seq: int, file: Path) -> PointResult:
    """One AIPerf run -> a kvplan PointResult."""
    config = data["input_config"]
    mode, concurrency, rate, arrival = _load(config)
    if mode == "concurrency" and concurrency is None:
        raise KvplanError(f"{file}: its input_config has neither a concurrency nor a request rate: the load is unknown")
    ok = int(min(number(data.get("request_count"), "avg") or 0, MAX_COUNT))
    failed = int(min(number(data.get("error_request_count"), "avg") or 0, MAX_COUNT))
    out_tokens = int(min(number(data.get("total_output_tokens"), "avg") or 0, MAX_COUNT))
    stats = {m: _stats(data.get(name), ok) for m, name in _METRICS.items()}
    warnings = [w for label, m in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e")) for w in sample_warnings(label, stats[m])]
    server = _server(file.parent)
    notes = [f"from {file.name} ({SOURCE} {data.get('aiperf_version') or '?'}): its inter-token latency is per request "
             "(kvplan's TPOT); no ITL per token"]
    server_tokens = number(data.get("total_usage_completion_tokens"), "avg")
    if server_tokens is not None and int(server_tokens) != out_tokens:
        notes.append(f"{SOURCE} counted {out_tokens} output tokens with its tokenizer; the server's usage says "
                     f"{int(server_tokens)}: its throughput is by its own count")
    if server.empty:
        notes.append("no server metrics export beside it: no preemption, KV wait or KV fill")
    else:
        notes.append(f"preemptions from {SERVER_METRICS_FILE} (vllm:num_preemptions over the profiling phase); "
                     "no KV wait or KV fill")
    if data.get("was_cancelled") or data.get("is_complete") is False:
        notes.append(f"{SOURCE} says the run did not complete ({data.get('incomplete_reason') or 'cancelled'})")
    complete = ok and not failed and not data.get("was_cancelled") and data.get("is_complete") is not False
    return PointResult(
        seq=seq, concurrency=concurrency or 0, status="ok" if complete else "failed",
        error=None if complete else (f"{failed} requests failed" if failed else "no request completed" if not ok
                                     else "the run did not complete"),
        started_at=str(data.get("start_time") or ""), wall_s=round(number(data.get("benchmark_duration"), "avg") or 0.0, 4),
        first_index=0, requests=ok + failed, requests_ok=ok, requests_failed=failed, output_tokens=out_tokens,
        throughput_tok_s=number(data.get("output_token_throughput"), "avg"), ttft=stats["ttft"], itl=LatencyStats(),
        tpot=stats["tpot"], e2e=stats["e2e"], server=server, waited_for_kv=False,
        preempted=bool(server.preemptions), label="not measured", notes=notes, mode=mode,
        rate=rate if mode == "rate" else None,
        burstiness=(1.0 if arrival == "poisson" else None) if mode == "rate" else None,
        max_concurrency=concurrency if mode == "rate" else None,
        latency_from=f"sent ({SOURCE}: from each request's send)",
        request_throughput=number(data.get("request_throughput"), "avg"), warnings=warnings,
    )


def _model(config: dict) -> str:
    models = config.get("models") if isinstance(config.get("models"), dict) else {}
    items = models.get("items") if isinstance(models.get("items"), list) else []
    names = [m.get("name") for m in items if isinstance(m, dict)]
    endpoint = config.get("endpoint") if isinstance(config.get("endpoint"), dict) else {}
    names += list(endpoint.get("model_names") or []) if isinstance(endpoint.get("model_names"), list) else []
    return next((n for n in names if isinstance(n, str) and n), "unknown")


def read_aiperf(path: Path, data: Any = None) -> BenchSummary:
    """AIPerf results (one ``profile_export_aiperf.json``, its artifact folder, or a folder of them) as a BenchSummary."""
    files = result_files(path) if path.is_dir() else [path]
    if not files:
        raise KvplanError(f"{path}: no {RESULT_FILE}", "pass AIPerf's artifact folder, or a folder of them")
    points, first = [], None
    for i, f in enumerate(files):
        result = data if data is not None and f == path else load_user_json(f)
        if not is_aiperf_result(result):
            raise KvplanError(f"{f}: not an AIPerf {RESULT_FILE}")
        first = first or result
        points.append(aiperf_point(result, i, f))
    if len({p.mode for p in points}) > 1:
        raise KvplanError(f"{path}: mixes request-rate and concurrency runs", "keep one kind per folder")
    points.sort(key=lambda p: p.load)
    mode = points[0].mode
    return BenchSummary(
        status="complete", run_dir=str(path), mode="attach", base_url="", model=_model(first["input_config"]),
        workload=f"{SOURCE} ({len(points)} run{'s' if len(points) > 1 else ''})", points=points, load_mode=mode,
        load_description=f"{SOURCE}: " + ("request rate" if mode == "rate" else "concurrency") + " per run",
        latency_from="sent", source=SOURCE,
    )
