"""How long one engine step takes, and the latency a load gets from it. Pure.

One step computes ``prefill_tokens`` + ``decode_seqs`` tokens and reads every scheduled
request's KV (kvplan.plan.simulate.StepBatch). Per device (one TP rank), a roofline:

    t = overhead
      + (weight_bytes + kv_tokens_read x kv_bytes_per_token) / bandwidth  / mem_efficiency
      + (tokens x linear_flops_per_token + attention_pairs x attn_flops_per_pair) / peak_flops / compute_efficiency

The two roofline terms are added in the priors. A calibration (`calibrate_bench`) takes the longer of the two
instead (``overlap``: the step's memory reads and arithmetic overlap, so a small decode batch costs the memory it
reads and a prompt the arithmetic it does), which `StepTimeModel.terms` writes as the same sum with the shorter term
0, fixed round by round. Either way the three factors (overhead, 1 / mem_efficiency, 1 / compute_efficiency) enter
linearly and `calibrate_steptime` fits them by least squares from measured steps.

``linear_flops_per_token`` is 2 x the parameters per device, all of them (for a MoE model an upper bound: a token
goes through ``num_experts_per_tok`` of the routed experts, but no MoE measurement here says what share of peak their
kernels reach, so the bound is kept);
``attn_flops_per_pair`` is 4 x attention layers x (heads x head size) per device (QK^T and AV), as full
attention (sparse attention, DeepSeek-V3.2 / V4, computes less: an upper bound there too).

The priors (efficiencies and overhead by device class) are assumptions, not measurements: a
prediction says "prior" until calibrated on a bench run.

``request_overhead_s`` is the time a request spends outside engine steps (HTTP, tokenizing, the
API server's queues, detokenizing the first token): the simulator does not model the API server,
so `predict_latency` adds it to TTFT and E2E and, in a closed loop, delays each stream's next
request by it. The API server is one event loop that also handles every other request, so that
time grows with the load: ``request_overhead_per_rps_s2`` more per request/s the server handles
(the request rate is the simulation's own, found by a fixed-point iteration). Both priors are 0;
`calibrate_bench` fits the step factors and a constant request overhead together to the decode steps
and each point's TTFT (a prompt's step is what tells compute from the KV read), then the request
overhead's line against each point's measured request rate. With one prompt length the prompt steps
of a point differ only in how many prompts they batch: what the batch size cannot explain, the
request overhead absorbs. With drawn lengths and the run's per-request TTFTs, each point gives a row
for its shorter and one for its longer prompts instead (`ttft_groups`), which is what prices a prompt
token apart from the request overhead (as well as the spread of the calibration's prompts allows:
a 64-token lognormal workload spans about 54 to 75 tokens between its halves' medians).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kvplan.errors import KvplanError
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.simulate import CarriedPool, Load, SchedulerConfig, SimResult, StepBatch, closed_loop, simulate
from kvplan.stats import theil_sen, theil_sen_interval

#: The efficiency a fit gives a term the data drop (held at 0): that memory or arithmetic is free. Anything above a
#: tenth of it is such a term (the throughput rounds scale it).
DROPPED_EFFICIENCY = 1e9


@dataclass(frozen=True)
class StepTimeModel:
    """A device x model step-time model; seconds per step."""

    weight_bytes: float  # read once per step, per device
    kv_bytes_per_token: float  # per device
    linear_flops_per_token: float  # per device
    attn_flops_per_pair: float  # per device, per (query, key) pair
    bandwidth_bytes_s: float
    peak_flops: float
    mem_efficiency: float = 0.75
    compute_efficiency: float = 0.5
    overhead_s: float = 0.004
    source: str = "prior"  # prior | calibrated
    request_overhead_s: float = 0.0  # per request, outside the engine's steps (API server)
    request_overhead_per_rps_s2: float = 0.0  # more of it per request/s of load (the API server's queue)
    # A step takes the longer of its memory and compute time (the roofline), not their sum: a calibration's
    # (`calibrate_bench`), where a decoding sequence then costs only the memory a small batch reads, as the engine's
    # decode steps show. Priors add them (False; as do calibrations stored before 2026-12-06).
    overlap: bool = False

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_s <= 0 or self.peak_flops <= 0:
            raise KvplanError("the step-time model needs a device bandwidth and peak FLOP/s > 0")
        if not isinstance(self.overlap, bool):
            raise KvplanError("the step-time model's overlap must be true or false")
        if self.mem_efficiency <= 0 or self.compute_efficiency <= 0 or self.overhead_s < 0 \
                or self.request_overhead_s < 0 or self.request_overhead_per_rps_s2 < 0:
            raise KvplanError("efficiencies must be > 0 and the overheads >= 0")

    def faster_than_datasheet(self) -> list[str]:
        """What this model makes its device do faster than its datasheet (an efficiency above 1, a term a fit dropped
        among them), as phrases with the efficiency; [] when nothing. `kvplan calibrate --gpu` stores no such fit."""
        return [f"{what} (efficiency {eff:.4g})" for what, eff in
                (("memory faster than its bandwidth", self.mem_efficiency),
                 ("arithmetic faster than its peak FLOP/s", self.compute_efficiency)) if eff > 1 + 1e-9]

    def steps_scaled(self, factor: float) -> StepTimeModel:
        """This model with every engine step ``factor`` times as long (its overhead and both terms; the request
        overhead, outside the steps, as it is). Either form keeps its bounding term: both terms scale alike."""
        if not factor > 0:
            raise KvplanError(f"a step-time scale must be > 0, not {factor}")
        return replace(self, overhead_s=self.overhead_s * factor, mem_efficiency=self.mem_efficiency / factor,
                       compute_efficiency=self.compute_efficiency / factor)

    def request_overhead_at(self, requests_per_s: float) -> float:
        """Seconds a request spends outside the engine's steps at this request rate."""
        return self.request_overhead_s + self.request_overhead_per_rps_s2 * max(0.0, requests_per_s)

    def terms(self, batch: StepBatch) -> tuple[float, float]:
        """The ideal memory and compute seconds of a step (before efficiencies), the one that does not bound it 0 when
        they ``overlap``: a step costs overhead + memory / mem_efficiency + compute / compute_efficiency either way,
        so fits stay linear in the factors. A term not found (an efficiency above a tenth of `DROPPED_EFFICIENCY`,
        only while a calibration looks for it) bounds no step: a decode-only step is taken as reading memory, any other
        as computing, so that both terms have steps to be found in."""
        return self._terms(batch.prefill_tokens, batch.decode_seqs, batch.kv_tokens_read, batch.attention_pairs)

    def _terms(self, prefill_tokens: int, decode_seqs: int, kv_tokens_read: int, attention_pairs: int) -> tuple[float, float]:
        mem = (self.weight_bytes + kv_tokens_read * self.kv_bytes_per_token) / self.bandwidth_bytes_s
        tokens = prefill_tokens + decode_seqs
        compute = (tokens * self.linear_flops_per_token + attention_pairs * self.attn_flops_per_pair) / self.peak_flops
        if not self.overlap:
            return mem, compute
        if max(self.mem_efficiency, self.compute_efficiency) > DROPPED_EFFICIENCY / 10:
            return (mem, 0.0) if not prefill_tokens else (0.0, compute)
        return (mem, 0.0) if mem / self.mem_efficiency >= compute / self.compute_efficiency else (0.0, compute)

    def __call__(self, batch: StepBatch) -> float:
        return self._seconds(*self.terms(batch))

    def decode_seconds(self, decode_seqs: int, kv_tokens_read: int) -> float:
        """``self(decode_batch(decode_seqs, kv_tokens_read))``, to the bit, without making the batch: the simulator's
        steady decode steps (`_Scheduler._decode_steps`) price millions of them on a large trace."""
        return self._seconds(*self._terms(0, decode_seqs, kv_tokens_read, kv_tokens_read))

    def _seconds(self, mem: float, compute: float) -> float:
        return self.overhead_s + mem / self.mem_efficiency + compute / self.compute_efficiency


