"""Evaluate every deployment of a spec with the planner, and optionally against bench runs.

A deployment passes when the planner says it fits (``SizePlan.fits``: the engine starts, the
asked concurrency of asked requests fits the KV pool and max_num_seqs), the pool stays at least
``headroom`` free at that load, and no ``kvplan bench`` run measured its first preemption below
the required concurrency.

Bench run folders (``--bench RUN_DIR``): a folder holding ``summary.json``, or a folder whose
sub-folders hold one each. Fields read (anything else is ignored):

    model                      string   the model the bench served (id or path)
    measured_first_preemption  int|null lowest concurrency at which the engine preempted; null = none seen
    deployment                 string   optional: the spec deployment this run measured
    status                     string   optional: "complete" (default), "interrupted" or "failed"; a null
                                        first preemption of a run that did not complete proves nothing

    points                     list     optional: per point ``concurrency``/``rate``/``mode``, ``status`` and
                                        ``ttft``/``itl``/``tpot``/``e2e`` ({"p99": seconds, "n": count, ...});
                                        read for the ``slo:`` keys

A ``vllm bench serve --save-result`` JSON file (or a folder of them) is read too (kvplan.bench.external):
it shows latency percentiles at its load (``max_concurrency`` or ``request_rate``), so it gates ``slo:``;
it cannot show preemptions (vLLM's client never reads /metrics), so it proves nothing about them.
So is a GuideLLM benchmarks report, JSON or YAML (``guidellm benchmark --output-path benchmarks.json`` or
``benchmarks.yaml``, or a folder holding it): TTFT/ITL/TPOT/E2E percentiles of each benchmark at its
concurrent streams or constant/Poisson rate; no
KV onsets, no preemption gate (even where its optional server metrics counted preemptions, no sweep searched
the onset). So are AIPerf's results (``profile_export_aiperf.json``, its artifact folder or a folder of them;
its inter-token latency is kvplan's TPOT) and inference-perf's per-stage lifecycle reports
(``stage_<N>_lifecycle_metrics.json``): kvplan.bench.aiperf, kvplan.bench.inference_perf.

SLO gate: a deployment with ``slo:`` and bench evidence is checked at its ``concurrency``: the closed-loop
point at that concurrency, else the lowest measured above it (more load); each SLO percentile must be
within its target. No point at or above the concurrency, or a percentile the source did not save, fails
the deployment with the reason (the evidence cannot show it).

A summary with ``deployment`` applies to that deployment; one without applies to every
deployment whose model matches (case-insensitive; a path matches by its last components).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_serializer

from kvplan.bench.aiperf import result_files as aiperf_result_files
from kvplan.bench.external import GUIDELLM_DEFAULT_FILES, read_external
from kvplan.bench.results import Count, LatencyStats, SloResult
from kvplan.bench.slo import fmt_s, slo_results
from kvplan.deploy import load_draft, load_model, plan_deployment, select_gpus
from kvplan.errors import KvplanError
from kvplan.gate.spec import Spec, SpecEntry, SpecErrors, SpecIssue
from kvplan.paths import MAX_RUN_NUMBER, load_user_json
from kvplan.plan.capacity import blocks_needed, request_load
from kvplan.plan.fit import latency_floor
from kvplan.plan.fleet import MAX_REPLICAS, replica_at, replicas_for_rate
from kvplan.plan.hybrid_cache import HybridGroups
from kvplan.plan.prefix_cache import workload_plan
from kvplan.plan.simulate import SchedulerConfig
from kvplan.plan.size import gpu_flag
from kvplan.plan.steptime import model_for
from kvplan.traffic.loaders import load_traffic
from kvplan.units import cdiv

SUMMARY_FILE = "summary.json"


class EvidencePoint(BaseModel):
    """One measured point of a bench run, as the SLO gate reads it: its load and latencies."""

    mode: str = "concurrency"  # concurrency | rate
    load: Count  # concurrent streams, or requests/s
    status: str = "ok"
    ttft: LatencyStats = Field(default_factory=LatencyStats)
    itl: LatencyStats = Field(default_factory=LatencyStats)
    tpot: LatencyStats = Field(default_factory=LatencyStats)
    e2e: LatencyStats = Field(default_factory=LatencyStats)

    def latencies(self) -> dict[str, LatencyStats]:
        return {"ttft": self.ttft, "itl": self.itl, "tpot": self.tpot, "e2e": self.e2e}


class BenchEvidence(BaseModel):
    """What one `kvplan bench` run folder says about preemption."""

    run_dir: str
    model: str
    deployment: str | None = None
    measured_first_preemption: int | None = None
    status: str = "complete"
    source: str = "kvplan"
    shows_preemption: bool = True
    points: list[EvidencePoint] = Field(default_factory=list)


class SloCheck(BaseModel):
    run: str
    source: str
    load: Count | None = Field(description="the concurrency of the point judged (null: none at or above the required)")
    checks: dict[str, SloResult] = Field(default_factory=dict)  # SLO key -> target, value, met (seconds)
    passed: bool
    reason: str | None = None


class BenchCheck(BaseModel):
    runs: list[str]
    measured_first_preemption: int | None = Field(description="lowest over the matching runs; null = none seen")
    required_concurrency: int
    passed: bool
    slo: list[SloCheck] = Field(default_factory=list)
    cannot_show: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _drop_empty(self, handler):
        """Without SLOs or other harnesses' files, the JSON stays as it was (no empty keys)."""
        data = handler(self)
        for key in ("slo", "cannot_show"):
            if not data.get(key):
                data.pop(key, None)
        return data


