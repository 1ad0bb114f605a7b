"""Results of other harnesses as kvplan bench summaries: ``vllm bench serve --save-result`` JSON, and GuideLLM's
benchmarks report, saved as JSON or YAML; AIPerf's and inference-perf's (kvplan.bench.aiperf,
kvplan.bench.inference_perf), which read_external dispatches to.

``vllm bench serve``: what such a file can show: the latency percentiles it saved (``--metric-percentiles``, 99 by
default, plus mean and median) of TTFT, TPOT, ITL and E2E at one load (``max_concurrency`` closed-ish loop, or
``request_rate`` open loop with ``burstiness``), request and token throughput, vLLM's own goodput
when it was run with ``--goodput``. What it cannot show: preemptions, requests waiting for KV, KV
fill, the engine's KV pool (vLLM's client never reads /metrics), so no onset and no preemption
gate; nor per-request latencies unless saved with ``--save-detailed``; nor sample counts of ITL
(estimated as output tokens - completed requests). One file is one point. A folder of such files is one
sweep (a run), its points ordered by load.

GuideLLM (``guidellm benchmark --output-path benchmarks.json``, or ``benchmarks.yaml`` / ``.yml``: the same
report, which GuideLLM writes with ``json.dumps`` or ``yaml.dump`` of one ``model_dump()`` by the file's
suffix, GenerativeBenchmarksReport.save_file in
https://github.com/vllm-project/guidellm/blob/main/src/guidellm/benchmark/schemas/generative/report.py):
one point per benchmark at a fixed load (concurrent streams, or a constant/Poisson rate), TTFT/ITL/TPOT/E2E
mean and percentiles of its successful requests. A folder holding GuideLLM's default file (``benchmarks.json``,
else ``benchmarks.yaml``: src/guidellm/benchmark/outputs/serialized.py) is read as that report. YAML goes
through kvplan.paths.load_user_yaml: safe (no tag runs code), alias bombs, deep nesting, .inf/.nan and too
many nodes refused at their line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.bench.aiperf import is_aiperf_result, read_aiperf, result_files
from kvplan.bench.inference_perf import is_stage_report, read_inference_perf, stage_files
from kvplan.bench.result_fields import MAX_COUNT
from kvplan.bench.result_fields import count as _count
from kvplan.bench.result_fields import number as _num
from kvplan.bench.results import BenchSummary, LatencyStats, PointResult, ServerFigures
from kvplan.bench.stats import sample_warnings
from kvplan.errors import KvplanError
from kvplan.paths import load_user_json, load_user_yaml, parse_json_text, read_user_text

VLLM_SOURCE = "vllm bench serve"
CAN_SHOW = ("TTFT/TPOT/ITL/E2E mean, median and saved percentiles", "request and output throughput", "load")
CANNOT_SHOW = ("preemptions", "KV waits and KV fill", "the engine's KV pool", "onsets")
_METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}


def is_vllm_result(data: Any) -> bool:
    return isinstance(data, dict) and "request_throughput" in data and any(
        k in data for k in ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_e2el_ms"))


def _stats(data: dict, name: str, n: int | None) -> LatencyStats:
    """One latency of a saved result (ms) as a kvplan.bench.results.LatencyStats (seconds)."""

    ms = {"mean": _num(data, f"mean_{name}_ms"), "p50": _num(data, f"median_{name}_ms")}
    for q in ("50", "90", "95", "99"):
        v = _num(data, f"p{q}_{name}_ms")
        if v is not None:
            ms[f"p{q}"] = v
    out: dict[str, float | None] = {}
    for key in ("mean", "p50", "p90", "p95", "p99"):
        v = ms.get(key)
        out[key] = None if v is None else v / 1000
    return LatencyStats(n=n, **out)


def vllm_point(data: dict, seq: int, file: str) -> PointResult:
    """One saved result -> a kvplan PointResult (mode rate when request_rate is finite)."""

    completed = int(min(_num(data, "completed") or 0, MAX_COUNT))
    failed = int(min(_num(data, "failed") or 0, MAX_COUNT))
    out_tokens = int(min(_num(data, "total_output_tokens") or 0, MAX_COUNT))
    rate_raw = data.get("request_rate")
    rate = _num(data, "request_rate") if not isinstance(rate_raw, str) else None
    cap = _count(data, "max_concurrency")
    peak = _count(data, "max_concurrent_requests")
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
        e2e=stats["e2e"], waited_for_kv=False, preempted=False, label="not measured",
        notes=[f"from {file} ({VLLM_SOURCE}): no server metrics, so no preemption, KV wait or KV fill"],
        mode=mode, rate=rate, burstiness=_num(data, "burstiness") if mode == "rate" else None,
        max_concurrency=cap if mode == "rate" else None, latency_from="sent (vllm bench serve: from each request's send)",
        request_throughput=_num(data, "request_throughput"), warnings=warnings, goodput_req_s=goodput,
    )


def vllm_result_documents(file: Path) -> list[tuple[str, Any]]:
    """The results in one saved file, each with its name: one JSON document (``--save-result``), or one a
    line (``--append-result`` appends ``json.dump(result)`` after a newline, vllm/benchmarks/serve.py@0.32.0)."""

    text = read_user_text(file)
    try:
        return [(file.name, parse_json_text(text, str(file)))]
    except KvplanError as whole:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(lines) < 2:
            raise whole from None
        return [(f"{file.name}:{n}", parse_json_text(line, f"{file}:{n}")) for n, line in lines]


def read_vllm_results(path: Path) -> BenchSummary:
    """A saved result file (one result, or one a line from --append-result), or a folder of them, as a
    BenchSummary (source ``vllm bench serve``)."""
    files = [path] if path.is_file() else sorted(path.glob("*.json"))
    results = []
    for f in files:
        try:
            documents = vllm_result_documents(f)
        except KvplanError:
            if path.is_file():
                raise
            continue
        results += [(name, data) for name, data in documents if is_vllm_result(data)]
    if not results:
        raise KvplanError(f"{path}: no `vllm bench serve --save-result` JSON found",
                          "pass a kvplan bench run folder, a saved vllm result, or a folder of them")
    points = [vllm_point(d, i, name) for i, (name, d) in enumerate(results)]
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
        points=points, load_mode=modes.pop(),
        load_description=f"{VLLM_SOURCE}: " + ("request rate" if points[0].mode == "rate" else "max concurrency")
        + " per file", latency_from="sent", source=VLLM_SOURCE,
    )


# ---------------------------------------------------------------------------------------------- GuideLLM

GUIDELLM_SOURCE = "GuideLLM"
GUIDELLM_CAN_SHOW = ("TTFT/ITL/TPOT/E2E mean and percentiles of successful requests", "request and output throughput",
                     "load (concurrent streams, or constant/Poisson request rate)")
GUIDELLM_CANNOT_SHOW = ("preemptions as an onset (no concurrency sweep searched by kvplan)", "KV waits and KV fill",
                        "the engine's KV pool", "onsets")
#: GuideLLM metric (GenerativeMetrics field) -> (kvplan metric, seconds per unit). request_latency is in seconds,
#: the others in ms (src/guidellm/benchmark/schemas/generative/metrics.py).
_GUIDELLM_METRICS = {"ttft": ("time_to_first_token_ms", 1e-3), "itl": ("inter_token_latency_ms", 1e-3),
                     "tpot": ("time_per_output_token_ms", 1e-3), "e2e": ("request_latency", 1.0)}
_RATE_STRATEGIES = ("constant", "poisson")
#: What GuideLLM writes into a folder given as --output-path (benchmarks.{json,yaml}); .yml only when named so.
GUIDELLM_DEFAULT_FILES = ("benchmarks.json", "benchmarks.yaml", "benchmarks.yml")
YAML_SUFFIXES = (".yaml", ".yml")
#: A YAML report holds every request GuideLLM sampled (all by default): more nodes than a spec, still bounded
#: (about half a KB of memory a node while it is read, and about 10 s a million nodes on one slow core).
GUIDELLM_YAML_MAX_NODES = 1_000_000
GUIDELLM_YAML_MAX_ALIASES = 10_000


def load_report_file(path: Path) -> Any:
    """A report file's data: YAML by its suffix (.yaml/.yml), else JSON; safely, with kvplan.paths' limits."""

    if path.suffix.lower() in YAML_SUFFIXES:
        # yaml.dump writes a tuple as !!python/tuple: read such tags as plain data (nothing is constructed)
        return load_user_yaml(path, max_nodes=GUIDELLM_YAML_MAX_NODES, max_aliases=GUIDELLM_YAML_MAX_ALIASES,
                              python_tags=True)
    return load_user_json(path)


def is_guidellm_report(data: Any) -> bool:
    """A GuideLLM ``GenerativeBenchmarksReport`` (``guidellm benchmark --output-path benchmarks.json``)."""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list) or not data["benchmarks"]:
        return False
    first = data["benchmarks"][0]
    return isinstance(first, dict) and isinstance(first.get("metrics"), dict) and (
        "time_to_first_token_ms" in first["metrics"] or "request_latency" in first["metrics"])


def _guidellm_stats(metric: Any, scale: float, n: int | None = None) -> LatencyStats:
    """A StatusDistributionSummary's ``successful`` DistributionSummary -> a kvplan.bench.results.LatencyStats
    (seconds); ``n`` replaces its count when given."""

    dist = metric.get("successful") if isinstance(metric, dict) else None
    out: dict[str, float | None] = {"n": None, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    if not isinstance(dist, dict):
        return LatencyStats(**out)
    count = _num(dist, "count")
    out["n"] = None if count is None else int(count) if n is None else n
    if not count:
        return LatencyStats(**out)  # GuideLLM writes zeros for an empty distribution: no sample, no value
    pct = dist.get("percentiles") if isinstance(dist.get("percentiles"), dict) else {}
    for key, value in (("mean", _num(dist, "mean")), ("p50", _num(pct, "p50") if pct else _num(dist, "median")),
                       ("p90", _num(pct, "p90")), ("p95", _num(pct, "p95")), ("p99", _num(pct, "p99"))):
        out[key] = None if value is None else value * scale
    return LatencyStats(**out)


def _strategy(bench: dict) -> dict:
    """The benchmark's SchedulingStrategy: ``config.strategy`` (0.4+), else ``args.strategy`` (older reports)."""
    for holder in (bench.get("config"), bench.get("args"), bench):
        if isinstance(holder, dict) and isinstance(holder.get("strategy"), dict):
            return holder["strategy"]
    return {}


