"""`kvplan fit`: search GPU type x count x TP / PP / DP x KV dtype x context cap. Pure.

Every candidate gets a verdict from the planner's own arithmetic (kvplan.plan.capacity): the
pool of one replica is computed once per (GPU, TP, PP, KV dtype), since in vLLM V1 it does not
depend on ``max_model_len``; each context cap then only asks whether one max-length request fits
(vLLM starts) and whether the workload's requests, split over the DP replicas, fit the usable
blocks within ``max_num_seqs`` (`capacity.blocks_needed`, shared prefix counted once). A
candidate whose weights alone exceed its GPUs' memory is rejected before any pool is computed.

Ranking: the fewest GPUs (or, with prices, the lowest price per hour), then no pipeline
parallel before pipeline parallel, the order of ``gpus`` as given (the same GPU before another),
the model's dtype before fp8, the asked context before a cap, fewer replicas. The survivors are
re-planned with `compute_capacity` + `verdict_for` (the same path as `kvplan size`) before they
are shown, and get a latency estimate (kvplan.plan.steptime, prior factors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device
from kvplan.model.arch import Architecture
from kvplan.model.weights import weight_bytes
from kvplan.plan.capacity import Capacity, blocks_needed, compute_capacity, gpu_memory_utilization, moe_split_error
from kvplan.plan.overhead import OverheadModel
from kvplan.plan.schema import Settings
from kvplan.plan.simulate import Lengths, SchedulerConfig, StepBatch, closed_loop
from kvplan.plan.steptime import model_for, predict_latency, prefill_time, quick_latency
from kvplan.units import cdiv
from kvplan.vllm.rules import VllmRules

KV_DTYPES = ("auto", "fp8")
#: kvplan.plan.capacity.moe_split_error: vLLM's fused MoE asserts it (fused_moe/config.py@0.32.0).
MOE_SPLIT_REFUSED = "vLLM will not start: the experts' intermediate size does not divide over tp (no expert parallel)"


@dataclass(frozen=True)
class FitRequest:
    ctx: int
    concurrency: int
    prompt: int | None = None
    output: int | None = None
    shared_prefix: int = 0
    max_gpus: int = 8
    kv_dtypes: tuple[str, ...] = KV_DTYPES
    prices: dict[str, float] = field(default_factory=dict)  # device name -> USD per GPU-hour
    allow_pp: bool = True

    @property
    def request_tokens(self) -> int:
        """Tokens whose KV a request holds at its peak (the last sampled token's is never written)."""
        if self.prompt is None:
            return self.ctx
        return self.prompt + max((self.output or 0) - 1, 0)

    def context_caps(self, limit: int | None) -> list[int]:
        """The asked context, then powers of two down to the request's length (a smaller
        ``--max-model-len`` lets vLLM start where the full context would not)."""
        top = min(self.ctx, limit) if limit else self.ctx
        caps = [top]
        if self.prompt is not None:
            need = self.prompt + (self.output or 0)
            c = 1 << (top - 1).bit_length() - 1 if top > 1 else 1
            while c >= need and c >= 256:
                if c < top:
                    caps.append(c)
                c //= 2
            if need < top and need not in caps:
                caps.append(need)
        return caps


@dataclass(frozen=True)
class Candidate:
    device: Device
    tp: int
    pp: int
    dp: int
    kv_dtype: str
    ctx: int
    fits: bool
    reason: str
    blocks_needed: int = 0
    usable_blocks: int = 0
    price_per_hour: float | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def headroom(self) -> float:
        return 1 - self.blocks_needed / self.usable_blocks if self.usable_blocks else 0.0


@dataclass
class FitResult:
    evaluated: int
    fitting: list[Candidate]
    best_per_gpu: dict[str, Candidate]
    rejected_reasons: dict[str, int]


def _splits(n: int, heads: int, layers: int, allow_pp: bool) -> list[tuple[int, int, int]]:
    """(tp, pp, dp) with tp x pp x dp = n, tp and pp powers of two."""
    out = []
    tp = 1
    while tp <= n:
        pp = 1
        while tp * pp <= n:
            if n % (tp * pp) == 0 and (allow_pp or pp == 1):
                out.append((tp, pp, n // (tp * pp)))
            pp *= 2
        tp *= 2
    return out


def _capacity_key(device: Device) -> tuple:
    """Devices whose capacity arithmetic is the same (name-dependent rules included)."""
    return (device.cuda_total_bytes, device.vendor, "a100" in device.name.lower(), device.is_blackwell,
            device.is_hopper, device.platform)


def search(arch: Architecture, devices: Sequence[Device], req: FitRequest, rules: VllmRules,
           overhead: OverheadModel, weights_total: int | None = None, base: Settings | None = None) -> FitResult:
    """Evaluate every candidate; return those that start and fit, ranked."""
    base = base or Settings()
    if req.concurrency < 1 or req.max_gpus < 1:
        raise KvplanError("fit needs a concurrency >= 1 and --max-gpus >= 1")
    limit = arch.max_model_len_limit
    caps = req.context_caps(limit)
    if req.prompt is not None and req.prompt + (req.output or 0) > caps[0]:
        raise KvplanError(f"prompt {req.prompt:,} + output {req.output or 0:,} tokens exceed the context {caps[0]:,}")
    # A lower bound of any GPU's share, to reject a split before its pool is computed: the
    # checkpoint's own bytes (quantized layers at their bytes, as `kvplan size` prices them; no MXFP4
    # kernel padding, which only adds) spread evenly. compute_capacity has the exact figure.
    weights = weights_total or weight_bytes(arch.params, arch.model_dtype_bytes, arch.quantization)
    evaluated = 0
    fitting: list[Candidate] = []
    reasons: dict[str, int] = {}
    memo: dict[tuple, Capacity | None] = {}
    order = {d.name: i for i, d in enumerate(devices)}
    moe_over_dp = bool(arch.params.experts) and rules.moe_shards_over_dp

    def reject(reason: str, count: int = 1) -> None:
        nonlocal evaluated
        evaluated += count
        reasons[reason] = reasons.get(reason, 0) + count

    for device in devices:
        util = gpu_memory_utilization(base, rules, device)
        for n in range(1, req.max_gpus + 1):
            for tp, pp, dp in _splits(n, arch.num_attention_heads, arch.num_hidden_layers, req.allow_pp):
                per_cands = len(req.kv_dtypes) * len(caps)
                if arch.num_attention_heads % tp or pp > arch.num_hidden_layers:
                    reject("TP does not divide the heads / PP exceeds the layers", per_cands)
                    continue
                # MoE experts are sharded over all tp x dp GPUs (kvplan.plan.capacity): a lower bound here.
                moe_dp = dp if moe_over_dp else 1
                if weights / (tp * pp * moe_dp) >= device.cuda_total_bytes * util:
                    reject("weights exceed the GPUs' memory", per_cands)
                    continue
                if moe_split_error(arch, 1 if _expert_parallel(base, moe_dp) else tp * moe_dp):
                    reject(MOE_SPLIT_REFUSED, per_cands)
                    continue
                per_replica = cdiv(req.concurrency, dp)
                resolved: set[str] = set()  # KV dtypes vLLM ends up with ("auto" and "fp8" can both be fp8_ds_mla)
                for dtype in req.kv_dtypes:
                    key = (_capacity_key(device), tp, pp, moe_dp, dtype)
                    if key not in memo:
                        try:
                            settings = base.replace(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                                    data_parallel_size=dp, kv_cache_dtype=dtype,
                                                    max_model_len=caps[0],
                                                    enable_expert_parallel=_expert_parallel(base, moe_dp))
                            memo[key] = compute_capacity(arch, device, settings, rules, overhead, weights_total)
                        except KvplanError:
                            memo[key] = None
                    cap = memo[key]
                    if cap is None:
                        reject("not a valid vLLM configuration", len(caps))
                        continue
                    if cap.dtype.name in resolved:
                        reject("the same KV dtype as another candidate", len(caps))
                        continue
                    resolved.add(cap.dtype.name)
                    if cap.num_blocks <= 0:
                        reject("no memory left for the KV cache", len(caps))
                        continue
                    available = cap.limiting_stage.available.bytes
                    padding = cap.rules.max_len_check_counts_padding
                    ctx_req = cap.request_context
                    for ctx in caps:
                        evaluated += 1
                        if cap.layout.max_len_bytes(ctx, ctx_req, padding) > available:
                            reasons["vLLM would not start (one max-length request does not fit)"] = \
                                reasons.get("vLLM would not start (one max-length request does not fit)", 0) + 1
                            continue
                        tokens = req.request_tokens if req.prompt is not None else ctx
                        need = blocks_needed(cap, per_replica, tokens, min(req.shared_prefix, tokens))
                        if need > cap.usable_blocks:
                            reasons["the workload does not fit the pool"] = \
                                reasons.get("the workload does not fit the pool", 0) + 1
                            continue
                        if per_replica > cap.limits.max_num_seqs:
                            reasons["above max_num_seqs"] = reasons.get("above max_num_seqs", 0) + 1
                            continue
                        price = req.prices.get(device.name)
                        fitting.append(Candidate(device, tp, pp, dp, dtype, ctx, True, "fits", need,
                                                 cap.usable_blocks, None if price is None else price * n))
    use_price = bool(req.prices)

    def rank(c: Candidate) -> tuple:
        cost = c.price_per_hour if use_price and c.price_per_hour is not None else math.inf
        return (cost if use_price else c.gpus, c.pp > 1, order.get(c.device.name, 0), c.kv_dtype != "auto",
                -c.ctx, c.dp, -c.headroom)

    fitting.sort(key=rank)
    best: dict[str, Candidate] = {}
    for c in fitting:
        best.setdefault(c.device.name, c)
    return FitResult(evaluated, fitting, best, reasons)


def _expert_parallel(base: Settings, moe_dp: int) -> bool:
    """An MoE model over data-parallel replicas is proposed with expert parallel, as vLLM recommends:
    whole experts per GPU load for any rank count, while splitting every expert's matrices over tp x dp
    needs its intermediate size to divide evenly."""
    return base.enable_expert_parallel or moe_dp > 1


def replan(arch: Architecture, cand: Candidate, req: FitRequest, rules: VllmRules, overhead: OverheadModel,
           weights_total: int | None = None, base: Settings | None = None) -> Capacity:
    """The candidate's capacity through the same path as `kvplan size` (at its own context)."""
    base = base or Settings()
    moe_dp = cand.dp if arch.params.experts and rules.moe_shards_over_dp else 1
    settings = base.replace(tensor_parallel_size=cand.tp, pipeline_parallel_size=cand.pp, data_parallel_size=cand.dp,
                            enable_expert_parallel=_expert_parallel(base, moe_dp),
                            kv_cache_dtype=cand.kv_dtype, max_model_len=cand.ctx, concurrency=req.concurrency,
                            prompt_tokens=req.prompt,
                            output_tokens=req.output, shared_prefix_tokens=req.shared_prefix)
    return compute_capacity(arch, cand.device, settings, rules, overhead, weights_total)


def with_device(cand: Candidate, device: Device) -> Candidate:
    return replace(cand, device=device)


# --------------------------------------------------------------------------- predicted latency (SLOs)

#: Percentiles predicted per deployment: every statistic an SLO key can name (kvplan.bench.slo).
LATENCY_QS = (50, 90, 95, 99)
#: Requests each stream sends in the simulated closed loop: the start-up wave and one after it.
REQUESTS_PER_STREAM = 2


def workload_lengths(req: FitRequest, ctx: int) -> tuple[int, int]:
    """(prompt, output) of the simulated requests: the asked ones, or a request filling the context
    with 128 output tokens when no prompt is given (as `kvplan fit` shows its estimate)."""
    output = max(1, req.output or 128)
    prompt = req.prompt if req.prompt is not None else max(1, ctx - output)
    return prompt, output


def latency_floor(model, prompt: int, output: int, token_budget: int, cached: int = 0) -> dict[str, float]:
    """Seconds no simulated request can beat, whatever else runs (a step only gets longer with more
    in it: every term of the step-time model is >= 0): TTFT >= its prompt's chunks after the
    ``cached`` tokens a prefix-cache hit can skip (a shared prefix) each computed alone (+ the
    request overhead), every ITL and TPOT >= one decode step of one sequence at the
    prompt's context, E2E >= both. Lets a search skip deployments an SLO rules out without
    simulating them."""

    done = min(max(0, cached), prompt - 1)
    ttft = prefill_time(model, prompt - done, max(1, token_budget), context=done)
    decode = model(StepBatch(0, 1, prompt + 1, 1, prompt + 1))
    ttft += model.request_overhead_s
    return {"ttft": ttft, "itl": decode, "tpot": decode, "e2e": ttft + max(0, output - 1) * decode}


def predict_deployment(cap: Capacity, req: FitRequest, dp: int, model=None):
    """Simulated latency of one replica of ``cap`` serving its share of the workload, with the
    step-time prior (or ``model``): a kvplan.plan.steptime.LatencyPrediction with p50/p90/p95/p99
    and mean; its throughput is the replica's.

    The load: ``ceil(concurrency / dp)`` closed-loop streams of `REQUESTS_PER_STREAM` requests
    each (the shared prefix counted once), in steady state: the streams' first requests are
    spread evenly over one request's estimated end-to-end time (`quick_latency`) instead of all
    arriving at once, as users of a running service do. (`kvplan bench`'s closed loop starts
    every stream at once; its TTFT tail includes that start-up burst.)"""

    model = model or model_for(cap)
    prompt, output = workload_lengths(req, cap.max_model_len)
    streams = cdiv(req.concurrency, dp)
    e2e = quick_latency(model, prompt, output, streams)["e2e_s"]
    gap = e2e / streams if math.isfinite(e2e) else 0.0

    def stagger(number: int) -> float:
        return number * gap if number < streams else 0.0

    load = closed_loop(streams, Lengths(prompt, output), REQUESTS_PER_STREAM,
                       shared_prefix_tokens=min(req.shared_prefix, prompt), client_delay=stagger)
    return predict_latency(SchedulerConfig.from_capacity(cap), load, model, LATENCY_QS, mean=True)
