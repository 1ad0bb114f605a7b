"""`kvplan calibrate --bench RUN`: fit the step-time model to a bench run, and read it back.

The pure fit is kvplan.plan.steptime.calibrate_bench; this module reads the run folder
(run.json: workload, engine flags, pool; points.jsonl: the measured points), builds the base
model (the served model's architecture on the GPU named by ``--gpu`` or the run's
``planner_gpu``; without one, e.g. a CPU engine, on a NOMINAL device whose factors are only
relative to it), and writes the calibrated model to ``RUN/steptime.json``, with the prompt lengths the fit saw and
the data's price of a prompt token (`kvplan.plan.steptime.prompt_token_price`). A run benched with
``--prompt-sweep`` (RUN/prompt_sweep.json, kvplan.bench.prompt_sweep) adds its 1-stream requests to the fit. A prediction reads
it back with `load_steptime` (and says "calibrated").
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvplan.bench.prompt_sweep import read_prompt_sweep
from kvplan.bench.replay import ServedGroups, served_groups
from kvplan.bench.store import RunStore
from kvplan.deploy import load_model, select_gpus
from kvplan.errors import KvplanError
from kvplan.paths import load_user_json, write_file_safely
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.plan.simulate import Lengths, SchedulerConfig
from kvplan.plan.steptime import (
    PromptTokenPrice,
    StepTimeModel,
    calibrate_bench,
    decode_measurements,
    model_for,
    outside_steps_at_one_stream,
    prompt_token_price,
)
from kvplan.vllm.args import EngineArgs
from kvplan.vllm.rules import rules_for

STEPTIME_FILE = "steptime.json"
SCHEMA = 1
# A device with no catalog figures (a CPU engine): the roofline terms in these units, the fitted
# factors relative to them. Only predictions on the same device are meaningful.
NOMINAL_BANDWIDTH_GBPS = 100.0
NOMINAL_TFLOPS = 1.0


@dataclass(frozen=True)
class StepCalibration:
    model: StepTimeModel
    run_dir: str
    model_name: str
    device: str  # catalog name, or "nominal (...)"
    workload: dict[str, Any]
    scheduler: dict[str, Any]
    points_used: list[float]  # concurrencies
    recorded_at: str
    prompt_range: tuple[int, int] | None = None  # the shortest and longest prompt the fit saw, tokens
    prompt_sweep_requests: int = 0  # requests of RUN/prompt_sweep.json fitted too
    prompt_price: PromptTokenPrice | None = None  # the data's price of a prompt token (None: too few lengths)
    held_outside: tuple[float, float] | None = None  # (request rate, s) the engine's own TTFT split held (None: none)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "run_dir": self.run_dir, "model": self.model_name, "device": self.device,
                "workload": self.workload, "scheduler": self.scheduler, "points_used": self.points_used,
                "recorded_at": self.recorded_at, "steptime": asdict(self.model),
                "prompt_tokens_seen": None if self.prompt_range is None else list(self.prompt_range),
                "prompt_sweep_requests": self.prompt_sweep_requests,
                "prompt_token_price": None if self.prompt_price is None else price_json(self.prompt_price),
                "request_overhead_held_ms": None if self.held_outside is None else round(self.held_outside[1] * 1000, 3),
                "request_overhead_held_at_rps": None if self.held_outside is None else round(self.held_outside[0], 3)}


def price_json(price: PromptTokenPrice) -> dict[str, Any]:
    """The price as stored and printed by --json (ms a token, rounded to what the data can say)."""
    return {"requests": price.requests, "prompt_min": price.prompt_min, "prompt_max": price.prompt_max,
            "distinct_lengths": price.distinct_lengths, "data_ms_per_token": round(price.data_ms, 5),
            "data_low_ms_per_token": round(price.data_low_ms, 5), "data_high_ms_per_token": round(price.data_high_ms, 5),
            "confidence": 0.95, "method": "Theil-Sen slope of 1-stream TTFT against prompt tokens, Sen's interval",
            "intercept_ms": round(price.intercept_ms, 3), "model_ms_per_token": round(price.model_ms, 5),
            "model_in_range": price.model_in_range}


def run_inputs(run_dir: Path, gpu: str | None = None, model: str | None = None):
    """(config dict, points, Lengths, SchedulerConfig, base StepTimeModel, device label) of a run folder."""

    store = RunStore.open_existing(run_dir)
    run = store.read_run()
    cfg = run.get("config") or {}
    points = store.read_points()
    if not points:
        raise KvplanError(f"{run_dir} has no measured points (points.jsonl)", "calibrate on a run with finished points")
    capacity = run.get("capacity") or {}
    if not capacity.get("num_blocks") or not capacity.get("block_size"):
        raise KvplanError(f"{run_dir}/run.json does not record the engine's pool (num_blocks, block_size)")
    name = model or run.get("model") or (cfg.get("engine") or {}).get("model")
    if not name:
        raise KvplanError(f"{run_dir} does not name the model", "pass --model org/name")
    d = deployment_inputs(cfg, capacity, name, gpu or cfg.get("planner_gpu"))
    base = model_for(d.capacity, d.device)
    # The points are replayed on the served model's KV cache groups, as bench predicted them (`predictor_for`): one
    # group's pool would let each request hold one group's blocks where vLLM takes blocks in every group.
    served = run_served_groups(cfg, capacity, name, d.scheduler, gpu or cfg.get("planner_gpu"))
    scheduler = d.scheduler
    if served.groups is not None:
        scheduler = replace(scheduler, kv_groups=served.groups)
    elif served.one_full_attention_group is False:
        raise KvplanError(f"cannot calibrate on {run_dir}: {name}'s KV cache is {len(served.kinds)} groups "
                          f"({', '.join(served.kinds)}) taking blocks from one pool, and {served.refused}")
    return cfg, points, workload_lengths(cfg.get("workload") or {}), scheduler, base, d.label, d.model_name


def run_served_groups(cfg: dict[str, Any], capacity: dict[str, Any], name: str, scheduler: SchedulerConfig,
                      gpu: str | None) -> ServedGroups:
    """`served_groups` of a bench run (``cfg``: run.json's config; ``capacity``: the engine's pool): the launched
    engine's flags, its block size and token budget, the release it reported."""
    args = EngineArgs.from_stored(cfg.get("engine")) if cfg.get("engine") else None
    budget = scheduler.max_num_batched_tokens
    return served_groups(name, args, scheduler.block_size, budget if budget < 1 << 30 else None,
                         capacity.get("vllm_version"), gpu)