class FleetCheck(BaseModel):
    """``rate:``: the deployment's replicas behind a router at that rate, each simulated at its share (Poisson
    arrivals, the prior step-time model, its pool and limits: kvplan.plan.fleet, as `kvplan fit --rate`)."""

    rate_per_s: float
    replicas: int = Field(description="engines the deployment runs: gpus / (tp x pp)")
    replicas_needed: int | None = Field(description="the fewest that meet every SLO (null: none up to "
                                                    "max_replicas_searched, or the SLO is out of reach)")
    max_replicas_searched: int
    binding: str = Field(description="what holds a replica back one replica below the count: kv | batch | compute | "
                                     "none")
    slo: dict[str, SloResult] = Field(default_factory=dict, description="each SLO at the deployed replicas: target "
                                      "and predicted value (seconds)")
    passed: bool
    reason: str | None = None


class DeploymentResult(BaseModel):
    """One row of `kvplan check`: the verdict on one deployment and why."""

    name: str
    model: str
    file: str
    line: int
    gpu: str
    gpu_count: int
    vllm_version: str
    context_tokens: int
    concurrency: int
    request_tokens: int
    fits: bool
    limiting_term: str = Field(description="none | KV pool | max_model_len | weights | max_num_seqs | headroom | range | "
                                           "workload | rate | bench | slo")
    reason: str
    suggestion: str | None = None
    pool_blocks: int = Field(description="usable KV blocks per replica")
    blocks_needed: int = Field(description="blocks the asked load pins per replica")
    pool_used: float | None = Field(description="blocks_needed / pool_blocks (null when the pool is empty)")
    margin: float | None = Field(description="1 - pool_used: the share of the pool left free at the asked load")
    headroom: float
    max_concurrency_at_request: int
    kv_cache_tokens: int
    available_kv_gib: float
    bench: BenchCheck | None = None
    fleet: FleetCheck | None = None  # rate:
    # workload: the pool's prefix-cache figures (kvplan.plan.prefix_cache.workload_plan)
    workload_hit_rate: float | None = Field(None, description="prompt tokens this pool serves from cache / queried")
    workload_kept_share: float | None = Field(None, description="this pool's hits / the hits any pool could keep")
    workload_sessions: int | None = Field(None, description="sessions whose largest turns fit the pool at once")
    notes: list[str] = Field(default_factory=list)


class CheckReport(BaseModel):
    """`kvplan check --json`."""

    spec: str
    ok: bool
    total: int
    passed: int
    failed: int
    results: list[DeploymentResult]
    notes: list[str] = Field(default_factory=list)


# --- bench runs -------------------------------------------------------------------------------