def _server_preemptions(bench: dict) -> tuple[float | None, float | None]:
    """(preemptions, peak KV usage) from GuideLLM's optional server metrics (vLLM /metrics scraped during the
    benchmark, ServerMetricsSummary); (None, None) when the report has none."""
    summaries = bench.get("server_metrics")
    if isinstance(summaries, dict):
        summaries = [summaries]
    if not isinstance(summaries, list):
        return None, None
    preempt = kv = None
    for s in summaries:
        if not isinstance(s, dict):
            continue
        for series in (s.get("counters") or {}).get("vllm:num_preemptions", []) or []:
            inc = _num(series, "increase") if isinstance(series, dict) else None
            if inc is not None:
                preempt = (preempt or 0.0) + inc
        gauges = s.get("gauges") or {}
        for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            for series in gauges.get(name, []) or []:
                peak = _num(series.get("summary") or {}, "max") if isinstance(series, dict) else None
                if peak is not None:
                    kv = max(kv or 0.0, peak)
    return preempt, kv


def guidellm_point(bench: dict, seq: int, file: str) -> PointResult | None:
    """One GuideLLM benchmark (one strategy at one load) -> a kvplan PointResult, or None when its load is not a
    fixed concurrency or rate (``throughput``: every request at once)."""

    strategy = _strategy(bench)
    kind = str(strategy.get("type_") or strategy.get("type") or "")
    metrics = bench.get("metrics") if isinstance(bench.get("metrics"), dict) else {}
    if kind in _RATE_STRATEGIES:
        mode, rate, concurrency = "rate", _num(strategy, "rate"), 0
        if rate is None:
            return None
    elif kind in ("concurrent", "synchronous"):
        streams = strategy.get("streams") if kind == "concurrent" else 1
        if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= 10**9:
            return None
        mode, rate, concurrency = "concurrency", None, streams
    else:
        return None
    totals = metrics.get("request_totals") if isinstance(metrics.get("request_totals"), dict) else {}
    ok = int(_num(totals, "successful") or 0)
    failed = int((_num(totals, "errored") or 0) + (_num(totals, "incomplete") or 0))
    # TPOT is weighted by output tokens in GuideLLM's count; one TPOT per request
    stats = {m: _guidellm_stats(metrics.get(field), scale, ok if m == "tpot" else None)
             for m, (field, scale) in _GUIDELLM_METRICS.items()}
    warnings = [w for label, m in (("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"), ("E2E", "e2e"))
                for w in sample_warnings(label, stats[m])]
    sched = bench.get("scheduler_metrics") if isinstance(bench.get("scheduler_metrics"), dict) else {}
    start, end = _num(sched, "measure_start_time"), _num(sched, "measure_end_time")
    wall = _num(bench, "duration") or (end - start if start is not None and end is not None and end > start else 0.0)
    out_tokens = _num((metrics.get("output_token_count") or {}).get("successful") or {}, "total_sum")
    rps = (metrics.get("requests_per_second") or {}).get("successful") or {}
    tps = (metrics.get("output_tokens_per_second") or {}).get("successful") or {}
    preemptions, kv = _server_preemptions(bench)
    server = ServerFigures() if preemptions is None and kv is None else ServerFigures(preemptions=preemptions,
                                                                                       peak_kv_usage=kv)
    notes = [f"from {file} ({GUIDELLM_SOURCE}, {kind} strategy): latencies of its successful requests"]
    if server.empty:
        notes.append("no server metrics in the report: no preemption, KV wait or KV fill")
    label = str(strategy.get("type_") or kind)
    if failed:
        notes.append(f"{failed} request(s) errored or incomplete in {GUIDELLM_SOURCE}'s measurement window")
    return PointResult(
        seq=seq, concurrency=concurrency, status="ok" if ok and not failed else "failed",
        error=None if ok and not failed else (f"{failed} requests errored or incomplete" if failed
                                              else "no request completed"),
        started_at="" if start is None else str(start), wall_s=round(wall, 4), first_index=0,
        requests=ok + failed, requests_ok=ok, requests_failed=failed, output_tokens=int(out_tokens or 0),
        throughput_tok_s=_num(tps, "mean"), ttft=stats["ttft"], itl=stats["itl"], tpot=stats["tpot"], e2e=stats["e2e"],
        server=server, waited_for_kv=False, preempted=bool(preemptions), label="not measured", notes=notes,
        mode=mode, rate=rate, burstiness=(1.0 if kind == "poisson" else None) if mode == "rate" else None,
        max_concurrency=_count(strategy, "max_concurrency"),
        latency_from=f"sent ({GUIDELLM_SOURCE} {label}: from each request's start)",
        request_throughput=_num(rps, "mean"), warnings=warnings,
    )


