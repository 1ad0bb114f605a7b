"""inference-perf's results (https://github.com/kubernetes-sigs/inference-perf) as a kvplan bench summary: one point per
stage, from its per-stage request lifecycle reports ``stage_<N>_lifecycle_metrics.json``.

Their shape: ``summarize_requests`` in inference_perf/reportgen/base.py@0.7.0 (``ResponsesSummary.model_dump()``):
``load_summary`` (``count`` of requests sent, the stage's ``requested_rate`` and ``achieved_rate``, and ``concurrency``
on a ``concurrent`` load), ``successes`` (``count``; ``latency`` of ``time_to_first_token``, ``inter_token_latency``
(every gap between two tokens), ``time_per_output_token`` and ``request_latency``, each ``mean``, ``median``,
``p90``... in seconds; ``throughput`` in tokens and requests per second; ``output_len``) and ``failures`` (``count``).
The run's ``config.yaml`` beside them (inference-perf writes it too: ``generate_config_report``) says the load type
(``constant`` or ``poisson``) and the model (``server.model_name``).

What it cannot show: preemptions, KV waits and fill. The ``stage_<N>_prometheus_metrics.json`` beside them are not
read: inference-perf writes 0.0 for a query that failed or matched nothing (``execute_query`` in
inference_perf/client/server_metrics/prometheus_client/base.py@0.7.0), so a zero there is not evidence of none.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvplan.bench.result_fields import MAX_COUNT, count, number
from kvplan.bench.results import BenchSummary, LatencyStats, PointResult
from kvplan.bench.stats import sample_warnings
from kvplan.errors import KvplanError
from kvplan.paths import load_user_json, load_user_yaml

SOURCE = "inference-perf"
CAN_SHOW = ("TTFT/ITL/TPOT/E2E mean and percentiles of successful requests", "request and output throughput",
            "load (request rate or concurrency of each stage)")
CANNOT_SHOW = ("preemptions (its Prometheus report writes 0 for a query that found nothing)", "KV waits and KV fill",
               "the engine's KV pool", "onsets")
STAGE_FILE = re.compile(r"stage_(\d+)_lifecycle_metrics\.json")
CONFIG_FILE = "config.yaml"
#: inference-perf's latency -> kvplan's (all in seconds).
_METRICS = {"ttft": "time_to_first_token", "itl": "inter_token_latency", "tpot": "time_per_output_token",
            "e2e": "request_latency"}


def is_stage_report(data: Any) -> bool:
    """A per-stage (or summary) request lifecycle report: load_summary, successes with latencies, failures."""
    return (isinstance(data, dict) and isinstance(data.get("load_summary"), dict) and "failures" in data
            and isinstance(data.get("successes"), dict) and isinstance(data["successes"].get("latency"), dict))


def stage_files(folder: Path) -> list[Path]:
    """The folder's ``stage_<N>_lifecycle_metrics.json``, by stage number."""
    found = [(int(m.group(1)), f) for f in folder.glob("stage_*_lifecycle_metrics.json")
             if (m := STAGE_FILE.fullmatch(f.name)) and len(m.group(1)) <= 9]
    return [f for _, f in sorted(found)]


def _stats(summary: Any, n: int | None) -> LatencyStats:
    """One latency's summary (seconds; ``median`` is the p50) as a LatencyStats of ``n`` samples."""
    if not isinstance(summary, dict) or number(summary, "mean") is None:
        return LatencyStats()
    return LatencyStats(n=n, mean=number(summary, "mean"), p50=number(summary, "median"), p90=number(summary, "p90"),
                        p95=number(summary, "p95"), p99=number(summary, "p99"))


