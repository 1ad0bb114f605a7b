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
from kvplan.plan.simulate import Lengths, SchedulerConfig, open_loop, poisson_arrivals
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