def _guidellm_model(data: dict) -> str:
    """The served model: the first benchmark's ``config.backend.model``, else the report's args/config."""
    candidates = []
    for bench in data.get("benchmarks") or []:
        cfg = bench.get("config") if isinstance(bench, dict) else None
        if isinstance(cfg, dict) and isinstance(cfg.get("backend"), dict):
            candidates.append(cfg["backend"].get("model"))
    args = data.get("args") if isinstance(data.get("args"), dict) else {}
    candidates.append(args.get("model"))
    spec = ((data.get("config") or {}).get("spec") or {}) if isinstance(data.get("config"), dict) else {}
    if isinstance(spec, dict) and isinstance(spec.get("backend"), dict):
        candidates.append(spec["backend"].get("model"))
    return next((c for c in candidates if isinstance(c, str) and c), "unknown")


def read_guidellm_report(path: Path, data: Any = None) -> BenchSummary:
    """A GuideLLM benchmarks report (JSON, or YAML by its suffix) as a BenchSummary, one point per benchmark
    with a fixed load.

    A ``sweep`` profile mixes loads (synchronous, throughput, constant rates): the rate points are kept
    when there are any (else the concurrency ones), ``throughput`` benchmarks never (no fixed load); what
    was left out is said in the load description."""
    if data is None:
        data = load_report_file(path)
    if not is_guidellm_report(data):
        raise KvplanError(f"{path}: not a GuideLLM benchmarks report",
                          "pass the JSON or YAML written by guidellm benchmark")
    points, skipped = [], []
    for i, bench in enumerate(data["benchmarks"]):
        if not isinstance(bench, dict):
            continue
        point = guidellm_point(bench, i, path.name)
        kind = str(_strategy(bench).get("type_") or "?")
        if point is None:
            skipped.append(kind)
        else:
            points.append(point)
    if not points:
        raise KvplanError(f"{path}: no GuideLLM benchmark at a fixed concurrency or request rate",
                          "throughput benchmarks send every request at once: there is no load to compare")
    mode = "rate" if any(p.mode == "rate" for p in points) else "concurrency"
    skipped += [f"{'synchronous/concurrent' if p.mode == 'concurrency' else 'rate'}" for p in points if p.mode != mode]
    points = sorted((p for p in points if p.mode == mode), key=lambda p: p.load)
    description = f"{GUIDELLM_SOURCE}: " + ("request rate (constant or Poisson) per benchmark" if mode == "rate"
                                            else "concurrent streams per benchmark")
    if skipped:
        description += f"; left out: {', '.join(sorted(set(skipped)))} benchmark(s) (another kind of load)"
    return BenchSummary(
        status="complete", run_dir=str(path), mode="attach", base_url="", model=_guidellm_model(data),
        workload=f"{GUIDELLM_SOURCE} report ({len(data['benchmarks'])} benchmarks)", points=points,
        load_mode=mode, load_description=description, latency_from="sent", source=GUIDELLM_SOURCE,
    )