@dataclass(frozen=True)
class Prior:
    mem_efficiency: float
    compute_efficiency: float
    overhead_s: float
    basis: str


#: Efficiency priors by device class: assumptions (typical of memory-bound decode reaching
#: 70-80% of peak bandwidth on datacenter GPUs and prefill GEMMs about half of dense peak),
#: to be replaced by `calibrate_steptime` on a bench run of the device.
PRIORS = {
    "datacenter": Prior(0.75, 0.5, 0.004, "assumed: NVIDIA datacenter GPU"),
    "consumer": Prior(0.7, 0.45, 0.005, "assumed: workstation / GeForce GPU"),
    "amd": Prior(0.6, 0.35, 0.006, "assumed: AMD Instinct (ROCm)"),
}


def prior_for(device) -> Prior:
    name = device.name.upper()
    if device.vendor == "amd":
        return PRIORS["amd"]
    if name.startswith(("RTX", "GB10", "A10", "L4", "T4")) or "RTX" in name:
        return PRIORS["consumer"]
    return PRIORS["datacenter"]


def model_for(cap, device=None, prior: Prior | None = None) -> StepTimeModel:
    """The prior step-time model of one replica of a kvplan.plan.capacity.Capacity.

    Tensor parallel splits every step's weights, KV and FLOPs over ``tp`` devices. Pipeline parallel
    does not shorten a step: a token passes the ``pp`` stages in turn, each reading its share of the
    weights and KV, so one step takes the sum of the stages (the limiting stage times ``pp``). vLLM
    keeps ``pp`` batches in flight, which raises throughput; that overlap is not modelled here, so
    PP throughput is a lower bound."""
    device = device or cap.device
    if not device.bandwidth_gbps or not device.bf16_dense_tflops:
        raise KvplanError(f"{device.name}: the catalog has no bandwidth or dense TFLOP/s for it",
                          "latency needs both (or calibrate on a bench run)")
    prior = prior or prior_for(device)
    arch = cap.arch
    tp = cap.settings.tensor_parallel_size
    pp = cap.settings.pipeline_parallel_size
    head_dim_total = arch.hidden_size  # heads x head size ~ hidden size for the attention FLOPs
    # decoder layers with attention (an MLA layer's indexer, DeepSeek-V4's several caches: one layer)
    attn_layers = len({i for s, i in zip(arch.layers, arch.layer_index) if s.grows_with_tokens})
    return StepTimeModel(
        weight_bytes=cap.limiting_stage.weights * pp,
        kv_bytes_per_token=cap.layout.kv_bytes_per_token() * pp,
        linear_flops_per_token=2 * arch.params.total / tp,
        attn_flops_per_pair=4 * attn_layers * head_dim_total / tp,
        bandwidth_bytes_s=device.bandwidth_gbps * 1e9,
        peak_flops=device.bf16_dense_tflops * 1e12,
        mem_efficiency=prior.mem_efficiency,
        compute_efficiency=prior.compute_efficiency,
        overhead_s=prior.overhead_s,
    )


def calibrate_steptime(measurements: Sequence[tuple[StepBatch, float]], base: StepTimeModel) -> StepTimeModel:
    """Least-squares fit of (overhead, 1 / mem_efficiency, 1 / compute_efficiency) to measured
    (batch, seconds) pairs; a coefficient the data push below zero is dropped (held at its
    bound) and the rest refitted. Needs at least as many distinct measurements as free terms."""
    if not measurements:
        raise KvplanError("calibration needs measured steps")
    rows = [([1.0, *base.terms(b)], t) for b, t in measurements]
    return _with_step_terms(base, _fit_nonnegative(rows, drop_order=(2, 1, 0)))


def _with_step_terms(base: StepTimeModel, coef: list[float]) -> StepTimeModel:
    """``base`` with (overhead, 1 / mem_efficiency, 1 / compute_efficiency) = ``coef[:3]``."""
    overhead, mem, compute = coef[:3]
    return replace(
        base,
        overhead_s=overhead,
        mem_efficiency=1 / mem if mem else DROPPED_EFFICIENCY,  # no memory term left: free memory
        compute_efficiency=1 / compute if compute else DROPPED_EFFICIENCY,
        source="calibrated",
    )


