"""Predicted latency of every bench point: the scheduler simulator (kvplan.plan.simulate) replays
the point's own load (its streams and request numbers, or its rate's very arrival times, the
workload's lengths and shared prefix) on the engine's reported pool, each step timed by the
step-time model (kvplan.plan.steptime): calibrated (``--steptime RUN``), or the prior of the GPU
``--gpu`` names. A CPU engine (or an unnamed GPU) has no prior: the run says so and predicts
nothing rather than invent one.

The points run one after another on one engine, whose prefix cache outlives each (vLLM's `BlockPool` is the
engine's, v1/core/block_pool.py@0.32.0): so each point is simulated on the pool the warm-up (`runner._warm_up`:
requests 0 .. first point's first - 1, one a stream, all at once) and the earlier points' simulations left
(`simulate`'s ``start``), in the order the points are predicted. A point's first requests then hit the shared
prefix the warm-up cached, as on the engine. Against a ``--url`` server that served other traffic before, the
carried pool knows only kvplan's own requests: the predicted hits are a lower bound (when nothing else runs during
the bench).

Simulating costs ~3.5-10 us per output token on one core, so a point is simulated on at most
`MAX_SIMULATED_TOKENS` output tokens (fewer requests per stream, or the first arrivals of a
rate); a point whose first wave alone is far above that is not simulated (it says why).
"""

from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvplan.bench import store as st
from kvplan.bench.loadgen import arrival_times
from kvplan.bench.render import load_summary
from kvplan.bench.replay import ServedGroups
from kvplan.bench.results import BenchSummary, LatencyModelInfo, LatencyStats, PointResult, PredictedLatency
from kvplan.bench.steptime_io import (
    calibrated_prompt_range,
    calibration_scheduler,
    deployment_inputs,
    load_steptime,
    run_served_groups,
    stated_budget,
    workload_lengths,
    workload_prompt_range,
)
from kvplan.errors import KvplanError
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.simulate import EMPTY_POOL, CarriedPool, Lengths, Load, SchedulerConfig, closed_loop, open_loop
from kvplan.plan.steptime import StepTimeModel, model_for, predict_latency, prior_for, prompt_range_note
from kvplan.vllm.args import EngineArgs

#: Output tokens simulated per point at most: 0.7-2 s on one core (3.5-10 us a token, busy or not).
MAX_SIMULATED_TOKENS = 200_000
#: A closed loop's first wave (one request a stream) is simulated whole up to twice that; beyond, not at all.
MAX_FIRST_WAVE = 2 * MAX_SIMULATED_TOKENS
PERCENTILES = (50, 99)
#: `LatencyModelInfo.pool`: how each point's prediction starts (and, attached to a server, why hits may be more).
CARRIED_POOL = "Each point starts on the prefix cache the warm-up and the earlier points left, as the engine's pool does"
CARRIED_POOL_URL = ("; the server may have served other traffic before, which kvplan cannot see: "
                    "the predicted prefix hits are a lower bound")