def stage_point(data: dict, stage: int, file: str, load_type: str) -> PointResult:
    """One stage's lifecycle report -> a kvplan PointResult: a concurrency point when the stage had one
    (``concurrent`` load), else a rate point at the stage's requested rate."""
    load, ok_part = data["load_summary"], data["successes"]
    failed_part = data["failures"] if isinstance(data["failures"], dict) else {}
    ok = int(min(number(ok_part, "count") or 0, MAX_COUNT))
    failed = int(min(number(failed_part, "count") or 0, MAX_COUNT))
    concurrency, rate = count(load, "concurrency"), number(load, "requested_rate")
    if concurrency is None and not rate:
        raise KvplanError(f"{file}: neither load_summary.concurrency nor a requested_rate: the load is unknown",
                          "pass inference-perf's per-stage reports (stage_<N>_lifecycle_metrics.json)")
    mode = "concurrency" if concurrency is not None else "rate"
    mean_out = number(ok_part.get("output_len"), "mean")
    out_tokens = int(min(round(mean_out * ok), MAX_COUNT)) if mean_out is not None else 0
    latency = ok_part["latency"]
    # one TTFT, TPOT and E2E a request; ITL: a gap a token after the first (estimated from the mean output length)
    counts = {"ttft": ok, "tpot": ok, "e2e": ok, "itl": max(0, out_tokens - ok) if mean_out is not None else None}
    stats = {m: _stats(latency.get(name), counts[m]) for m, name in _METRICS.items()}
    warnings = [w for label, m in (("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"), ("E2E", "e2e"))
                for w in sample_warnings(label, stats[m])]
    throughput = ok_part.get("throughput") if isinstance(ok_part.get("throughput"), dict) else {}
    wall = number(data, "benchmark_time_seconds") or number(load, "send_duration") or 0.0
    notes = [f"from {file} ({SOURCE} stage {stage}, {load_type or 'unknown'} load): no server metrics, so no "
             "preemption, KV wait or KV fill"]
    if failed:
        notes.append(f"{failed} request(s) failed in {SOURCE}'s stage")
    return PointResult(
        seq=stage, concurrency=concurrency or 0, status="ok" if ok and not failed else "failed",
        error=None if ok and not failed else (f"{failed} requests failed" if failed else "no request completed"),
        started_at="", wall_s=round(wall, 4), first_index=0, requests=ok + failed, requests_ok=ok,
        requests_failed=failed, output_tokens=out_tokens, throughput_tok_s=number(throughput, "output_tokens_per_sec"),
        ttft=stats["ttft"], itl=stats["itl"], tpot=stats["tpot"], e2e=stats["e2e"], waited_for_kv=False,
        preempted=False, label="not measured", notes=notes, mode=mode, rate=rate if mode == "rate" else None,
        burstiness=(1.0 if load_type == "poisson" else None) if mode == "rate" else None,
        latency_from=f"sent ({SOURCE}: from each request's start)",
        request_throughput=number(throughput, "requests_per_sec"), warnings=warnings,
    )


def _config(folder: Path) -> dict:
    """The run's config.yaml (load type, model), read safely; {} when there is none."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return {}
    data = load_user_yaml(path)
    return data if isinstance(data, dict) else {}


def read_inference_perf(path: Path, data: Any = None) -> BenchSummary:
    """inference-perf's per-stage lifecycle reports (a folder of them, or one file) as a BenchSummary, one point a stage."""
    folder = path if path.is_dir() else path.parent
    files = stage_files(path) if path.is_dir() else [path]
    if not files:
        raise KvplanError(f"{path}: no stage_<N>_lifecycle_metrics.json",
                          "run inference-perf with report.request_lifecycle.per_stage: true")
    config = _config(folder)
    load_cfg = config.get("load") if isinstance(config.get("load"), dict) else {}
    load_type = str(load_cfg.get("type") or "")
    points = []
    for f in files:
        report = data if data is not None and f == path else load_user_json(f)
        if not is_stage_report(report):
            raise KvplanError(f"{f}: not an inference-perf request lifecycle report")
        match = STAGE_FILE.fullmatch(f.name)
        points.append(stage_point(report, int(match.group(1)) if match else 0, f.name, load_type))
    if len({p.mode for p in points}) > 1:
        raise KvplanError(f"{path}: mixes request-rate and concurrency stages", "keep one kind per folder")
    points.sort(key=lambda p: p.load)
    server = config.get("server") if isinstance(config.get("server"), dict) else {}
    model = server.get("model_name") if isinstance(server.get("model_name"), str) and server.get("model_name") else "unknown"
    mode = points[0].mode
    return BenchSummary(
        status="complete", run_dir=str(path), mode="attach", base_url="", model=model,
        workload=f"{SOURCE} ({load_type or 'unknown'} load, {len(points)} stages)", points=points, load_mode=mode,
        load_description=f"{SOURCE}: " + ("request rate" if mode == "rate" else "concurrency") + " per stage",
        latency_from="sent", source=SOURCE,
    )