def read_bench_runs(paths: list[str]) -> list[BenchEvidence]:
    """Read summary.json of each run folder (or of each sub-folder); bad files are exit-2 errors."""
    runs: list[BenchEvidence] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file() and path.name != SUMMARY_FILE or (path.is_dir() and not (path / SUMMARY_FILE).is_file()
                                                            and _has_vllm_results(path)):
            runs.append(_read_external(path, raw))
            continue
        if path.is_file() and path.name == SUMMARY_FILE:
            files = [path]
        elif (path / SUMMARY_FILE).is_file():
            files = [path / SUMMARY_FILE]
        else:
            files = sorted(path.glob(f"*/{SUMMARY_FILE}")) if path.is_dir() else []
        if not files:
            what = "no such folder" if not path.exists() else f"no {SUMMARY_FILE} in it or its sub-folders"
            raise KvplanError(f"--bench {raw}: {what}", "pass a `kvplan bench` run folder")
        runs.extend(_read_summary(f) for f in files)
    return runs


def _read_summary(file: Path) -> BenchEvidence:
    data = load_user_json(file, max_number=MAX_RUN_NUMBER)
    if not isinstance(data, dict):
        raise KvplanError(f"{file}: expected a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise KvplanError(f"{file}: model: expected the model name as a string, got {model!r}")
    if "measured_first_preemption" not in data:
        raise KvplanError(f"{file}: measured_first_preemption: missing", "an int, or null when none was seen")
    first = data["measured_first_preemption"]
    if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 1):
        raise KvplanError(f"{file}: measured_first_preemption: expected an int >= 1 or null, got {first!r}")
    deployment = data.get("deployment")
    if deployment is not None and not isinstance(deployment, str):
        raise KvplanError(f"{file}: deployment: expected a string, got {deployment!r}")
    status = data.get("status", "complete")
    if not isinstance(status, str):
        raise KvplanError(f"{file}: status: expected a string, got {status!r}")
    points = []
    rows = data.get("points") or []
    if not isinstance(rows, list):
        raise KvplanError(f"{file}: points: expected a list, got {type(rows).__name__}")
    # Evidence that cannot be read is refused, not skipped: a gate that drops a point it cannot read
    # could pass a deployment on the points left.
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise KvplanError(f"{file}: points[{i}]: expected an object, got {type(row).__name__}")
        mode = row.get("mode", "concurrency")
        if mode not in ("concurrency", "rate"):
            raise KvplanError(f"{file}: points[{i}].mode: expected concurrency or rate, got {repr(mode)[:80]}")
        load = row.get("rate") if mode == "rate" else row.get("concurrency")
        if isinstance(load, bool) or not isinstance(load, (int, float)) or not math.isfinite(load) or load < 0:
            raise KvplanError(f"{file}: points[{i}].{mode}: expected a number >= 0, got {repr(load)[:80]}")
        try:
            latencies = {m: LatencyStats.model_validate({k: v for k, v in row[m].items() if k in LatencyStats.model_fields})
                         for m in ("ttft", "itl", "tpot", "e2e") if isinstance(row.get(m), dict)}
        except ValueError as exc:  # pydantic's ValidationError: a figure that is not a number
            raise KvplanError(f"{file}: point at {mode} {load!r}: {str(exc).splitlines()[0]}",
                              "latencies are {n, mean, p50, p90, p95, p99} in seconds") from None
        points.append(EvidencePoint(mode=str(mode), load=float(load), status=str(row.get("status", "ok")), **latencies))
    return BenchEvidence(run_dir=str(file.parent), model=model, deployment=deployment, measured_first_preemption=first,
                    status=status, points=points)


def _has_vllm_results(path: Path) -> bool:
    """A folder of `vllm bench serve` results, one holding a GuideLLM report (JSON or YAML), AIPerf's or
    inference-perf's results, or a folder of AIPerf runs (one artifact folder each)."""

    return (any(path.glob("*.json")) or any((path / name).is_file() for name in GUIDELLM_DEFAULT_FILES)
            or bool(aiperf_result_files(path)))


def _read_external(path: Path, raw: str) -> BenchEvidence:
    """A `vllm bench serve --save-result` file or folder, or a GuideLLM report: latency percentiles per load,
    no preemption evidence (kvplan.bench.external)."""

    try:
        summary = read_external(path)
    except KvplanError as exc:
        raise KvplanError(f"--bench {raw}: {exc.message}", exc.hint or "pass a `kvplan bench` run folder") from None
    points = [EvidencePoint(mode=p.mode, load=p.load, status=p.status, **p.latencies()) for p in summary.points]
    return BenchEvidence(run_dir=str(path), model=summary.model, source=summary.source, shows_preemption=False,
                    points=points)


