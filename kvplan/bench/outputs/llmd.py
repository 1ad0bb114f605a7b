"""llm-d-benchmark's benchmark report, version 0.2: one YAML file a point, ``benchmark_report_v0.2,_kvplan_stage_<seq>.yaml``.

A benchmark report is llm-d-benchmark's common format for one load level of one experiment (its harness pod writes
one a stage as ``benchmark_report_v0.2,_<native file>.yaml``, and its analysis tools glob for that name:
llmdbenchmark/analysis/__init__.py). The schema is the pydantic model
llmdbenchmark/analysis/benchmark_report/schema_v0_2.py of https://github.com/llm-d/llm-d-benchmark (v0.8.0), whose
JSON Schema is vendored as tests/data/llm-d-benchmark/br_v0_2_json_schema.json. Version 0.2 is what the harness
writes; 0.2.1 adds optional fields only, so every 0.2 report is a valid 0.2.1 one (the schema's README).

What goes where: a run is an experiment (``run.eid``, a UUID5 of the run folder's name, shared by its points), a point
a stage (``scenario.load.standardized.stage`` = the point's seq, ``run.uid`` a UUID5 of folder and seq: the same
report when ``kvplan report`` writes it again). Latencies in seconds (``s``, ``s/token``) as kvplan measured them;
the KV pool's occupancy, running and waiting requests over the point from the server's scrapes under
``results.observability.components[0].aggregate`` (fractions and counts); what the schema has no field for
(preemptions of the point, the onsets predicted and measured, the KV pool's blocks) under ``observability.kvplan``,
where the schema allows keys of a tool's own (``Observability`` is ``extra="allow"``). Nothing is written that kvplan
did not see: the accelerator stays "" with count 0 unless GPU figures were taken, as llm-d's own minimal stack does
(native_to_br0_2.py ``_populate_minimal_stack``).
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from datetime import datetime, timedelta
from typing import Any

import yaml

from kvplan import __version__
from kvplan.bench.outputs.registry import output
from kvplan.bench.results import BenchSummary, LatencyStats, PointResult
from kvplan.bench.store import RunStore
from kvplan.bench.workload import Workload
from kvplan.errors import KvplanError
from kvplan.stats import percentile

VERSION = "0.2"
FILE_PREFIX = "benchmark_report_v0.2,_kvplan_stage_"
#: The engine's label in scenario.stack (observability entries refer to it by this label).
ENGINE_LABEL = "engine-0"
#: kvplan's latency -> (the report's field, its units).
_LATENCIES = (("ttft", "time_to_first_token", "s"), ("itl", "inter_token_latency", "s/token"),
              ("tpot", "time_per_output_token", "s/token"), ("e2e", "request_latency", "s"))
#: kvplan's --percentiles names -> the report's Statistics keys (the ones it has: p0p1 ... p99p9).
#: The longest prompt or output a request line may claim (a larger one is not a count kvplan wrote).
MAX_TOKENS = 10**9
_CHOSEN_KEYS = {"p0.1": "p0p1", "p1": "p1", "p5": "p5", "p10": "p10", "p25": "p25", "p75": "p75", "p99.9": "p99p9"}
#: kvplan's workload distributions -> the report's (Distribution: fixed, gaussian, uniform, other).
_DISTRIBUTIONS = {"fixed": "fixed", "normal": "gaussian", "uniform": "uniform", "lognormal": "other"}
WORKLOAD_FIELDS = tuple(f.name for f in dataclasses.fields(Workload))


@output("llm-d", f"{FILE_PREFIX}<seq>.yaml", order=50)
def write_llmd_reports(summary: BenchSummary, store: RunStore) -> dict[str, str]:
    return llmd_reports(summary, _run_config(store), _request_lengths(store))


def llmd_reports(summary: BenchSummary, config: dict[str, Any] | None = None,
                 lengths: dict[int, dict[str, Lengths]] | None = None) -> dict[str, str]:
    """One report (YAML text) a point that sent requests, by file name. ``config`` is the run's run.json config
    (the workload asked for), ``lengths`` the prompt/output token counts of each point's successful requests."""
    reports = {}
    for point in summary.points:
        if point.requests:
            report = benchmark_report(summary, point, config or {}, (lengths or {}).get(point.seq, {}))
            reports[f"{FILE_PREFIX}{point.seq}.yaml"] = yaml.safe_dump(report, sort_keys=False)
    return reports


