"""Fleet sizing (`kvplan fit --rate`): how many replicas of one deployment serve a request rate at an SLO. Pure.

The router: N identical replicas behind a router that spreads the arrivals over them; each replica is simulated
on its own (the scheduler simulator with the step-time model, kvplan.plan.steptime.predict_latency) as a Poisson
stream at ``rate / N``. A round-robin router hands each replica every N-th request of the stream, whose gaps
vary less than a Poisson stream's, so a replica queues less behind it than simulated here: a count found this
way errs high, never low, for the same per-replica model.

The count: the smallest N whose simulated replica meets every SLO target. Every N replays the same unit-rate
Poisson sample, scaled to its rate (common random numbers), so the figures fall as N grows instead of jumping
with the sample (for one first-come-first-served queue, Lindley's recursion says later arrivals never wait
longer; a batching engine follows it closely): the search doubles N until the SLO holds, then bisects between
the last two. A target that one
request alone cannot meet (kvplan.plan.fit.latency_floor) is out of reach at any N and is said so without a
simulation.

What holds a replica back at the largest count that misses (N - 1): "kv", its pool, when a request waited for
blocks or was preempted; "batch" when ``max_num_seqs`` requests ran at once; else "compute" (the steps themselves)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.plan.simulate import Lengths, SchedulerConfig, StepBatch, open_loop, poisson_arrivals
from kvplan.plan.steptime import LatencyPrediction, StepTimeModel, predict_latency

#: Requests simulated per replica and count: enough for a p99 of 5 requests above it.
REQUESTS_SIMULATED = 500
#: Largest fleet searched.
MAX_REPLICAS = 1024
QS = (50, 90, 95, 99)


@dataclass(frozen=True)
class ReplicaCount:
    """The answer for one deployment shape."""

    rate_per_s: float  # the fleet's
    replicas: int | None  # the fewest that meet the SLO; None: none up to the largest searched
    per_replica_rate_per_s: float | None
    prediction: LatencyPrediction | None  # one replica at that count
    binding: str  # what holds a replica back at one replica fewer: "kv" (the pool), "batch" (max_num_seqs),
    # "compute", "none" (one replica meets it)
    simulations: int
    reason: str  # why there is no count, or "" when there is one


def replica_at(config: SchedulerConfig, model: StepTimeModel, rate_per_s: float, replicas: int, prompt: int,
               output: int, shared_prefix_tokens: int = 0, requests: int = REQUESTS_SIMULATED,
               seed: int = 0) -> LatencyPrediction:
    """One of ``replicas`` replicas at its share of ``rate_per_s``: what `replicas_for_rate` simulates at that count
    (the same sample), for a fleet whose size is given (`kvplan check`'s ``rate:``)."""
    return _replica(config, model, poisson_arrivals(1.0, requests, seed), rate_per_s / replicas, prompt, output,
                    shared_prefix_tokens)


def _replica(config: SchedulerConfig, model: StepTimeModel, unit_arrivals: list[float], rate_per_s: float, prompt: int,
             output: int, shared_prefix_tokens: int) -> LatencyPrediction:
    load = open_loop([t / rate_per_s for t in unit_arrivals], Lengths(prompt, output),
                     shared_prefix_tokens=shared_prefix_tokens)
    return predict_latency(config, load, model, QS, mean=True)


def missed_targets(prediction: LatencyPrediction, slo: Mapping[str, float]) -> list[str]:
    """The SLO keys (``ttft_p99``: seconds) the prediction misses; a statistic the simulation has no value
    for (a TPOT with one output token) is not held against it."""
    figures = {"ttft": prediction.ttft, "itl": prediction.itl, "tpot": prediction.tpot, "e2e": prediction.e2e}
    missed = []
    for key, target in slo.items():
        metric, _, stat = key.rpartition("_")
        value = figures[metric].get(stat)
        if value is not None and value > target:
            missed.append(key)
    return missed


def _binding(prediction: LatencyPrediction, config: SchedulerConfig) -> str:
    if prediction.preemptions or prediction.waited_for_kv:
        return "kv"
    if prediction.peak_running >= config.max_num_seqs:
        return "batch"
    return "compute"


def replicas_for_rate(config: SchedulerConfig, model: StepTimeModel, rate_per_s: float, prompt: int, output: int,
                      slo: Mapping[str, float], floor: Mapping[str, float] | None = None, shared_prefix_tokens: int = 0,
                      requests: int = REQUESTS_SIMULATED, max_replicas: int = MAX_REPLICAS, seed: int = 0,
                      max_simulations: int | None = None) -> ReplicaCount:
    """The fewest replicas of ``config`` (one replica's pool and limits) serving ``rate_per_s`` at ``slo``.
    ``floor``: `latency_floor`'s seconds by metric (a target below it is out of reach); ``max_simulations``:
    stop there (the answer then says so)."""
    if not math.isfinite(rate_per_s) or rate_per_s <= 0:
        raise KvplanError(f"invalid request rate {rate_per_s!r}", "give requests per second > 0: --rate 200")
    if not slo:
        raise KvplanError("fleet sizing needs an SLO (what serving the rate means)", "add --slo ttft_p99=1s")
    unreachable = [k for k, target in slo.items() if floor and floor.get(k.rpartition("_")[0], 0.0) > target]
    if unreachable:
        return ReplicaCount(rate_per_s, None, None, None, "compute", 0,
                            f"{unreachable[0]} out of reach: one request alone takes longer")
    unit = poisson_arrivals(1.0, requests, seed)  # one sample for every count
    runs: dict[int, LatencyPrediction] = {}

    def run(n: int) -> LatencyPrediction:
        if n not in runs:
            runs[n] = _replica(config, model, unit, rate_per_s / n, prompt, output, shared_prefix_tokens)
        return runs[n]

    def meets(n: int) -> bool:
        return not missed_targets(run(n), slo)

    def stopped() -> bool:
        return max_simulations is not None and len(runs) >= max_simulations

    low, high = 0, 1  # meets(low) is False (0: no replica), meets(high) is asked
    while not meets(high):
        low = high
        if high >= max_replicas or stopped():
            why = (f"the simulation limit was reached at {high:,} replicas" if high < max_replicas
                   else f"{max_replicas:,} replicas do not meet it")
            return ReplicaCount(rate_per_s, None, None, run(high), _binding(run(high), config), len(runs), why)
        high = min(2 * high, max_replicas)
    while high - low > 1:  # the count is in (low, high]
        mid = (low + high) // 2
        low, high = (low, mid) if meets(mid) else (mid, high)
    binding = _binding(run(high - 1), config) if high > 1 else "none"
    return ReplicaCount(rate_per_s, high, rate_per_s / high, run(high), binding, len(runs), "")


# --------------------------------------------------------------------------- prefill/decode disaggregation
# `kvplan fit --rate R --pd`: the same shape as a P/D pair (vLLM's NixlConnector: a prefill instance computes the
# prompt, its KV is read by a decode instance, which generates). Prefill replicas: simulated as above, each request
# a prompt and one token, at the TTFT target less the transfer and the decode's first step. Decode replicas: in their
# steady state, closed form: n requests decoding at once take step(n) a token (no prefill in the batch), a request
# holds its slot ``output`` steps, so a replica serves n / (output x step(n)) requests/s (Little's law) at the
# largest n its pool (whole requests: the prompt arrives at once), max_num_seqs and the TPOT/ITL target allow. The
# steady state has no queue, so the decode count errs low under bursts; the prefill count is simulated.

#: SLO metrics a P/D sizing reads: TTFT for the prefill side, TPOT / ITL (one decode step) for the decode side.
PD_METRICS = ("ttft", "tpot", "itl")


@dataclass(frozen=True)
class DecodeReplica:
    """One decode instance in its steady state."""

    concurrency: int  # requests decoding at once
    step_s: float  # one step (one token each) at that concurrency
    rate_per_s: float  # requests/s it serves: concurrency / (output x step_s)
    binding: str  # what caps the concurrency: "kv" (whole requests in its pool), "batch" (max_num_seqs), "tpot"


@dataclass(frozen=True)
class DisaggCount:
    """The answer for one shape as a P/D pair."""

    rate_per_s: float
    transfer_s: float  # one request's KV, prefill -> decode (kvplan.plan.disagg, at the asked link rate)
    prefill: ReplicaCount | None  # None: the TTFT target leaves nothing for the prefill
    decode: DecodeReplica | None  # None: one request alone misses the decode target, or one does not fit
    decode_replicas: int | None
    reason: str  # why there is no pair, or ""

    @property
    def replicas(self) -> int | None:
        if self.prefill is None or self.prefill.replicas is None or self.decode_replicas is None:
            return None
        return self.prefill.replicas + self.decode_replicas


def decode_replica(model: StepTimeModel, usable_blocks: int, blocks_per_request: int, max_num_seqs: int, prompt: int,
                   output: int, step_target_s: float = math.inf) -> DecodeReplica | None:
    """The busiest steady state of one decode instance whose step meets ``step_target_s``; None if one request
    alone misses it or does not fit. A step of n decodes reads n contexts of the mean length, prompt + output / 2
    (StepBatch's counts: kv_tokens_read and attention_pairs, context + 1 each)."""
    context = prompt + output // 2 + 1

    def step(n: int) -> float:
        return model(StepBatch(0, n, n * context, n, n * context))

    kv_limit = usable_blocks // max(1, blocks_per_request)
    limit = min(kv_limit, max_num_seqs)
    if limit < 1 or step(1) > step_target_s:
        return None
    if step(limit) <= step_target_s:
        n, binding = limit, ("kv" if kv_limit < max_num_seqs else "batch")
    else:  # steps only lengthen with n (every term of the model is >= 0): the last n that meets the target
        low, high = 1, limit  # step(low) meets it, step(high) does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if step(mid) <= step_target_s else (low, mid)
        n, binding = low, "tpot"
    t = step(n)
    return DecodeReplica(n, t, n / (max(1, output) * t), binding)


def pd_replicas_for_rate(config: SchedulerConfig, model: StepTimeModel, rate_per_s: float, prompt: int, output: int,
                         slo: Mapping[str, float], transfer_s: float, blocks_per_request: int,
                         floor: Mapping[str, float] | None = None, shared_prefix_tokens: int = 0,
                         max_replicas: int = MAX_REPLICAS, max_simulations: int | None = None) -> DisaggCount:
    """Prefill and decode replicas of one shape for ``rate_per_s`` at ``slo`` (TTFT, TPOT and ITL targets only)."""
    other = [k for k in slo if k.rpartition("_")[0] not in PD_METRICS]
    if other:
        raise KvplanError(f"--pd sizes TTFT, TPOT and ITL targets; {other[0]} is not modelled for a P/D pair",
                          "give ttft_pXX and tpot_pXX / itl_pXX targets")
    if not any(k.startswith("ttft_") for k in slo):
        raise KvplanError("--pd needs a TTFT target: what the prefill replicas must meet", "add ttft_p99=1s to --slo")
    step_targets = [v for k, v in slo.items() if k.rpartition("_")[0] in ("tpot", "itl")]
    decode = decode_replica(model, config.usable_blocks, blocks_per_request, config.max_num_seqs, prompt, output,
                            min(step_targets, default=math.inf))
    if decode is None:
        return DisaggCount(rate_per_s, transfer_s, None, None, None,
                           "a decode instance misses the TPOT / ITL target with one request (or holds none)")
    decode_replicas = math.ceil(rate_per_s / decode.rate_per_s - 1e-9)
    # The client's TTFT: the prefill's, then the KV read, then the decode's first step.
    ttft = {k: v - transfer_s - decode.step_s for k, v in slo.items() if k.startswith("ttft_")}
    if any(v <= 0 for v in ttft.values()):
        return DisaggCount(rate_per_s, transfer_s, None, decode, decode_replicas,
                           f"the KV transfer ({transfer_s * 1000:.1f} ms) and the decode's first step "
                           f"({decode.step_s * 1000:.1f} ms) alone take the TTFT target")
    prefill = replicas_for_rate(config, model, rate_per_s, prompt, 1, ttft, floor, shared_prefix_tokens,
                                max_replicas=max_replicas, max_simulations=max_simulations)
    return DisaggCount(rate_per_s, transfer_s, prefill, decode, decode_replicas, prefill.reason)