@dataclass(frozen=True)
class PointPredictor:
    """What every point of a run is predicted with (None ``model``: nothing is, ``info`` says why)."""

    info: LatencyModelInfo
    scheduler: SchedulerConfig | None = None
    model: StepTimeModel | None = None
    lengths: Lengths | None = None
    shared_prefix: float = 0.0
    requests_per_stream: int | None = None
    burstiness: float = 1.0
    seed: int = 0
    calibrated_prompts: tuple[int, int] | None = None  # the prompt lengths the calibration saw (None: unknown)
    #: The pool the points predicted so far left ("pool": a `CarriedPool`; none yet: the warm-up's comes first), and
    #: the request number after the last point's ("next").
    carried: dict = field(default_factory=dict, compare=False, repr=False)

    def info_for(self, points: list[PointResult]) -> LatencyModelInfo:
        """``info``, with a note when the prompts the ``points`` sent (their request numbers' draws) leave the
        lengths the calibration saw."""
        sent = [workload_prompt_range(self.lengths, p.first_index, p.requests) for p in points
                if self.lengths is not None and p.status == "ok" and p.requests]
        if self.calibrated_prompts is None or not sent:
            return self.info
        note = prompt_range_note(self.calibrated_prompts, (min(lo for lo, _ in sent), max(hi for _, hi in sent)))
        return self.info.model_copy(update={"note": note}) if note else self.info

    def predict(self, point: PointResult) -> PredictedLatency | None:
        if self.model is None or self.scheduler is None or self.lengths is None or point.status != "ok":
            return None
        start = self._start(point) if self.scheduler.prefix_caching else None
        predicted, after = _predict(self.scheduler, self.model, self.lengths, point, self.shared_prefix,
                                    self.requests_per_stream, self.burstiness, self.seed, start)
        if after is not None:
            self.carried["pool"] = after
        return predicted

    def _start(self, point: PointResult) -> CarriedPool:
        """The pool ``point`` starts from: the earlier points', else the warm-up's (the requests numbered before
        the first point, one a stream at once), else an empty one (no warm-up; or it cannot be simulated)."""
        # Numbered before the requests predicted last: a new bench session (--resume numbers from 0 again, after a
        # warm-up of its own), whose prompts share no block with the earlier one's (another nonce).
        if point.first_index < self.carried.get("next", 0):
            self.carried.clear()
        self.carried["next"] = point.first_index + point.requests
        if "pool" not in self.carried and self.lengths is not None and self.scheduler is not None:
            self.carried["pool"] = warm_up_pool(self.scheduler, self.lengths, point.first_index, self.shared_prefix)
        return self.carried["pool"]


def warm_up_pool(scheduler: SchedulerConfig, lengths: Lengths, first_index: int, shared_prefix: float = 0.0) -> CarriedPool:
    """The pool bench's warm-up leaves (`runner._warm_up`): requests 0 .. ``first_index`` - 1 (the first point's
    first request number), one a stream, all at once. Its pool does not depend on step times (one wave, nothing
    arrives later). An empty pool when there was no warm-up (``first_index`` 0) or it cannot be simulated."""
    if first_index <= 0:
        return EMPTY_POOL
    with suppress(KvplanError):
        pool = simulate_groups(scheduler, closed_loop(first_index, lengths, 1, 0, shared_prefix=shared_prefix),
                               scheduler.kv_groups, start=EMPTY_POOL).pool_after
        if pool is not None:
            return pool
    return EMPTY_POOL


def no_prediction(reason: str) -> PointPredictor:
    return PointPredictor(LatencyModelInfo(source="none", basis=reason))