def benchmark_report(summary: BenchSummary, point: PointResult, config: dict[str, Any],
                     lengths: dict[str, Lengths]) -> dict[str, Any]:
    """One point as a v0.2 benchmark report (a dict the schema validates)."""
    experiment = _experiment_id(summary)
    report: dict[str, Any] = {
        "version": VERSION,
        "run": _drop_none({
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kvplan:{experiment}:{point.seq}")),
            "eid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kvplan:{experiment}")),
            "time": _run_time(point),
            # llm-d's default label, "<model> [<experiment id>]" (native_to_br0_2.py _run_description)
            "description": f"{summary.model} [kvplan {experiment}]",
        }),
        "scenario": _drop_none({"stack": [_engine(summary, point)], "load": _load(summary, point, config)}),
        "results": {"request_performance": {"aggregate": _aggregate(point, lengths)},
                    "observability": _observability(summary, point)},
    }
    return report


def _experiment_id(summary: BenchSummary) -> str:
    """The run folder's name (its time and model): what groups a run's reports."""
    return summary.run_dir.rstrip("/").rsplit("/", 1)[-1] or "run"


def _run_time(point: PointResult) -> dict[str, str] | None:
    try:
        start = datetime.strptime(point.started_at, "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return None  # an attached harness's own timestamp format: no time claimed
    end = start + timedelta(seconds=point.wall_s)
    return {"start": start.isoformat(), "end": end.isoformat(), "duration": f"PT{point.wall_s:g}S"}


def _engine(summary: BenchSummary, point: PointResult) -> dict[str, Any]:
    """The served engine as an ``inference_engine`` component (its replicas, the model kvplan sent requests to)."""
    cap = summary.capacity
    gpus = point.gpu.gpus if point.gpu is not None else 0
    return {
        "metadata": {"schema_version": "0.0.1", "label": ENGINE_LABEL,
                     "cfg_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kvplan:{summary.engine_command or summary.base_url}")),
                     "description": f"{summary.mode} ({'launched by kvplan' if summary.mode == 'launch' else summary.base_url})"},
        "standardized": {
            "kind": "inference_engine", "tool": "vllm" if cap.vllm_version else "", "tool_version": cap.vllm_version or "",
            "role": "replica", "replicas": len(summary.fleet.replicas) if summary.fleet else 1,
            "model": {"name": summary.model},
            "accelerator": {"model": "", "count": gpus, "parallelism": {"tp": 1, "dp": 1, "dp_local": 1, "workers": 1}},
        },
        "native": _drop_none({"args": {"command": summary.engine_command} if summary.engine_command else None}),
    }


def _sequence(value: int, distribution: str, spread: float) -> dict[str, Any]:
    """A SequenceLength for kvplan's --distribution (kvplan.bench.workload: uniform in [x (1-s), x (1+s)], normal with
    std s*x, lognormal with median x; every length clipped to >= 1)."""
    out: dict[str, Any] = {"distribution": _DISTRIBUTIONS.get(distribution, "other"), "value": value}
    if distribution == "normal":
        out["std_dev"] = spread * value
    elif distribution == "uniform":
        out["min"], out["max"] = max(1, math.floor(value * (1 - spread))), max(1, math.ceil(value * (1 + spread)))
    return out


def _workload(config: dict[str, Any]) -> Workload | None:
    """The run's workload as kvplan validates it (kvplan.bench.config.BenchConfig.workload_obj); None when run.json
    holds none it accepts."""
    data = config.get("workload")
    if not isinstance(data, dict):
        return None
    try:
        data = {k: v for k, v in data.items() if k in WORKLOAD_FIELDS}
        data["trace"] = tuple((int(p), int(o)) for p, o in data.get("trace") or ())
        if "token_id_range" in data:
            data["token_id_range"] = tuple(data["token_id_range"])
        work = Workload(**data)
    except (KvplanError, TypeError, ValueError, OverflowError):
        return None
    lengths = [work.prompt_tokens, work.output_tokens, *(n for pair in work.trace for n in pair)]
    return work if all(isinstance(n, int) and n >= 1 for n in lengths) else None