def read_external(path: Path) -> BenchSummary:
    """Another harness's results as a BenchSummary: a `vllm bench serve --save-result` file or folder of
    them, a GuideLLM report (a JSON or YAML file, or a folder holding its default ``benchmarks.json``
    or ``benchmarks.yaml``), AIPerf's results (kvplan.bench.aiperf) or inference-perf's per-stage reports
    (kvplan.bench.inference_perf). A path that is not a folder is read as a file (a FIFO or device: one error)."""
    if not path.is_dir():
        if path.suffix.lower() in YAML_SUFFIXES:  # vllm bench serve saves JSON only
            data = load_report_file(path)
            if is_guidellm_report(data):
                return read_guidellm_report(path, data)
            raise KvplanError(f"{path}: not a GuideLLM benchmarks report",
                              "pass the YAML written by guidellm benchmark --output-path benchmarks.yaml")
        documents = vllm_result_documents(path)  # one JSON document, or --append-result's one a line
        if len(documents) == 1:
            data = documents[0][1]
            if is_guidellm_report(data):
                return read_guidellm_report(path, data)
            if is_aiperf_result(data):
                return read_aiperf(path, data)
            if is_stage_report(data):
                return read_inference_perf(path, data)
        if any(is_vllm_result(data) for _, data in documents):
            return read_vllm_results(path)
        raise KvplanError(f"{path}: neither a `vllm bench serve --save-result` JSON, a GuideLLM report, AIPerf's "
                          "profile_export_aiperf.json nor an inference-perf lifecycle report")
    if stage_files(path):  # inference-perf's per-stage reports
        return read_inference_perf(path)
    if result_files(path):  # AIPerf's artifact folder, or a folder of them
        return read_aiperf(path)
    for name in GUIDELLM_DEFAULT_FILES:
        default = path / name
        if not default.is_file():
            continue
        data = load_report_file(default)
        if is_guidellm_report(data):
            return read_guidellm_report(default, data)
        if default.suffix in YAML_SUFFIXES and not any(path.glob("*.json")):
            raise KvplanError(f"{default}: not a GuideLLM benchmarks report",
                              "pass the YAML written by guidellm benchmark --output-path benchmarks.yaml")
    return read_vllm_results(path)