def predictor_for(cfg: dict[str, Any], capacity: dict[str, Any], model_name: str | None,
                  steptime: Path | None = None, served: ServedGroups | None = None) -> PointPredictor:
    """The predictor of a run (``cfg``: the BenchConfig as JSON; ``capacity``: the engine's pool):
    the calibrated model in ``steptime`` (a run folder or its steptime.json), else the prior of
    ``cfg["planner_gpu"]``, else none ("no prior for this device").

    On the served model's KV cache groups (``served``: the run's `served_groups`, read here when not given): a
    model with several (sliding-window, chunked-local or recurrent-state layers beside full attention) holds blocks
    in each, so its points run the hybrid scheduler (kvplan.plan.hybrid_sim) on an empty pool; a group kvplan does
    not model gets no prediction, and the reason."""

    if not capacity.get("num_blocks") or not capacity.get("block_size"):
        return no_prediction("the engine's KV pool is unknown (no log line, no cache_config_info)")
    gpu = cfg.get("planner_gpu")
    if steptime is None and not gpu:
        return no_prediction("no prior for this device (a CPU engine, or a GPU not named): pass --gpu, or "
                             "--steptime RUN calibrated with kvplan calibrate --bench")
    name = model_name or (cfg.get("engine") or {}).get("model")
    wl = cfg.get("workload") or {}
    try:
        if not name:
            raise KvplanError("the served model is unknown")
        d = deployment_inputs(cfg, capacity, name, gpu)
        scheduler = d.scheduler
    except KvplanError as exc:
        limits = calibration_scheduler(steptime) if steptime is not None else {}
        if not limits:
            return no_prediction(f"cannot plan the deployment: {str(exc).splitlines()[0]}")
        # The model's config is not at hand (attached, offline): the limits the calibration ran under.
        d, scheduler = None, _scheduler_from(cfg, capacity, limits)
    if served is None:
        served = run_served_groups(cfg, capacity, name, scheduler, gpu)
    groups_note = ""
    if served.groups is not None:
        scheduler = replace(scheduler, kv_groups=served.groups)
        groups_note = f"; KV cache groups {served.groups.describe()} (hybrid scheduler)"
    elif served.one_full_attention_group is False:
        return no_prediction(f"latency not simulated: the model's KV cache is {len(served.kinds)} groups "
                             f"({', '.join(served.kinds)}) taking blocks from one pool, and {served.refused}")
    elif served.unknown:
        groups_note = f"; one full-attention KV cache group assumed ({served.unknown})"
    attached = "" if cfg.get("engine") else "; attached: tp and pp taken as 1"
    if steptime is not None:
        model = load_steptime(steptime)
        info = LatencyModelInfo(source="calibrated", basis=f"kvplan calibrate --bench {steptime}"
                                + ("" if d is not None else "; scheduler limits of the calibration") + groups_note)
    else:
        try:
            model = model_for(d.capacity, d.device)
        except KvplanError as exc:
            return no_prediction(str(exc).splitlines()[0])
        info = LatencyModelInfo(source="prior", basis=f"{d.device.name}: catalog bandwidth and dense TFLOP/s, "
                                f"efficiencies {prior_for(d.device).basis}{attached}{groups_note}")
    if scheduler.prefix_caching:
        info = info.model_copy(update={"pool": CARRIED_POOL + ("" if cfg.get("engine") else CARRIED_POOL_URL)})
    return PointPredictor(info, scheduler, model, workload_lengths(wl), float(wl.get("shared_prefix") or 0.0),
                          cfg.get("requests_per_stream"), float(cfg.get("burstiness") or 1.0), int(wl.get("seed") or 0),
                          calibrated_prompt_range(steptime) if steptime is not None else None)


def _scheduler_from(cfg: dict[str, Any], capacity: dict[str, Any], limits: dict[str, Any]) -> SchedulerConfig:
    """The engine's pool, its flags (or the budget bench was told: `stated_budget`) where given, else ``limits`` (a
    calibration's SchedulerConfig)."""
    engine = EngineArgs.from_stored(cfg.get("engine"))
    return SchedulerConfig(
        num_blocks=int(capacity["num_blocks"]), block_size=int(capacity["block_size"]),
        max_num_seqs=int(cfg.get("max_num_seqs") or limits.get("max_num_seqs") or 1 << 30),
        max_num_batched_tokens=int(stated_budget(cfg) or limits.get("max_num_batched_tokens") or 1 << 30),
        admit_full_prompt=bool(limits.get("admit_full_prompt", True)), max_model_len=engine.max_model_len)