def slo_checks(runs: list[BenchEvidence], slo: dict[str, float], concurrency: int) -> list[SloCheck]:
    """Each run's closed-loop point at ``concurrency`` (else the lowest above it) against the SLOs."""

    out = []
    for run in runs:
        candidates = sorted((p for p in run.points if p.mode == "concurrency" and p.status == "ok"
                             and p.load >= concurrency), key=lambda p: p.load)
        if not candidates:
            loads = sorted({p.load for p in run.points if p.mode == "concurrency" and p.status == "ok"})
            why = ("it measured request rates, not concurrencies" if run.points and not loads else
                   f"it measured no concurrency >= {concurrency}" + (f" (up to {loads[-1]:g})" if loads else ""))
            out.append(SloCheck(run=run.run_dir, source=run.source, load=None, passed=False,
                                reason=f"cannot show the SLOs at concurrency {concurrency}: {why}"))
            continue
        point = candidates[0]
        checks = slo_results(point.latencies(), slo)
        missing = [k for k, c in checks.items() if c.met is None]
        missed = [k for k, c in checks.items() if c.met is False]
        reason = None
        if missing:
            reason = f"{', '.join(missing)} not in the {run.source} results (cannot show)"
        elif missed:
            reason = "; ".join(f"{k} {fmt_s(checks[k].value)} > {fmt_s(checks[k].target)}" for k in missed)
            reason += f" at concurrency {point.load:g}"
        out.append(SloCheck(run=run.run_dir, source=run.source, load=point.load, checks=checks,
                            passed=not missing and not missed, reason=reason))
    return out


def _model_key(name: str) -> tuple[str, ...]:
    parts = [p for p in re.split(r"[/\\]+", name.strip().lower()) if p and p not in (".", "..", "...")]
    return tuple(parts[-2:])


def _same_model(a: str, b: str) -> bool:
    ka, kb = _model_key(a), _model_key(b)
    if not ka or not kb:
        return False
    if ka == kb:
        return True
    # A local path's last folder against a Hub id's name (".../Llama-3.1-8B" vs "meta-llama/Llama-3.1-8B").
    return ka[-1] == kb[-1] and (len(ka) == 1 or len(kb) == 1)


def match_bench_runs(spec: Spec, runs: list[BenchEvidence]) -> tuple[dict[str, list[BenchEvidence]], list[str]]:
    """Deployment name -> its runs; and notes on runs that match no deployment."""
    names = {e.deployment.name for e in spec.entries}
    by_name: dict[str, list[BenchEvidence]] = {}
    notes: list[str] = []
    for run in runs:
        if run.deployment is not None:
            if run.deployment in names:
                by_name.setdefault(run.deployment, []).append(run)
            else:
                notes.append(f"bench run {run.run_dir} names deployment {run.deployment!r}, which is not in the spec")
            continue
        matched = [e.deployment.name for e in spec.entries if _same_model(e.deployment.model, run.model)]
        for name in matched:
            by_name.setdefault(name, []).append(run)
        if not matched:
            notes.append(f"bench run {run.run_dir} measured {run.model!r}, which no deployment uses")
    return by_name, notes


# --- planning ---------------------------------------------------------------------------------

_SETTING_TO_KEY = {
    "kv_cache_dtype": "kv_cache_dtype",
    "max_model_len": "context",
    "concurrency": "concurrency",
    "gpu": "gpu",
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "max_num_seqs": "max_num_seqs",
}


def spec_change(updates: dict[str, str], flags: str = "") -> str:
    """A planner suggestion as spec keys: {"max_model_len": "12000"} -> ``context: 12000``."""
    if not updates:
        return flags
    return ", ".join(f"{_SETTING_TO_KEY.get(k, k)}: {v}" for k, v in updates.items())


def _field_of(message: str) -> str | None:
    """Which spec key a planner error is about, for the line number."""
    text = message.lower()
    for words, field in ((("prompt", "output"), "prompt"), (("shared-prefix", "shared prefix"), "shared_prefix"),
                         (("tensor parallel", "tp "), "tp"), (("pipeline",), "pp"), (("gpus", "gpu"), "gpu"),
                         (("context", "max_position"), "context"), (("dtype",), "kv_cache_dtype")):
        if any(w in text for w in words):
            return field
    return None