def workload_lengths(wl: dict[str, Any]) -> Lengths:
    """The simulator's lengths of a run's ``workload`` (the same draws bench sent)."""
    return Lengths(int(wl.get("prompt_tokens") or 512), int(wl.get("output_tokens") or 128),
                   wl.get("distribution") or "fixed", float(wl.get("spread", 0.25)), int(wl.get("seed") or 0),
                   tuple(tuple(p) for p in wl.get("trace") or ()))


@dataclass(frozen=True)
class DeploymentInputs:
    scheduler: SchedulerConfig
    capacity: Any  # kvplan.plan.capacity.Capacity of one replica, on ``device``
    device: Any  # the catalog's GPU, or a NOMINAL one (``nominal``)
    nominal: bool  # no GPU named: the device's figures are placeholders, not a prior
    label: str
    model_name: str


def stated_budget(cfg: dict[str, Any]) -> int | None:
    """The engine's token budget as a run states it (``cfg``: run.json's config): its flags where kvplan launched it,
    ``--max-num-batched-tokens`` where kvplan attached to it; None: not stated."""
    return EngineArgs.from_stored(cfg.get("engine")).max_num_batched_tokens or cfg.get("max_num_batched_tokens")


def deployment_inputs(cfg: dict[str, Any], capacity: dict[str, Any], name: str, gpu: str | None) -> DeploymentInputs:
    """The scheduler (the engine's reported pool, its flags or vLLM's defaults) and the planner's
    capacity of a bench run's deployment (``cfg``: run.json's config; ``capacity``: the engine's
    pool), the model read offline, on the GPU ``gpu`` (else a NOMINAL device)."""

    engine = EngineArgs.from_stored(cfg.get("engine"))
    num_blocks, block_size = capacity.get("num_blocks"), capacity.get("block_size")
    resolved = load_model(name, offline=True)
    if gpu:
        device = select_gpus(gpu).device
        label = device.name
    else:
        device = replace(select_gpus(None, None, "1TiB").device, bandwidth_gbps=NOMINAL_BANDWIDTH_GBPS,
                         bf16_dense_tflops=NOMINAL_TFLOPS)
        label = f"nominal ({NOMINAL_BANDWIDTH_GBPS:g} GB/s, {NOMINAL_TFLOPS:g} TFLOP/s: no --gpu)"
    rules = rules_for(capacity.get("vllm_version"))
    settings = Settings(
        tensor_parallel_size=engine.tensor_parallel_size or 1,
        pipeline_parallel_size=engine.pipeline_parallel_size or 1,
        block_size=block_size, max_model_len=engine.max_model_len,
        num_gpu_blocks_override=num_blocks, kv_cache_memory_bytes=engine.kv_cache_memory_bytes or 2**30,
        max_num_seqs=cfg.get("max_num_seqs"), max_num_batched_tokens=stated_budget(cfg),
        enforce_eager=bool(engine.enforce_eager),
    )
    cap = compute_capacity(resolved.arch, device, settings, rules, load_overhead(), resolved.weights_total)
    sched = SchedulerConfig(num_blocks=num_blocks, block_size=block_size,
                            max_num_seqs=cfg.get("max_num_seqs") or cap.limits.max_num_seqs,
                            max_num_batched_tokens=stated_budget(cfg) or cap.limits.max_num_batched_tokens,
                            admit_full_prompt=rules.admit_full_prompt, max_model_len=engine.max_model_len)
    return DeploymentInputs(sched, cap, device, not gpu, label, resolved.config.name)