def _fit_nonnegative(rows: Sequence[tuple[list[float], float]], drop_order: Sequence[int]) -> list[float]:
    """Coefficients >= 0 of ``y ~ features`` by least squares: a coefficient the data push to zero or
    below is held at 0 and the rest refitted; when the columns cannot be separated, the first free one
    in ``drop_order`` is held at 0 (a term the steps do not show: a constant, a free memory)."""
    width = len(rows[0][0])
    free = [j for j in range(width) if any(f[j] for f, _ in rows)]  # a column of zeros says nothing
    while True:
        if not free:
            raise KvplanError("the measured steps give no positive step-time terms")
        coef = _lstsq([[f[j] for j in free] for f, _ in rows], [y for _, y in rows])
        if coef is None:
            if len(free) == 1:
                raise KvplanError("the measured steps cannot separate the step-time terms")
            free.remove(next(j for j in drop_order if j in free))
            continue
        bad = [j for j, c in zip(free, coef) if c <= 0]
        if not bad:
            break
        free = [j for j in free if j not in bad]
    values = [0.0] * width
    for j, c in zip(free, coef):
        values[j] = c
    return values


def _lstsq(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Normal equations with column scaling, solved by Gaussian elimination (None: singular)."""
    n = len(a[0])
    scale = [max(abs(r[j]) for r in a) or 1.0 for j in range(n)]
    a = [[r[j] / scale[j] for j in range(n)] for r in a]
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] * v for r, v in zip(a, y))] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, max(abs(x) for row in m for x in row[:n])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * p for x, p in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


def decode_measurements(points: Sequence[dict], prompt: int, output: int) -> list[tuple[StepBatch, float]]:
    """(batch, seconds) pairs from bench points (their ``concurrency`` and ``itl`` p50, else
    ``tpot`` p50): at ``c`` streams the engine mostly decodes ``c`` sequences of about
    ``prompt + output / 2`` tokens, one step per output token. The ITL median (hundreds of
    gaps a point) is the typical step; TPOT (one value a request) is the fallback."""
    out = []
    for p in points:
        c = p.get("concurrency")
        lat = (p.get("itl") or {}).get("p50") or (p.get("tpot") or {}).get("p50")
        if not c or not lat or lat <= 0 or p.get("status", "ok") != "ok":
            continue
        ctx = prompt + output // 2
        out.append((StepBatch(prefill_tokens=0, decode_seqs=c, kv_tokens_read=c * ctx, num_seqs=c,
                              attention_pairs=c * ctx), float(lat)))
    return out


@dataclass(frozen=True)
class LatencyPrediction:
    """What a load gets: percentiles in seconds, throughput in output tokens per second."""

    ttft: dict[str, float | None]
    itl: dict[str, float | None]
    tpot: dict[str, float | None]
    e2e: dict[str, float | None]
    queueing: dict[str, float | None]
    output_tokens_per_s: float
    preemptions: int
    peak_kv_fill: float
    source: str
    waited_for_kv: bool = False  # a request waited for KV blocks (the pool, not the batch, held it back)
    peak_running: int = 0  # requests running at once, at most
    # Prompt tokens looked up in and found in the prefix cache (vLLM's counters), and the pool the load left
    # (only when it began on a carried-over one: `predict_latency`'s ``start``).
    prefix_queries: int = 0
    prefix_hits: int = 0
    pool_after: CarriedPool | None = None
    request_overhead_s: float = 0.0  # added to each TTFT and E2E: the model's at the simulated request rate

    def to_json(self) -> dict:
        def ms(d):
            return {k: (None if v is None else round(v * 1000, 3)) for k, v in d.items()}

        return {"ttft_ms": ms(self.ttft), "itl_ms": ms(self.itl), "tpot_ms": ms(self.tpot), "e2e_ms": ms(self.e2e),
                "queueing_ms": ms(self.queueing), "output_tokens_per_s": round(self.output_tokens_per_s, 2),
                "preemptions": self.preemptions, "peak_kv_fill": round(self.peak_kv_fill, 4), "source": self.source}


def predict_latency(config: SchedulerConfig, load: Load, model: StepTimeModel,
                    qs: Sequence[float] = (50, 90, 99), mean: bool = False,
                    start: CarriedPool | None = None) -> LatencyPrediction:
    """Simulate ``load`` with ``model``'s step times: TTFT / ITL / TPOT / E2E percentiles, throughput.
    Percentiles ``qs`` (keys ``p50``...), and ``mean`` too when asked.
    The model's request overhead (at the simulated request rate) is added to TTFT and E2E, and
    (closed loop) delays each stream's next request: the client sees its last token and the engine
    its next prompt that much later than the steps alone say. ``start``: the pool an earlier load left
    (`simulate`'s), else an empty one. A ``config`` with several KV cache groups (``kv_groups``) runs the hybrid
    scheduler (kvplan.plan.hybrid_sim): each request holds blocks in every group, so fewer run at once."""
    extra, res = _simulate_with_overhead(config, load, model, start=start)

    def shifted(d):
        return {k: (None if v is None else v + extra) for k, v in d.items()}

    def stats(metric: str) -> dict[str, float | None]:
        out = res.percentiles(metric, qs)
        if mean:
            out["mean"] = res.mean(metric)
        return out

    return LatencyPrediction(
        ttft=shifted(stats("ttft")), itl=stats("itl"), tpot=stats("tpot"),
        e2e=shifted(stats("e2e")), queueing=stats("queueing_delay"),
        output_tokens_per_s=res.throughput, preemptions=res.preemptions, peak_kv_fill=res.peak_kv_fill,
        source=model.source, waited_for_kv=res.waited_for_kv, peak_running=res.peak_running,
        prefix_queries=res.prefix_queries, prefix_hits=res.prefix_hits, pool_after=res.pool_after,
        request_overhead_s=extra,
    )


def _simulate_with_overhead(config: SchedulerConfig, load: Load, model: StepTimeModel,
                            rounds: int = 4, start: CarriedPool | None = None) -> tuple[float, SimResult]:
    """(request overhead, simulation) where the overhead is the model's at the simulation's own request
    rate: a closed loop's rate falls as the overhead delays each stream, so iterate to a fixed point
    (a few rounds: the rate moves less each time); an open loop's rate is its arrivals'."""
    def run(extra: float) -> SimResult:
        delayed = _sent_after_overhead(load, extra, model) if load.streams else load
        if config.kv_groups is not None:  # blocks in every group, from one pool
            return simulate_groups(config, delayed, config.kv_groups, model, start=start)
        return simulate(config, delayed, model, start=start)  # (every round from the same carried pool: immutable)

    extra = model.request_overhead_s
    res = run(extra)
    if not model.request_overhead_per_rps_s2:
        return extra, res
    for _ in range(rounds):
        rate = len(res.requests) / res.duration if res.duration > 0 else 0.0
        new = model.request_overhead_at(rate)
        if abs(new - extra) <= 1e-4 * max(new, 1e-9):
            break
        extra = new
        res = run(extra)
    return extra, res


#: n x this mod 1 over successive request numbers n: spread evenly over [0, 1) (the golden ratio's low-discrepancy
#: sequence), with no seed to carry.
_GOLDEN = (math.sqrt(5) - 1) / 2


def _sent_after_overhead(load: Load, extra: float, model: StepTimeModel) -> Load:
    """A closed loop whose streams each send their next request ``extra`` seconds (the request overhead, plus the
    load's think time) after the previous one ends, on average: spread evenly over one decode step, so a request
    reaches the engine at any point of the step in progress and waits for its rest, as a real client's does (its
    HTTP round trip varies by milliseconds). A constant delay lands every request at one fixed point of the step
    grid instead: on the CPU engine (9 ms steps, a 10 ms overhead) every request of a 32 + 96 workload at 2-4
    streams waited out a nearly whole step, and TTFT p50 was over-predicted by 18-46% on one run's repeats where
    the spread gives 5-29%. Streams' first sends stay at the start (the bench starts them together)."""
    wait = load.think_time + extra
    prompt, output = load.lengths(load.first_index)
    spread = min(decode_step_time(model, load.streams, prompt + output // 2), 2 * wait)
    if spread <= 0:
        return replace(load, think_time=wait)
    firsts_end, given = load.first_index + load.streams, load.client_delay

    def delay(number: int) -> float:
        own = spread * ((number * _GOLDEN) % 1.0) if number >= firsts_end else 0.0
        return own + (given(number) if given else 0.0)

    return replace(load, think_time=wait - spread / 2, client_delay=delay)


def decode_step_time(model: StepTimeModel, concurrency: int, context: int) -> float:
    """Closed form of one decode step of ``concurrency`` sequences of ``context`` tokens."""
    return model(StepBatch(0, concurrency, concurrency * context, concurrency, concurrency * context))


def chunk_batch(tokens: int, context: int) -> StepBatch:
    """One step computing ``tokens`` prompt tokens of one request alone, after ``context`` tokens in its KV."""
    return StepBatch(tokens, 0, context + tokens, 1, tokens * context + tokens * (tokens + 1) // 2)


def chunk_step_time(model: StepTimeModel, tokens: int, context: int) -> float:
    """`chunk_batch`'s seconds."""
    return model(chunk_batch(tokens, context))


def prefill_batches(tokens: int, chunk_tokens: int, context: int = 0) -> list[StepBatch]:
    """The steps computing ``tokens`` prompt tokens of one request alone on the engine, after ``context`` tokens
    already in its KV: chunked prefill, ``chunk_tokens`` (max_num_batched_tokens) a step."""
    if chunk_tokens < 1:
        raise KvplanError("a prefill chunk must be >= 1 token")
    out, done = [], 0
    while done < tokens:
        n = min(chunk_tokens, tokens - done)
        out.append(chunk_batch(n, context + done))
        done += n
    return out


def prefill_time(model: StepTimeModel, tokens: int, chunk_tokens: int, context: int = 0) -> float:
    """Seconds of `prefill_batches`."""
    total = 0.0
    for batch in prefill_batches(tokens, chunk_tokens, context):
        total += model(batch)
    return total


QUICK_OVERHEAD_ROUNDS = 50  # fixed-point rounds: each shrinks the error by slope x concurrency / E2E^2 (well below 1 on real runs)


def quick_latency(model: StepTimeModel, prompt: int, output: int, concurrency: int) -> dict[str, float]:
    """Without simulating: TTFT of a prompt alone, TPOT at ``concurrency`` streams at mid-output
    context, E2E, and output tokens/s (a fast estimate for search; `predict_latency` is the real one).
    TTFT and E2E include the request overhead at the closed loop's own request rate
    (``concurrency`` / E2E, a fixed point: the overhead lowers the rate it grows with)."""
    ttft = model(StepBatch(prompt, 0, prompt, 1, prompt * (prompt + 1) // 2))
    tpot = decode_step_time(model, concurrency, prompt + output // 2)
    steps = ttft + max(0, output - 1) * tpot
    extra = model.request_overhead_s
    for _ in range(QUICK_OVERHEAD_ROUNDS if model.request_overhead_per_rps_s2 and steps > 0 else 0):
        new = model.request_overhead_at(concurrency / (steps + extra))
        if abs(new - extra) <= 1e-9:
            break
        extra = new
    ttft += extra
    e2e = steps + extra
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e,
            "output_tokens_per_s": concurrency * output / e2e if e2e > 0 and not math.isinf(e2e) else 0.0}


STEP_SCALE_ROUNDS = 4


def calibrate_bench(points: Sequence[dict], lengths, config: SchedulerConfig, base: StepTimeModel,
                    requests_per_stream: int = 1, shared_prefix: float = 0.0,
                    request_ttfts: Mapping[int, Sequence[tuple[int, float]]] | None = None,
                    single_requests: Sequence[tuple[int, float]] = (),
                    single_decodes: Sequence[tuple[int, float]] = (), overlap: bool | None = None,
                    within_datasheet: bool = False) -> StepTimeModel:
    """A step-time model calibrated on one bench run's points (closed loop, below the first KV
    wait): a first guess of the step factors from the decode steps (`decode_measurements`,
    `calibrate_steptime`), then the step factors and a constant request overhead fitted together to
    the decode steps and each point's TTFT p50 (`_fit_steps_and_ttft`; the simulator replays each
    point's very requests: ``first_index``), then the request overhead as a line against the points'
    measured request rates (`fit_request_overhead`), and the step terms scaled to the points' throughput.

    ``request_ttfts`` (point ``seq`` -> (request number, measured TTFT s) of each of its requests), when given,
    splits a point whose prompts differ in length into its shorter and its longer half, one TTFT row each
    (`ttft_groups`): the p50 row of a point is its median prompt's, so every point of one workload shows one
    prompt length and the request overhead absorbs the prompt's compute (a 64 + 64 calibration on the CPU engine
    priced a prompt token at nothing, then over-predicted a 32-token prompt's TTFT by 40% and under-predicted a
    256-token one's by 24-41%); the two halves' medians show what a prompt token costs.

    ``single_requests`` ((prompt tokens, measured TTFT s) of requests sent alone to an idle engine: `kvplan bench
    --prompt-sweep`) are one more 1-stream point: a row for its shorter and one for its longer half, as a point's
    (`single_request_groups`), each its prefill steps (`single_request_row`) and a time outside the steps of its
    own. A sweep over the engine's context prices a prompt token where a workload's own spread of lengths cannot;
    the request overhead is the points' (a sweep request follows a 2-token one, and on the CPU engine two sweeps'
    lines met no prompt 3-5 ms below their runs' 1-stream requests, at one price of a token). (One row a request
    was tried: 20 rows of one stream's requests outweighed the points' rows; on a saved CPU-engine run, a 32 + 96
    workload's TTFT p50 at 2-4 streams was over-predicted by +13% to +50% with them, -15% to +9% with the halves.)

    ``single_decodes`` ((prompt tokens, s) of the decode step after such a request's first token: the sweep's) are
    decode steps of one sequence over a context of the prompt and one token, a row for their shorter and one for their
    longer half (`single_request_groups`): the KV read grows with the context there, while the points' steps, at
    the workload's few contexts, grow only with the batch.

    ``overlap`` None (the default): both forms below are fitted, and the one whose predictions meet the run's own
    points better (`own_points_error`: TTFT p50 and output tokens/s) is kept; both have the same four factors, so
    neither fits the points better by having more. An engine's steps decide it, not a rule of thumb: on a 2-core EPYC
    CPU engine (2026-12-07, five 64 + 64 calibrations at 1-3 streams) decode steps grew from 18-22 ms at one stream to
    28-40 ms at three, as a prompt token's compute (~7 ms) does, and the overlapping fit settled every decode step on a
    flat memory term (24-32 ms at every batch): tokens/s -15% to -24% at one stream on its own points, where the summed
    fit was within 4% there (tests/plan/test_steptime_recorded.py). ``within_datasheet``: a form whose fit makes the
    device faster than its datasheet (an efficiency above 1, a dropped term among them) is kept only when the other
    form's is too (`kvplan calibrate --gpu` stores no such fit). ``overlap`` True or False: that form alone.

    ``overlap`` True: the model's steps take the longer of their memory and compute time
    (`StepTimeModel.overlap`); each round's rows charge a step the term that bounds it under the round's model. The
    first rounds, before both terms are found, take decode steps as reading memory and prefill steps as computing.
    On the CPU engine (2026-12-06; `benchmarks/bench_latency_prediction.py --from` on three runs) the engine's decode
    steps stayed at 7.4-9.7 ms from 1 to 4 streams while a prompt token cost 0.33 ms: summed terms charged each
    decoding sequence a prompt token's compute. When the fit leaves a term out (efficiency `DROPPED_EFFICIENCY`), no
    step can be told memory- from compute-bound: the summed fit is returned instead, unless the engine's own split of
    TTFT holds the request overhead (`outside_steps_at_one_stream`, held in the fit and the point the request
    overhead's line goes through). With it the step overhead is the time the steps cannot lose, and a dropped memory
    term is what the CPU engine's decode steps show: flat from 1 to 4 streams (ITL p50 6.5-8.9 ms on seven runs),
    so decode-only steps cost the step overhead and prompt steps its compute (`StepTimeModel.terms`). There the
    seven runs' fits agree (7.1-8.6 ms a step, 2.3-5.2 ms a request) where they did not without the split (0-8.1 ms a
    step, 3.1-12.1 ms a request), and their predicted prefill meets the engine's histogram."""

    usable = [p for p in points if p.get("status", "ok") == "ok" and p.get("mode", "concurrency") == "concurrency"
              and p.get("concurrency") and not p.get("waited_for_kv") and not p.get("preempted")]
    if not usable:
        raise KvplanError("the run has no finished closed-loop point below the first KV wait to calibrate on")
    outside = outside_steps_at_one_stream(usable, lengths, request_ttfts)

    def fit(form: bool) -> StepTimeModel:
        return replace(_calibrate_bench(usable, lengths, config, replace(base, overlap=form), requests_per_stream,
                                        shared_prefix, request_ttfts, single_requests, single_decodes, outside),
                       source="calibrated")

    if overlap is False:
        return fit(False)
    overlapping = fit(True)
    if outside is None and max(overlapping.mem_efficiency, overlapping.compute_efficiency) > DROPPED_EFFICIENCY / 10:
        # One term only, the request overhead not held: no step can be told memory- from compute-bound, and the rounds
        # that took decode steps as reading memory are not what summed terms then charge: the summed fit instead.
        return fit(False)
    if overlap:
        return overlapping
    forms = [overlapping, fit(False)]
    if within_datasheet:
        forms = [m for m in forms if not m.faster_than_datasheet()] or forms
    if len(forms) == 1:
        return forms[0]
    loads = _point_loads(usable, lengths, requests_per_stream, shared_prefix)
    return min(forms, key=lambda m: own_points_error(m, loads, config))  # (a tie keeps the overlapping form)


def own_points_error(model: StepTimeModel, loads, config: SchedulerConfig) -> float:
    """The mean relative error of ``model``'s TTFT p50 and output tokens/s on bench points it was calibrated on
    (``loads``: (point, its closed loop), `_point_loads`); the two figures the latency goal judges."""
    errors = []
    for p, load in loads:
        pred = predict_latency(config, load, model)
        measured_ttft, measured_rate = (p.get("ttft") or {}).get("p50"), p.get("throughput_tok_s")
        if measured_ttft and pred.ttft.get("p50") is not None:
            errors.append(abs(pred.ttft["p50"] / measured_ttft - 1))
        if measured_rate:
            errors.append(abs(pred.output_tokens_per_s / measured_rate - 1))
    return statistics.fmean(errors) if errors else 0.0


def _point_loads(usable: Sequence[dict], lengths, requests_per_stream: int, shared_prefix: float) -> list:
    """(point, the closed loop that replays its very requests) of each usable bench point."""
    return [(p, closed_loop(p["concurrency"], lengths, requests_per_stream, p.get("first_index", 0),
                            shared_prefix=shared_prefix)) for p in usable]


def outside_steps_at_one_stream(points: Sequence[dict], lengths=None,
                                request_ttfts: Mapping[int, Sequence[tuple[int, float]]] | None = None,
                                ) -> tuple[float, float] | None:
    """(request rate, seconds) of the time a request spends outside the engine's steps, as the engine's own histograms
    split its TTFT at the 1-stream points (medians over them; None where no point has the split): the client's mean
    TTFT less the mean time in the scheduler's queue and from first scheduled to first token (`server_queue_mean_s`,
    `server_prefill_mean_s`: vLLM's request_queue_time_seconds and request_prefill_time_seconds, both between
    engine-core timestamps, v1/metrics/stats.py@0.32.0). At one stream each request meets an idle engine, so no step
    in progress hides in that rest (at more, the trip to the engine core holds the wait for it, which the
    simulation gives). Why: TTFT rows alone cannot tell a constant per step from one per request (a request at one
    stream takes one prefill step), and the step terms take what the request overhead does not; on the CPU engine
    the fit put 0 ms in the step and 6.6-12.9 ms outside on eight of ten runs, where the histograms read 3.1-5.1 ms.

    With the point's requests (``request_ttfts``, prompt lengths from ``lengths``) the client's mean is taken robustly:
    the Theil-Sen line of TTFT against prompt tokens (`kvplan.stats.theil_sen`) at the requests' mean prompt. One
    stalled request moves a mean of 20 by its whole delay / 20: a 221 ms first request (the others 24-43 ms) read 13.2 ms
    outside where its run's line reads 3.5."""
    rates, values = [], []
    for p in points:
        server, mean = p.get("server") or {}, (p.get("ttft") or {}).get("mean")
        queue, prefill = server.get("server_queue_mean_s"), server.get("server_prefill_mean_s")
        rate = p.get("request_throughput") or 0.0
        if p.get("concurrency") != 1 or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                                for v in (mean, queue, prefill, rate)):
            continue  # (no split, or a torn record: the overhead is fitted)
        done = [(float(lengths(i)[0]), t) for i, t in (request_ttfts or {}).get(p.get("seq"), ())
                if t is not None and t > 0] if lengths is not None else []
        if len({x for x, _ in done}) >= 2:
            intercept, slope = theil_sen(done)
            mean = intercept + slope * statistics.fmean(x for x, _ in done)
        rates.append(float(rate))
        values.append(mean - queue - prefill)
    return (statistics.median(rates), max(0.0, statistics.median(values))) if values else None


def _calibrate_bench(usable: list[dict], lengths, config: SchedulerConfig, base: StepTimeModel, requests_per_stream: int,
                     shared_prefix: float, request_ttfts: Mapping[int, Sequence[tuple[int, float]]] | None,
                     single_requests: Sequence[tuple[int, float]],
                     single_decodes: Sequence[tuple[int, float]],
                     outside: tuple[float, float] | None = None) -> StepTimeModel:
    """`calibrate_bench` on its usable points, the terms summed or overlapping as ``base`` says; ``outside``: (request
    rate, seconds) of the request overhead the engine's histograms show at one stream (`outside_steps_at_one_stream`),
    held in the joint fit and the point the request overhead's line goes through, or None."""
    decode = decode_measurements(usable, lengths.prompt, lengths.output)
    decode += [(StepBatch(prefill_tokens=0, decode_seqs=1, kv_tokens_read=n + 1, num_seqs=1, attention_pairs=n + 1), t)
               for n, t in single_request_groups(single_decodes)]
    fitted = calibrate_steptime(decode, replace(base, request_overhead_s=0.0, request_overhead_per_rps_s2=0.0))
    loads = _point_loads(usable, lengths, requests_per_stream, shared_prefix)
    groups = {id(p): ttft_groups(request_ttfts.get(p.get("seq"), ()), lengths) if request_ttfts else None
              for p, _ in loads}
    singles = [(single_request_row(fitted, n, config.max_num_batched_tokens), t)
               for n, t in single_request_groups(single_requests)]
    fitted = _fit_steps_and_ttft(fitted, decode, loads, config, groups, singles, None if outside is None else outside[1])
    # The median inter-token gap is the typical decode step; throughput follows the mean one (the
    # steps that also prefill, the hiccups). Scale every step term by how much slower the run's
    # output was than the simulation's, and refit the request overhead on the new steps.
    for _ in range(STEP_SCALE_ROUNDS):
        fitted = _with_request_overhead(fitted, loads, config, outside)
        ratios = [predict_latency(config, load, fitted).output_tokens_per_s / p["throughput_tok_s"]
                  for p, load in loads if p.get("throughput_tok_s")]
        scale = statistics.median(ratios) if ratios else 1.0
        if abs(scale - 1) < 0.01:
            break
        fitted = fitted.steps_scaled(scale)
    else:
        fitted = _with_request_overhead(fitted, loads, config, outside)
    return fitted


JOINT_FIT_ROUNDS = 8


def ttft_groups(measured: Sequence[tuple[int, float]], lengths) -> list[tuple[frozenset[int], float]] | None:
    """A point's requests (request number, measured TTFT s) in two halves by prompt length (``lengths(number)``),
    each as (its request numbers, its median measured TTFT); None when every prompt has one length (nothing
    to split: the point's p50 row) or there are fewer than four requests."""
    done = sorted(((lengths(i)[0], i, t) for i, t in measured if t is not None and t > 0), key=lambda x: (x[0], x[1]))
    if len(done) < 4 or done[0][0] == done[-1][0]:
        return None
    half = len(done) // 2
    return [(frozenset(i for _, i, _ in part), statistics.median(t for _, _, t in part))
            for part in (done[:half], done[half:])]


def _fit_steps_and_ttft(model: StepTimeModel, decode: Sequence[tuple[StepBatch, float]], loads,
                        config: SchedulerConfig, groups: Mapping[int, list | None] | None = None,
                        singles: Sequence[tuple[list[float], float]] = (),
                        outside: float | None = None) -> StepTimeModel:
    """The step terms and a constant request overhead fitted together to the decode steps AND each
    point's TTFT p50: decode steps alone cannot tell the compute term from the KV-read term (both grow
    with the batch), and a prompt's step is mostly compute. The TTFT of the point's median request in
    the replay is its wait for the step in progress plus the steps from the one that first sees it to
    the one that samples its first token; those steps' terms are linear in the factors, so each point
    gives one row (the schedule itself depends on the factors: replay, refit, a few rounds). Rows are
    weighted by 1 / measured seconds (relative errors: a 30 ms step counts as much as a 1 s TTFT).
    A point with ``groups[id(point)]`` (`ttft_groups`: its shorter and longer prompts) gives a row per
    group instead: the group's median measured TTFT against its median request in the replay. ``singles``:
    (features, measured TTFT s) of requests sent alone (no wait, no replay needed), whose time outside the steps is
    a fifth coefficient of their own (dropped: the points' request overhead is the model's). ``outside`` (seconds):
    the request overhead held at that instead of fitted (`outside_steps_at_one_stream`)."""
    decode_rows = [([1.0, *model.terms(b), 0.0, 0.0], t, t) for b, t in decode]
    decode_rows += [([*features[:3], 0.0, features[3]], t, t) for features, t in singles]
    groups = groups or {}
    for _ in range(JOINT_FIT_ROUNDS):
        rows = list(decode_rows)
        for p, load in loads:
            split = groups.get(id(p))
            if split:
                targets = [(measured, among) for among, measured in split]
            else:
                targets = [((p.get("ttft") or {}).get("p50"), None)]
            res = _simulate_with_overhead(config, load, model)[1]
            for measured, among in targets:
                row = _ttft_row(res, model, among)
                if measured and measured > 0 and row is not None:
                    features, wait = row
                    if outside is None:
                        rows.append(([*features, 0.0], measured - wait, measured))
                    else:  # (a column of zeros is no term: `_fit_nonnegative` leaves it at 0)
                        rows.append(([*features[:3], 0.0, 0.0], measured - wait - outside, measured))
        if len(rows) == len(decode_rows):
            return model
        weighted = [([f / seconds for f in features], y / seconds) for features, y, seconds in rows]
        coef = _fit_nonnegative(weighted, drop_order=(2, 1, 0, 3, 4))
        new = replace(_with_step_terms(model, coef), request_overhead_s=coef[3] if outside is None else outside,
                      request_overhead_per_rps_s2=0.0)
        if _close(new, model):
            return new
        model = new
    return model


def single_request_groups(requests: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """Requests sent alone ((prompt tokens, TTFT s)) as (prompt tokens, TTFT s) of their shorter and longer half:
    each half's middle prompt (by length) and median TTFT, as `ttft_groups` splits a point; with fewer than four
    requests or one length, the middle request's length and the median TTFT."""
    done = sorted((n, t) for n, t in requests if n >= 1 and t > 0 and math.isfinite(t))
    if not done:
        return []
    if len(done) < 4 or done[0][0] == done[-1][0]:
        parts = [done]
    else:
        parts = [done[:len(done) // 2], done[len(done) // 2:]]
    return [(part[len(part) // 2][0], statistics.median(t for _, t in part)) for part in parts]


def single_request_row(model: StepTimeModel, prompt_tokens: int, chunk_tokens: int) -> list[float]:
    """[steps, memory s, compute s, 1] of one request alone on an idle engine: its prompt in chunks of
    ``chunk_tokens`` (max_num_batched_tokens), the last chunk's step sampling its first token (`prefill_time`'s
    steps), plus the request overhead: its TTFT = steps x step overhead + memory / mem_eff + compute / compute_eff
    + request overhead."""
    batches = prefill_batches(prompt_tokens, max(1, chunk_tokens))
    mem = compute = 0.0
    for batch in batches:
        m, c = model.terms(batch)
        mem, compute = mem + m, compute + c
    return [float(len(batches)), mem, compute, 1.0]


def _ttft_row(res: SimResult, model: StepTimeModel,
              among: frozenset[int] | None = None) -> tuple[list[float], float] | None:
    """([steps, memory s, compute s, 1], wait s) of the median-TTFT request (of those numbered ``among``, else
    of all) in ``res``, a replay with ``model`` (whose request overhead is a constant): its TTFT = wait + steps
    x step overhead + memory / mem_eff + compute / compute_eff + request overhead."""
    steps_only = replace(model, request_overhead_s=0.0)
    done = sorted((r for r in res.requests if r.ttft is not None and r.arrival_step is not None
                   and (among is None or r.index in among)), key=lambda r: r.ttft)
    if not done:
        return None
    req = done[len(done) // 2]
    batches = res.step_batches[req.arrival_step:req.first_token_step + 1]
    mem = sum(model.terms(b)[0] for b in batches)
    compute = sum(model.terms(b)[1] for b in batches)
    wait = req.ttft - sum(steps_only(b) for b in batches)
    return [float(len(batches)), mem, compute, 1.0], wait


def _close(a: StepTimeModel, b: StepTimeModel, rel: float = 0.005) -> bool:
    pairs = ((a.overhead_s, b.overhead_s), (a.mem_efficiency, b.mem_efficiency),
             (a.compute_efficiency, b.compute_efficiency), (a.request_overhead_s, b.request_overhead_s))
    return all(abs(x - y) <= rel * max(abs(x), abs(y), 1e-12) for x, y in pairs)


#: Rounds of `_with_request_overhead`'s fixed point (the replay's arrivals move with the overhead being fitted).
OVERHEAD_FIT_ROUNDS = 8


def _with_request_overhead(model: StepTimeModel, loads, config: SchedulerConfig,
                           anchor: tuple[float, float] | None = None) -> StepTimeModel:
    """``model`` with the request overhead fitted to each (point, load)'s measured TTFT p50 minus the
    one its steps give, against the point's measured request rate. The steps' TTFT is the replay's with the
    overhead delaying each stream's next request, as a prediction has it (`_sent_after_overhead`): a request
    then reaches a busy engine mid-step and waits for the step's rest, which the steps' TTFT holds. (Replayed
    without the overhead, each stream's next request met the engine on a step boundary and waited nothing; the
    overhead fitted to that absorbed the wait, and predictions counted it twice: on the CPU engine, 32 + 96 at
    4 streams over-predicted by +18% to +41% on four runs.) The replay's arrivals depend on the overhead, so
    the fit runs to a fixed point. ``anchor``: (request rate, seconds) the line goes through (`fit_request_overhead`)."""
    for _ in range(OVERHEAD_FIT_ROUNDS):
        samples = []
        for p, load in loads:
            measured = (p.get("ttft") or {}).get("p50")
            if measured is None:
                continue
            steps_ttft = _simulate_with_overhead(config, load, model)[1].percentiles("ttft", (50,))["p50"]
            if steps_ttft is not None:
                samples.append((float(p.get("request_throughput") or 0.0), measured - steps_ttft))
        base_s, per_rps = fit_request_overhead(samples, anchor)
        fitted = replace(model, request_overhead_s=base_s, request_overhead_per_rps_s2=per_rps)
        if abs(base_s - model.request_overhead_s) <= 1e-5 and abs(per_rps - model.request_overhead_per_rps_s2) <= 1e-5:
            return fitted
        model = fitted
    return model


def fit_request_overhead(samples: Sequence[tuple[float, float]],
                         anchor: tuple[float, float] | None = None) -> tuple[float, float]:
    """(seconds, seconds per request/s): the line through (request rate, TTFT residual) samples by least
    squares, both terms >= 0. With fewer than two distinct rates, or a line that would fall with the
    rate (noise: a busier server never answers sooner) or start below zero, it is the samples' median
    and no slope. ``anchor`` ((request rate, seconds): the engine's own split at one stream,
    `outside_steps_at_one_stream`): the line goes through it, only its slope fitted (>= 0; the line held at >= 0
    from no load up)."""
    if anchor is not None:
        x0, y0 = anchor
        sxx = sum((x - x0) ** 2 for x, _ in samples)
        slope = max(0.0, sum((x - x0) * (y - y0) for x, y in samples) / sxx) if sxx else 0.0
        return max(0.0, y0 - slope * x0), min(slope, y0 / x0) if x0 > 0 else slope
    if not samples:
        return 0.0, 0.0
    median = max(0.0, statistics.median(r for _, r in samples))
    rates = [x for x, _ in samples]
    if len(set(rates)) < 2:
        return median, 0.0
    mean_x, mean_y = statistics.fmean(rates), statistics.fmean(r for _, r in samples)
    sxx = sum((x - mean_x) ** 2 for x in rates)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / sxx
    intercept = mean_y - slope * mean_x
    if slope <= 0 or intercept < 0:
        return median, 0.0
    return intercept, slope


@dataclass(frozen=True)
class PromptTokenPrice:
    """How well a calibration's data pin the price of a prompt token. At one stream the engine is idle when a
    request arrives, so its TTFT is a line in the prompt length (time outside the steps + the prefill): the
    data's slope is the Theil-Sen line through the 1-stream requests (a client stall cannot drag it), its range
    Sen's 95% interval (`kvplan.stats.theil_sen_interval`, from the data's own scatter against their span of
    lengths); ``model_ms`` is what the calibrated model charges a token over the same lengths."""

    requests: int  # 1-stream requests (and sweep requests) the line is fitted to
    prompt_min: int  # their shortest and longest prompt, tokens
    prompt_max: int
    distinct_lengths: int
    data_ms: float  # the data's slope, ms a prompt token
    data_low_ms: float  # Sen's 95% interval
    data_high_ms: float
    intercept_ms: float  # TTFT of no prompt on the line (the time outside the prefill), ms
    model_ms: float  # the calibrated model's marginal price over prompt_min..prompt_max, ms a token

    @property
    def model_in_range(self) -> bool:
        return self.data_low_ms <= self.model_ms <= self.data_high_ms

    @property
    def relative_range(self) -> float | None:
        """The interval's width over the slope (None when the slope is not positive): 0.2 = priced within ~+-10%."""
        return (self.data_high_ms - self.data_low_ms) / self.data_ms if self.data_ms > 0 else None


def prompt_token_price(one_stream: Sequence[tuple[int, float]], model: StepTimeModel,
                       chunk_tokens: int) -> PromptTokenPrice | None:
    """The data's price of a prompt token ((prompt tokens, TTFT s) of requests that met an idle engine) with its
    uncertainty, next to ``model``'s; None with fewer than three requests or two distinct lengths."""
    pts = [(float(n), t * 1000.0) for n, t in one_stream if n >= 1 and t > 0 and math.isfinite(t)]
    lengths = sorted({int(x) for x, _ in pts})
    if len(pts) < 3 or len(lengths) < 2:
        return None
    intercept, slope = theil_sen(pts)
    low, high = theil_sen_interval(pts)
    lo, hi = lengths[0], lengths[-1]
    at = [prefill_time(model, n, chunk_tokens) for n in (lo, hi)]
    return PromptTokenPrice(len(pts), lo, hi, len(lengths), slope, low, high, intercept,
                            (at[1] - at[0]) * 1000.0 / (hi - lo))


def prompt_range_note(calibrated: tuple[int, int] | None, asked: tuple[int, int], where: str = "") -> str | None:
    """One line when ``asked`` (the shortest and longest prompt a prediction uses, tokens) leaves the prompt lengths
    the calibration saw (``calibrated``, None: it does not say); else None."""
    if calibrated is None:
        return None
    lo, hi = calibrated
    if lo <= asked[0] and asked[1] <= hi:
        return None
    shown = f"{asked[0]}" if asked[0] == asked[1] else f"{asked[0]}-{asked[1]}"
    return (f"prompts of {shown} tokens are outside the {lo}-{hi} tokens the calibration{where} saw: its price "
            f"of a prompt token is extrapolated there (kvplan bench --prompt-sweep widens it)")