@dataclass
class Planner:
    """Caches models across deployments."""

    file: str
    strict: bool = False  # a plan that fits at the estimate only (not at the low end of its range) fails

    def __post_init__(self) -> None:
        self.models: dict[str, Any] = {}

    def model(self, entry: SpecEntry):
        name = entry.deployment.model
        if name not in self.models:
            try:
                self.models[name] = load_model(name)
            except KvplanError as exc:
                self.models[name] = exc
        found = self.models[name]
        if isinstance(found, KvplanError):
            raise SpecIssue(self.file, entry.line_of("model"), entry.label("model"), found.message, found.hint)
        return found

    def evaluate(self, entry: SpecEntry, bench: list[BenchEvidence]) -> DeploymentResult:
        d = entry.deployment
        model = self.model(entry)
        try:
            gpus = select_gpus(d.gpu, d.gpus, None if d.gpu_mem is None else str(d.gpu_mem))
        except KvplanError as exc:
            field = "gpu_mem" if d.gpu is None else "gpu"
            raise SpecIssue(self.file, entry.line_of(field), entry.label(field), exc.message, exc.hint) from None
        try:
            settings = d.settings(gpus.count)
            settings = replace(settings, speculative=load_draft(settings.speculative))  # its draft's own config
            # As `kvplan size` plans it (user calibrations from `kvplan calibrate` included).
            plan = plan_deployment(model, gpus, settings, d.vllm_version)
            cap = plan.capacity  # one replica's pool and layout, as the plan has them
            work = request_load(settings, cap.max_model_len)
        except KvplanError as exc:
            field = _field_of(exc.message)
            raise SpecIssue(self.file, entry.line_of(field), entry.label(field), exc.message, exc.hint) from None
        replicas = plan.replicas
        per_replica = cdiv(d.concurrency, replicas)
        need = blocks_needed(cap, per_replica, work.request_tokens, work.shared_prefix_tokens)
        usable = cap.usable_blocks
        used = need / usable if usable > 0 else None

        fits, limiting, reason = plan.fits, plan.limiting_term, plan.verdict
        suggestion = None
        if not plan.fits:
            good = [s for s in plan.suggestions if s.fits] or plan.suggestions
            if good:
                suggestion = f"{good[0].change} ({spec_change(good[0].updates, good[0].flags)})"
        elif d.headroom and used is not None and used > 1 - d.headroom:
            fits, limiting = False, "headroom"
            reason = (f"the load takes {used:.1%} of the KV pool ({need:,} of {usable:,} blocks); "
                      f"headroom {d.headroom:.0%} allows at most {1 - d.headroom:.0%}")
            allowed = int((1 - d.headroom) * usable)
            one = blocks_needed(cap, 1, work.request_tokens, work.shared_prefix_tokens)
            each = blocks_needed(cap, 2, work.request_tokens, work.shared_prefix_tokens) - one
            if each > 0 and allowed >= one:
                suggestion = f"lower the concurrency (concurrency: {((allowed - one) // each + 1) * replicas})"
            else:
                suggestion = "lower the context or the concurrency, or add GPUs"
        notes = list(plan.notes)
        work = self._workload(entry, plan, usable) if d.workload else None
        if work is not None:
            kept = work.hit_rate_at_pool / work.achievable_hit_rate if work.achievable_hit_rate else 1.0
            if fits and d.min_hit_share and kept < d.min_hit_share:
                fits, limiting = False, "workload"
                # kept rounded down to 0.1%, the asked share as written: 89.96% must not read "keeps 90%, below 90%"
                kept_pct = math.floor(round(kept * 1000, 6)) / 10
                reason = (f"the pool keeps {kept_pct:g}% of the workload's achievable prefix-cache hits, below the asked "
                          f"{d.min_hit_share * 100:g}% (a pool of {work.pool_for_share.get('90%', 0):,} blocks keeps 90%)")
                suggestion = suggestion or "more KV memory (GPUs, fp8 KV, a shorter context), or a lower min_hit_share"
            elif fits and d.sessions and work.sessions_held_at_once < d.sessions:
                fits, limiting = False, "workload"
                reason = (f"{work.sessions_held_at_once} of the workload's sessions fit the pool at once (their largest "
                          f"turns, the heaviest first); {d.sessions} asked")
                suggestion = suggestion or "more KV memory, or fewer sessions at once"
        if plan.range_note:
            notes.append(f"budget range: {plan.range_note}")
        if fits and not plan.fits_across_range and self.strict:
            fits, limiting = False, "range"
            reason = f"{plan.verdict} at the estimate, but {plan.range_note} (--strict)"
            suggestion = suggestion or "calibrate the budget (kvplan calibrate) or give --kv-memory, or leave more headroom"

        fleet = None
        if d.rate is not None and plan.fits:
            fleet = self._fleet(entry, cap, plan.replicas)
            if fleet.passed:
                notes.append(f"rate: {fleet.reason}")
            elif fits:
                fits, limiting, reason = False, "rate", f"the plan fits, but at {d.rate:g} requests/s {fleet.reason}"
                if fleet.replicas_needed:
                    per = plan.tensor_parallel_size * plan.pipeline_parallel_size
                    suggestion = f"more replicas (gpu: {gpu_flag(cap.device, fleet.replicas_needed * per)})"
            else:
                reason += f"; at {d.rate:g} requests/s {fleet.reason}"
        elif d.rate is not None:
            notes.append("rate: the fleet was not simulated: the plan does not fit")

        check = None
        if bench:
            evidence = [r for r in bench if r.shows_preemption]
            measured = [r.measured_first_preemption for r in evidence if r.measured_first_preemption is not None]
            first = min(measured) if measured else None
            passed = first is None or first >= d.concurrency
            unfinished = [r.run_dir for r in evidence if r.status != "complete"]
            cannot = [f"{r.run_dir} ({r.source}): cannot show preemptions or KV onsets (client-side latencies only)"
                      for r in bench if not r.shows_preemption]
            if unfinished and first is None:
                notes.append("bench: no preemption measured, but these runs did not complete: " + ", ".join(unfinished))
            slo = slo_checks(bench, d.slo, d.concurrency) if d.slo else []
            check = BenchCheck(runs=[r.run_dir for r in bench], measured_first_preemption=first,
                               required_concurrency=d.concurrency, passed=passed and all(c.passed for c in slo),
                               slo=slo, cannot_show=cannot)
            notes += [f"bench: {c}" for c in cannot]
            if not passed:
                if fits:
                    reason = (f"the plan fits, but kvplan bench measured the first preemption at concurrency "
                              f"{first} < the required {d.concurrency}")
                    limiting = "bench"
                    suggestion = f"lower the concurrency (concurrency: {first - 1})" if first > 1 else suggestion
                else:
                    reason += f"; kvplan bench measured the first preemption at concurrency {first}"
                fits = False
            elif not evidence:
                pass
            elif first is None and not unfinished:
                notes.append("bench: no preemption measured in " + ", ".join(r.run_dir for r in evidence))
            else:
                notes.append(f"bench: first preemption at concurrency {first} >= {d.concurrency}")
            bad = [c for c in slo if not c.passed]
            if bad:
                text = "; ".join(f"{c.run}: {c.reason}" for c in bad)
                if fits:
                    reason = f"the plan fits, but the SLOs are not met: {text}"
                    limiting = "slo"
                else:
                    reason += f"; SLOs not met: {text}"
                fits = False
            elif slo:
                notes.append("bench: SLOs met (" + ", ".join(f"{c.run} at concurrency {c.load:g}" for c in slo) + ")")

        return DeploymentResult(
            name=d.name,
            model=plan.model,
            file=self.file,
            line=entry.line,
            gpu=plan.gpu,
            gpu_count=plan.gpu_count,
            vllm_version=plan.vllm_version,
            context_tokens=plan.max_model_len,
            concurrency=d.concurrency,
            request_tokens=plan.request_tokens,
            fits=fits,
            limiting_term=limiting,
            reason=reason,
            suggestion=suggestion,
            pool_blocks=usable,
            blocks_needed=need,
            pool_used=None if used is None else round(used, 4),
            margin=None if used is None else round(1 - used, 4),
            headroom=d.headroom,
            max_concurrency_at_request=plan.max_concurrency_at_request,
            kv_cache_tokens=plan.kv_cache_tokens,
            available_kv_gib=round(plan.available_kv_bytes / 2**30, 2),
            bench=check,
            fleet=fleet,
            workload_hit_rate=None if work is None else work.hit_rate_at_pool,
            workload_kept_share=None if work is None or not work.achievable_hit_rate
            else round(work.hit_rate_at_pool / work.achievable_hit_rate, 4),
            workload_sessions=None if work is None else work.sessions_held_at_once,
            notes=notes,
        )

    def _fleet(self, entry: SpecEntry, cap, replicas: int) -> FleetCheck:
        """``rate:``: each of the deployment's replicas at its share against the SLOs; and the fewest that would do."""
        d = entry.deployment
        searched = max(min(MAX_REPLICAS, max(64, 4 * replicas)), replicas)
        try:
            step = model_for(cap)
            config = SchedulerConfig.from_capacity(cap)  # (a KV cache group the simulator does not model: refused)
        except KvplanError as exc:
            return FleetCheck(rate_per_s=d.rate, replicas=replicas, replicas_needed=None, max_replicas_searched=0,
                              binding="none", passed=False, reason=f"cannot predict its latency ({exc.message})")
        prompt, output = d.prompt, max(1, d.output or 0)
        shared = min(d.shared_prefix, prompt)
        floor = latency_floor(step, prompt, output, cap.limits.max_num_batched_tokens, cached=shared)
        count = replicas_for_rate(config, step, d.rate, prompt, output, d.slo, floor, shared_prefix_tokens=shared,
                                  max_replicas=searched)
        predicted = replica_at(config, step, d.rate, replicas, prompt, output, shared)
        checks = slo_results({"ttft": predicted.ttft, "itl": predicted.itl, "tpot": predicted.tpot,
                              "e2e": predicted.e2e}, d.slo)
        missed = [k for k, c in checks.items() if c.met is False]
        shown = "; ".join(f"{k} {fmt_s(checks[k].value)} > {fmt_s(checks[k].target)}" for k in missed)
        needed = (f"{count.replicas:,} needed" if count.replicas else
                  count.reason or f"none up to {searched:,} meets them")
        fleet = f"{replicas:,} replica" + ("s" if replicas > 1 else "")
        if missed:
            why = f"{fleet} {'miss' if replicas > 1 else 'misses'} the SLOs (predicted {shown}); {needed}"
            if count.replicas:
                why += f" (bound by {count.binding})"
        else:
            why = (f"{fleet} {'meet' if replicas > 1 else 'meets'} the SLOs at {d.rate / replicas:.4g} requests/s each "
                   f"(predicted); {needed}")
        return FleetCheck(rate_per_s=d.rate, replicas=replicas, replicas_needed=count.replicas,
                          max_replicas_searched=searched, binding=count.binding, slo=checks, passed=not missed,
                          reason=why)

    def _workload(self, entry: SpecEntry, plan, usable: int):
        """The deployment's workload file read (relative to the spec) and its working set on the pool."""
        from pathlib import Path

        d = entry.deployment
        path = Path(d.workload).expanduser()
        if not path.is_absolute():
            path = Path(self.file).resolve().parent / path
        options = {k: int(v) if float(v).is_integer() else v for k, v in d.workload_options.items()}
        try:
            traffic = load_traffic(path, **options)
        except KvplanError as exc:
            raise SpecIssue(self.file, entry.line_of("workload"), entry.label("workload"), exc.message, exc.hint) from None
        try:
            groups = HybridGroups.of_capacity(plan.capacity)
            return workload_plan(traffic, plan.block_size, usable, groups,
                                 max_num_batched_tokens=plan.capacity.limits.max_num_batched_tokens)
        except KvplanError as exc:
            raise SpecIssue(self.file, entry.line_of("workload"), entry.label("workload"), exc.message, exc.hint) from None


def check_spec(spec: Spec, bench_runs: list[BenchEvidence] | None = None, strict: bool = False) -> CheckReport:
    """Plan every deployment; SpecErrors (exit 2) if any cannot be planned (unknown model, ...).
    ``strict``: a deployment that fits at the estimate but not at the low end of its budget range fails."""
    planner = Planner(spec.file, strict)
    by_name, notes = match_bench_runs(spec, bench_runs or [])
    results: list[DeploymentResult] = []
    issues: list[SpecIssue] = []
    for entry in spec.entries:
        try:
            results.append(planner.evaluate(entry, by_name.get(entry.deployment.name, [])))
        except SpecIssue as issue:
            issues.append(issue)
    if issues:
        raise SpecErrors(issues)
    failed = sum(not r.fits for r in results)
    return CheckReport(spec=spec.file, ok=failed == 0, total=len(results), passed=len(results) - failed,
                       failed=failed, results=results, notes=notes)