def point_load(point: PointResult, lengths: Lengths, shared_prefix: float = 0.0, requests_per_stream: int | None = None,
               burstiness: float = 1.0, seed: int = 0) -> tuple[Load, int]:
    """The load bench sent in ``point`` (bounded), and how many requests it simulates.

    Closed loop: ``concurrency`` streams from the point's first request number, each sending
    ``requests_per_stream`` (else ceil(requests / streams): bench hands a shared budget out in
    order, so with length distributions the numbering is approximate). Open loop: the
    point's own arrival times (kvplan.bench.loadgen.arrival_times, seeded by the workload's seed
    plus the point's ``seq``); a client-side cap on requests in flight is not modelled."""

    mean_output = _mean_output(lengths)
    if point.mode == "rate" and point.rate:
        n = max(1, min(point.requests, MAX_SIMULATED_TOKENS // mean_output))
        times = arrival_times(point.rate, n, None, point.burstiness or burstiness, seed + point.seq)
        return open_loop(times, lengths, point.first_index, shared_prefix=shared_prefix), n
    streams = max(1, point.concurrency)
    # Without --requests-per-stream the streams share the point's budget: ceil, so no request sent is left out.
    per_stream = requests_per_stream or max(1, math.ceil(point.requests / streams))
    if streams * mean_output > MAX_FIRST_WAVE:
        raise KvplanError(f"{streams} streams of ~{mean_output} output tokens are too many to simulate "
                          f"(at most {MAX_FIRST_WAVE:,} tokens)")
    per_stream = max(1, min(per_stream, MAX_SIMULATED_TOKENS // (streams * mean_output)))
    return closed_loop(streams, lengths, per_stream, point.first_index, shared_prefix=shared_prefix), \
        streams * per_stream


def _mean_output(lengths: Lengths) -> int:
    if lengths.trace:
        return max(1, round(sum(o for _, o in lengths.trace) / len(lengths.trace)))
    return max(1, lengths.output)


def predict_point(scheduler: SchedulerConfig, model: StepTimeModel, lengths: Lengths, point: PointResult,
                  shared_prefix: float = 0.0, requests_per_stream: int | None = None, burstiness: float = 1.0,
                  seed: int = 0) -> PredictedLatency:
    """TTFT / ITL / TPOT / E2E p50 and p99 and output tokens/s the simulator predicts for ``point`` on an empty pool."""
    return _predict(scheduler, model, lengths, point, shared_prefix, requests_per_stream, burstiness, seed)[0]


def _predict(scheduler: SchedulerConfig, model: StepTimeModel, lengths: Lengths, point: PointResult,
             shared_prefix: float = 0.0, requests_per_stream: int | None = None, burstiness: float = 1.0,
             seed: int = 0, start: CarriedPool | None = None) -> tuple[PredictedLatency, CarriedPool | None]:
    """`predict_point` from the pool ``start`` (None: empty), and the pool the point left (None: not kept)."""
    try:
        load, n = point_load(point, lengths, shared_prefix, requests_per_stream, burstiness, seed)
        pred = predict_latency(scheduler, load, model, PERCENTILES, start=start)
    except KvplanError as exc:
        return PredictedLatency(source=model.source, error=str(exc).splitlines()[0]), None

    def stats(d: dict[str, float | None]) -> LatencyStats:
        return LatencyStats(p50=_round(d.get("p50")), p99=_round(d.get("p99")))

    return PredictedLatency(source=model.source, ttft=stats(pred.ttft), itl=stats(pred.itl), tpot=stats(pred.tpot),
                            e2e=stats(pred.e2e), output_tokens_per_s=round(pred.output_tokens_per_s, 2),
                            simulated_requests=n, carried_pool=start is not None or None,
                            prefix_hit_rate=_round(pred.prefix_hits / pred.prefix_queries)
                            if pred.prefix_queries else None), pred.pool_after


def _round(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)


def predict_run(path: Path, steptime: Path | None = None, gpu: str | None = None) -> BenchSummary:
    """A finished run's summary with every point's latency predicted again, offline (``kvplan report``):
    with the calibrated model in ``steptime``, else the prior of ``gpu`` (or the run's own --gpu)."""

    summary = load_summary(path)
    run = st.RunStore.open_existing(path).read_run()
    cfg = dict(run.get("config") or {})
    if gpu:
        cfg["planner_gpu"] = gpu
    predictor = predictor_for(cfg, run.get("capacity") or {}, run.get("model") or summary.model or None, steptime)
    points = [p.model_copy(update={"predicted_latency": predictor.predict(p)}) for p in summary.points]
    return summary.model_copy(update={"points": points, "latency_model": predictor.info_for(summary.points)})