def _load(summary: BenchSummary, point: PointResult, config: dict[str, Any]) -> dict[str, Any] | None:
    """The workload asked for (run.json's config), else the prediction's lengths; None when neither says."""
    work = _workload(config)
    if work is not None and work.trace:
        prompts, outputs = [p for p, _ in work.trace], [o for _, o in work.trace]
        isl = {"distribution": "other", "value": sum(prompts) / len(prompts), "min": min(prompts), "max": max(prompts)}
        osl = {"distribution": "other", "value": sum(outputs) / len(outputs), "min": min(outputs), "max": max(outputs)}
    elif work is not None:
        isl = _sequence(work.prompt_tokens, work.distribution, work.spread)
        osl = _sequence(work.output_tokens, work.distribution, work.spread)
    elif summary.prediction is not None:  # exact: identical requests; else the mean lengths it predicted with
        kind = "fixed" if summary.prediction.exact else "other"
        isl = {"distribution": kind, "value": summary.prediction.prompt_tokens}
        osl = {"distribution": kind, "value": summary.prediction.output_tokens}
    else:
        return None
    standardized: dict[str, Any] = {
        "tool": "kvplan", "tool_version": summary.kvplan_version or __version__,
        "source": "random",  # every prompt is drawn at random from the vocabulary (kvplan.bench.workload)
        "stage": point.seq, "input_seq_len": isl, "output_seq_len": osl,
    }
    if work is not None and work.shared_prefix and not work.trace:  # one prefix, the same for every request of the run
        standardized["prefix"] = {
            "prefix_len": {"distribution": "fixed", "value": round(work.shared_prefix * work.prompt_tokens)},
            "num_groups": 1, "num_users_per_group": max(1, point.concurrency), "num_prefixes": 1}
    if point.mode == "rate" and point.rate:
        standardized["rate_qps"] = point.rate
        if point.max_concurrency:
            standardized["concurrency"] = point.max_concurrency
    elif point.concurrency >= 1:
        standardized["concurrency"] = point.concurrency
    native = {k: v for k, v in config.items() if k != "workload"}
    if work is not None:  # a trace as its length: a report describes the load, it does not carry it
        native["workload"] = {**config["workload"], "trace": f"{len(work.trace)} requests"} if work.trace else config["workload"]
    return {"metadata": {"schema_version": "0.0.1", "description": summary.load_description or summary.workload},
            "standardized": standardized, "native": _drop_none({"config": native or None})}


def _statistics(stats: LatencyStats, units: str) -> dict[str, Any] | None:
    """kvplan's LatencyStats (seconds) as a Statistics; None without a mean (no sample)."""
    if stats.mean is None:
        return None
    out: dict[str, Any] = {"units": units, "mean": stats.mean}
    for key in ("p50", "p90", "p95", "p99"):
        out[key] = getattr(stats, key)
    for name, value in (stats.chosen or {}).items():
        if name in _CHOSEN_KEYS and value is not None:
            out[_CHOSEN_KEYS[name]] = value
    return _drop_none(out)


def _distribution(values: list[float], units: str) -> dict[str, Any] | None:
    """Mean, min, max and percentiles of the scrapes' samples of one gauge as a Statistics."""
    if not values:
        return None
    out: dict[str, Any] = {"units": units, "mean": sum(values) / len(values), "min": min(values)}
    for q in (50, 90, 99):
        out[f"p{q}"] = percentile(values, q)
    out["max"] = max(values)
    return out


def _rate(value: float | None, units: str) -> dict[str, Any] | None:
    return None if value is None else {"units": units, "mean": value}


def _aggregate(point: PointResult, lengths: dict[str, Lengths]) -> dict[str, Any]:
    prompts = lengths.get("prompt") or Lengths()
    requests: dict[str, Any] = {"total": point.requests, "failures": point.requests_failed,
                                "input_length": prompts.statistics(),
                                "output_length": (lengths.get("output") or Lengths()).statistics()}
    if requests["output_length"] is None and point.requests_ok:  # a run without requests.jsonl: the mean only
        requests["output_length"] = {"units": "count", "mean": point.output_tokens / point.requests_ok}
    latency = {field: _statistics(getattr(point, metric), units) for metric, field, units in _LATENCIES}
    wall = point.wall_s
    # the input rate as kvplan counts the output rate (kvplan.bench.point): tokens of the successful requests / wall
    input_rate = round(prompts.total / wall, 2) if prompts.n and wall > 0 and point.requests_ok else None
    throughput = {"input_token_rate": _rate(input_rate, "tokens/s"),
                  "output_token_rate": _rate(point.throughput_tok_s, "tokens/s"),
                  "total_token_rate": _rate(round(input_rate + point.throughput_tok_s, 2)
                                            if input_rate is not None and point.throughput_tok_s is not None else None,
                                            "tokens/s"),
                  "request_rate": _rate(point.request_throughput, "queries/s")}
    return _drop_none({"requests": _drop_none(requests), "latency": _drop_none(latency) or None,
                       "throughput": _drop_none(throughput) or None})