def calibrate_run(run_dir: Path, gpu: str | None = None, model: str | None = None,
                  write: bool = True) -> StepCalibration:
    """Fit the step-time model to ``run_dir``'s points; write ``RUN/steptime.json`` unless ``write`` is False."""
    cfg, points, lengths, sched, base, label, name = run_inputs(run_dir, gpu, model)
    wl = cfg.get("workload") or {}
    nominal = label.startswith("nominal (")
    if not nominal:
        _refuse_steps_faster_than_the_device(points, lengths, base, label)
    shared = float(wl.get("shared_prefix") or 0.0)
    ttfts = request_ttfts(run_dir)
    sweep = read_prompt_sweep(run_dir)
    singles = sweep.points() if sweep is not None else []
    fitted = calibrate_bench(points, lengths, sched, base, int(cfg.get("requests_per_stream") or 3),
                             shared, ttfts, singles, sweep.decode_steps() if sweep is not None else (),
                             within_datasheet=not nominal)
    if not nominal:  # a stored fit never makes the device faster than its datasheet (efficiency 1)
        over = fitted.faster_than_datasheet()
        if over:
            raise KvplanError(f"the fit to {run_dir}'s points makes {label} do {' and '.join(over)}: not stored",
                              "the run's points cannot separate the step terms on this GPU: calibrate without "
                              "--gpu (factors relative to a nominal device, for predictions on the run's own device), "
                              "or on a run with more concurrency levels")
    usable = [p for p in points if p.get("status", "ok") == "ok" and not p.get("waited_for_kv")
              and not p.get("preempted") and p.get("mode", "concurrency") == "concurrency"]
    used = [p["concurrency"] for p in usable]
    seen = [lengths(i)[0] for p in usable for i in range(int(p.get("first_index") or 0),
                                                         int(p.get("first_index") or 0) + int(p.get("requests") or 0))]
    seen += [n for n, _ in singles]
    # The data's price: requests that met an idle engine (1-stream points; a shared prefix computes less of its
    # prompt, so its requests are left out) and the sweep's.
    idle = [] if shared else [(lengths(i)[0], t) for p in usable if p.get("concurrency") == 1
                              for i, t in ttfts.get(p.get("seq"), ())]
    price = prompt_token_price(idle + singles, fitted, sched.max_num_batched_tokens)
    result = StepCalibration(
        model=fitted, run_dir=str(run_dir), model_name=name, device=label,
        workload={"prompt_tokens": lengths.prompt, "output_tokens": lengths.output,
                  "distribution": lengths.distribution},
        scheduler=asdict(sched), points_used=used,
        recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        prompt_range=(min(seen), max(seen)) if seen else None, prompt_sweep_requests=len(singles), prompt_price=price,
        held_outside=outside_steps_at_one_stream(usable, lengths, ttfts),  # (what `calibrate_bench` held)
    )
    if write:
        write_file_safely(run_dir / STEPTIME_FILE, json.dumps(result.to_json(), indent=2) + "\n")
    return result