def _observability(summary: BenchSummary, point: PointResult) -> dict[str, Any]:
    """The server's scrapes during the point (formal fields), and kvplan's own figures (``kvplan``)."""
    srv = point.server
    samples = srv.series  # (t, running, waiting, kv usage, preemptions so far) per scrape
    aggregate = _drop_none({"kv_cache_usage": _distribution([s[3] for s in samples], "fraction"),
                            "running_requests": _distribution([s[1] for s in samples], "count"),
                            "waiting_requests": _distribution([s[2] for s in samples], "count")})
    cap, pred = summary.capacity, summary.prediction
    own = _drop_none({
        "preemptions": srv.preemptions, "peak_kv_usage": srv.peak_kv_usage, "peak_running": srv.peak_running,
        "peak_waiting": srv.peak_waiting, "waited_for_kv": point.waited_for_kv, "preempted": point.preempted,
        "label": point.label, "latency_from": point.latency_from,
        "kv_pool": _drop_none({"num_blocks": cap.num_blocks, "block_size": cap.block_size,
                               "kv_cache_tokens": cap.kv_cache_tokens, "source": cap.source or None}) or None,
        "predicted": None if point.predicted is None else point.predicted.model_dump(),
        "onsets": _drop_none({"predicted_first_kv_wait": None if pred is None else pred.first_kv_wait,
                              "predicted_first_preemption": None if pred is None else pred.first_preemption,
                              "measured_first_kv_wait": summary.measured_first_kv_wait,
                              "measured_first_preemption": summary.measured_first_preemption}) or None,
        "status": point.status, "error": point.error,
        # several replicas (kvplan.bench.fleet): each one's figures over the point
        "replicas": None if point.replicas is None else [r.model_dump(mode="json") for r in point.replicas],
        # a data-parallel server (kvplan.bench.fleet.EnginePools): each engine's figures over the point
        "engines": None if point.engines is None else [e.model_dump(mode="json") for e in point.engines],
    })
    out: dict[str, Any] = {"kvplan": own}
    if aggregate:
        out["components"] = [{"component_label": ENGINE_LABEL, "aggregate": aggregate}]
    return out


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    """Without the keys kvplan has no figure for (None, or a float that is not finite): the schema's fields are
    optional, and a null would claim a figure."""
    return {k: v for k, v in data.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))}


def _run_config(store: RunStore) -> dict[str, Any]:
    """run.json's config (the workload asked for); {} when the run folder has none that kvplan can read."""
    try:
        config = store.read_run().get("config")
    except KvplanError:
        return {}
    return config if isinstance(config, dict) else {}


class Lengths:
    """Count, sum, min and max of some token counts: a point's in constant memory (requests.jsonl is streamed)."""

    def __init__(self) -> None:
        self.n, self.total, self.low, self.high = 0, 0, 0, 0

    def add(self, value: int) -> None:
        self.low, self.high = (value, value) if not self.n else (min(self.low, value), max(self.high, value))
        self.n += 1
        self.total += value

    def statistics(self) -> dict[str, Any] | None:
        return {"units": "count", "mean": self.total / self.n, "min": self.low, "max": self.high} if self.n else None


def _request_lengths(store: RunStore) -> dict[int, dict[str, Lengths]]:
    """The prompt and output token counts of each point's successful requests (requests.jsonl), by seq."""
    by_seq: dict[int, dict[str, Lengths]] = {}
    for row in store.read_requests():
        seq = row.get("seq")
        if not row.get("ok") or not isinstance(seq, int):
            continue
        lengths = by_seq.setdefault(seq, {"prompt": Lengths(), "output": Lengths()})
        for key, field in (("prompt", "prompt_tokens"), ("output", "output_tokens")):
            value = row.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
                lengths[key].add(value)
    return by_seq