def request_ttfts(run_dir: Path) -> dict[int, list[tuple[int, float]]]:
    """Point ``seq`` -> (request number, TTFT s) of each of its finished requests (RUN/requests.jsonl, streamed:
    first token less the time the client scheduled it, as bench's TTFT); {} when the run has none."""
    out: dict[int, list[tuple[int, float]]] = {}
    try:
        for r in RunStore.open_existing(run_dir).read_requests():
            first, start, seq, index = r.get("first_token_s"), r.get("scheduled_s"), r.get("seq"), r.get("index")
            if not r.get("ok") or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                          for v in (first, start, seq, index)):
                continue
            if math.isfinite(first - start) and first > start:
                out.setdefault(int(seq), []).append((int(index), float(first - start)))
    except (OSError, ValueError, KvplanError):
        return {}
    return out


def _refuse_steps_faster_than_the_device(points: list[dict[str, Any]], lengths: Lengths, base: StepTimeModel,
                                         label: str) -> None:
    """A measured decode step (a point's ITL p50, else TPOT p50) shorter than reading the weights and the KV
    at the device's full bandwidth, or computing the batch at its full FLOP/s, cannot be a step of this
    model on this device: refused rather than fitted (the fit would store a device faster than its
    datasheet, and every prediction made with it would be too fast)."""
    usable = [p for p in points if p.get("status", "ok") == "ok" and p.get("mode", "concurrency") == "concurrency"]
    for batch, seconds in decode_measurements(usable, lengths.prompt, lengths.output):
        floor = max(base.terms(batch))
        if seconds < floor * (1 - 1e-9):
            raise KvplanError(
                f"the run's decode step at concurrency {batch.decode_seqs} ({seconds * 1000:.4g} ms) is faster than "
                f"{label} can run one ({floor * 1000:.4g} ms at its full bandwidth and FLOP/s): not calibrated",
                "name the GPU the run used (--gpu); a run with speculative decoding (several tokens a step) "
                "cannot be calibrated on")


def load_steptime(path: Path) -> StepTimeModel:
    """The calibrated model in ``RUN/steptime.json`` (or that file itself)."""

    file = path / STEPTIME_FILE if path.is_dir() else path
    if not file.exists():
        raise KvplanError(f"{file} does not exist", "run `kvplan calibrate --bench RUN` first")
    data = load_user_json(file, "step-time calibration")
    try:
        names = {f.name for f in fields(StepTimeModel)}
        return StepTimeModel(**{k: v for k, v in data["steptime"].items() if k in names})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KvplanError(f"cannot read the step-time calibration {file}: {type(exc).__name__}: {exc}") from None


def calibrated_prompt_range(path: Path) -> tuple[int, int] | None:
    """The shortest and longest prompt a calibration saw (``prompt_tokens_seen`` of RUN/steptime.json), tokens;
    None when it does not say (a calibration written before it was recorded)."""
    file = path / STEPTIME_FILE if path.is_dir() else path
    try:
        seen = load_user_json(file, "step-time calibration").get("prompt_tokens_seen")
    except (KvplanError, AttributeError):
        return None
    if (isinstance(seen, list) and len(seen) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in seen)
            and 1 <= seen[0] <= seen[1]):
        return seen[0], seen[1]
    return None


def workload_prompt_range(lengths: Lengths, first: int, count: int) -> tuple[int, int]:
    """The shortest and longest prompt of requests ``first`` .. ``first + count - 1`` of a workload (its draws)."""
    prompts = [lengths(i)[0] for i in range(first, first + max(1, count))]
    return min(prompts), max(prompts)


def calibration_scheduler(path: Path) -> dict[str, Any]:
    """The scheduler limits a calibration was fitted under (``scheduler`` of RUN/steptime.json; {} if none)."""

    file = path / STEPTIME_FILE if path.is_dir() else path
    try:
        data = load_user_json(file, "step-time calibration").get("scheduler")
    except (KvplanError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class CalibratedEngine:
    """The deployment a calibration was fitted on (`kvplan fit --rate --steptime RUN`): the engine's scheduler
    (its reported pool, its limits) and the step-time model fitted to its points."""

    scheduler: SchedulerConfig
    model: StepTimeModel
    model_name: str  # the served model, as the calibration names it
    device: str  # the calibration's device label (a catalog GPU, or "nominal (...)" for a CPU engine)
    gpus_per_replica: int  # tensor x pipeline parallel of the run's engine (1 when the run does not say)
    vllm_version: str | None = None  # the release the run's engine reported (None when the run does not say)


#: The calibration's scheduler limits a simulation needs, and the ones it may leave to their defaults.
_SCHEDULER_INTS = ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens")


def calibrated_engine(path: Path) -> CalibratedEngine:
    """RUN/steptime.json (or that file) read as one replica: its scheduler limits, model and device; the run's
    tensor/pipeline parallel sizes from RUN/run.json when RUN is a run folder."""
    file = path / STEPTIME_FILE if path.is_dir() else path
    model = load_steptime(path)
    data = load_user_json(file, "step-time calibration")
    sched = data.get("scheduler") if isinstance(data, dict) else None
    if not isinstance(sched, dict) or not all(
            isinstance(sched.get(k), int) and not isinstance(sched.get(k), bool) and sched[k] >= 1
            for k in _SCHEDULER_INTS):
        raise KvplanError(f"{file} does not record the engine's scheduler (num_blocks, block_size, max_num_seqs, "
                          "max_num_batched_tokens as whole numbers >= 1)", "calibrate again: kvplan calibrate --bench RUN")
    names = {f.name for f in fields(SchedulerConfig)}
    try:
        scheduler = SchedulerConfig(**{k: v for k, v in sched.items() if k in names})
    except (TypeError, ValueError) as exc:
        raise KvplanError(f"cannot read the scheduler of {file}: {exc}") from None
    gpus, version = 1, None
    if path.is_dir() and (path / "run.json").is_file():
        run = RunStore.open_existing(path).read_run()
        engine = EngineArgs.from_stored((run.get("config") or {}).get("engine"))
        gpus = (engine.tensor_parallel_size or 1) * (engine.pipeline_parallel_size or 1)
        reported = (run.get("capacity") or {}).get("vllm_version")
        version = reported if isinstance(reported, str) else None
    return CalibratedEngine(scheduler, model, str(data.get("model") or ""), str(data.get("device") or ""), gpus,
                            version)
