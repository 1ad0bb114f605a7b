"""A bench run's results as typed models, end to end: what the runner measures, what summary.json and
points.jsonl hold, what the reports, the live view, ``kvplan report`` and ``kvplan check --bench`` read.

The JSON is the one kvplan has always written (run folders of older releases load as they are):

- ``BenchSummary``        summary.json (and ``kvplan bench --json``)
- ``PointResult``         one line of points.jsonl
- ``EngineCapacity``      the KV pool the engine reports (kvplan.engines.base)
- ``PlannerCapacity``     the planner's pool for the same flags, or why there is none
- ``OnsetPrediction``     the block rule on the engine's pool (kvplan.plan.blocks.BlockRule)
- ``MeasuredOnsets``      the measured onsets (kvplan.bench.sweep.Onset) and whether they agree
- ``PredictedPoint``      what the rule says of one point
- ``PredictedLatency``    what the simulator and the step-time model say of one point's latency
- ``LatencyModelInfo``    which step-time model predicted them (prior, calibrated), or why none did
- ``LatencyStats``        n, mean and percentiles of one latency (seconds)
- ``ServerFigures``       what the server's /metrics said during one point (kvplan.bench.metrics.summarize), or
                          Prometheus for it (kvplan.bench.prometheus)
- ``PrometheusInfo``      where --prometheus read them
- ``SloResult``           one SLO of one point: target, value, met
- ``ReplicaPoint``        one replica during one point of a fleet run (kvplan.bench.fleet)
- ``FleetSummary``        the replicas of a fleet run: pools, the route, the first replica to wait / preempt

Models whose JSON keys depend on the source (another harness's file gives fewer figures, a server
without /metrics none) are *sparse*: a figure is written only when it was given, so a reader never
sees a key the file did not hold, and ``{}`` stays ``{}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_serializer

from kvplan import __version__
from kvplan.bench.stats import describe
from kvplan.bench.sweep import Onset, PointOutcome
from kvplan.engines.base import EngineCapacity

LATENCY_FROM = "scheduled"  # every latency counts from the request's scheduled time (see loadgen)


def _integral(value: Any) -> Any:
    """A whole float as an int (Prometheus writes every counter as a float: 8 preemptions read as 8.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**53 else value


#: A count or a load the JSON writes as an integer when it is one (8, not 8.0); fractional values stay floats.
Count = Annotated[int | float, BeforeValidator(_integral)]

OnsetName = Literal["first_kv_wait", "first_preemption"]
ONSETS: tuple[OnsetName, ...] = ("first_kv_wait", "first_preemption")
METRICS = ("ttft", "itl", "tpot", "e2e")  # the latencies of a point (PointResult fields)


class _Figures(BaseModel):
    """Frozen, no unknown keys; written with the keys it was given only (see the module's docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_serializer(mode="wrap")
    def _given_only(self, handler):
        data = handler(self)
        given = self.model_fields_set
        return {k: v for k, v in data.items() if k in given}


class _NewFieldsOptional(BaseModel):
    """Fields added after the run folders kvplan already wrote (``ADDED``) are written only when set,
    so an older run's summary.json and points.jsonl come back byte for byte."""

    ADDED: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_unset_additions(self, handler):
        data = handler(self)
        return {k: v for k, v in data.items() if not (k in self.ADDED and v is None)}


class LatencyStats(_Figures):
    """n, mean and percentiles of one latency over a point's requests, in seconds (None: no sample)."""

    n: int | None = None
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    # 95% confidence intervals of the p50 and the p99 (kvplan.stats.quantile_interval: order statistics, exact,
    # no resampling); a bound the sample cannot give is None (a p99 of fewer than 368 values has no upper one)
    p50_ci: tuple[float | None, float | None] | None = None
    p99_ci: tuple[float | None, float | None] | None = None
    # --percentiles: the ones asked for, "p99.9" -> seconds (the fixed ones above are always there)
    chosen: dict[str, float | None] | None = None

    @classmethod
    def of(cls, values: Sequence[float], chosen: Sequence[float] = ()) -> LatencyStats:
        """The statistics of a list of seconds (kvplan.bench.stats.describe), with ``chosen`` percentiles too."""

        return cls(**describe(values, chosen))

    def stat(self, name: str) -> float | None:
        """``mean``, ``p50``, ``p90``, ``p95`` or ``p99`` by name (an SLO key's statistic); None otherwise."""
        return getattr(self, name) if name in ("mean", "p50", "p90", "p95", "p99") else None

    @property
    def count(self) -> int:
        return int(self.n or 0)


class ServerFigures(_Figures):
    """What the server said during one point: deltas of counters, peaks of gauges (kvplan.bench.metrics).
    Empty (``{}``) when the server had no readable /metrics."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer kvplan may read more of /metrics

    scrapes: int = 0
    preemptions: Count | None = None
    peak_running: Count | None = None
    peak_waiting: Count | None = None
    peak_waiting_capacity: Count | None = None
    peak_kv_usage: float | None = None
    peak_in_engine: Count | None = None  # max of running + waiting in one scrape
    prompt_tokens: Count | None = None
    generation_tokens: Count | None = None
    prefix_queries: Count | None = None
    prefix_hits: Count | None = None
    server_ttft_mean_s: float | None = None
    server_ttft_p50_s: float | None = None
    server_ttft_p99_s: float | None = None
    server_ttft_count: Count | None = None
    # The server's ITL histogram (vllm:inter_token_latency_seconds), as the TTFT one; absent where it has none
    server_itl_mean_s: float | None = None
    server_itl_p50_s: float | None = None
    server_itl_p99_s: float | None = None
    server_itl_count: Count | None = None
    # Where the engine's own TTFT went, as means over the point (vLLM's request_latency_buckets start at 0.3 s, too
    # coarse for percentiles of a step): waiting in the scheduler's queue (vllm:request_queue_time_seconds, SGLang's
    # queue time) and from first scheduled to the first token (vllm:request_prefill_time_seconds). The rest of the
    # server's TTFT is the API server's and the trip to the engine core.
    server_queue_mean_s: float | None = None
    server_prefill_mean_s: float | None = None
    # The KV tier (kvplan.vllm.metric_names.TIER_COUNTERS), deltas over the point: tokens asked of the KV connector
    # (vLLM's native CPU offloading, LMCache...) and found there; bytes and seconds of the native tier's loads
    # (tier -> GPU) and stores (GPU -> tier). None where the server does not declare them.
    external_queries: Count | None = None
    external_hits: Count | None = None
    offload_load_bytes: Count | None = None
    offload_load_s: float | None = None
    offload_store_bytes: Count | None = None
    offload_store_s: float | None = None
    series: list[tuple[float, float, float, float, float]] = Field(default_factory=list)  # t, run, wait, kv, preempt
    incomplete: bool = False  # the server went away before the last scrape: figures up to the last one seen
    # Where the figures come from: "prometheus" (kvplan bench --prometheus: PromQL over the point's window,
    # kvplan.bench.prometheus); absent: the server's own /metrics, scraped by the bench
    source: Literal["prometheus"] | None = None

    @property
    def empty(self) -> bool:
        """No figure at all (the server had no readable /metrics, or the file none)."""
        return not self.model_fields_set

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class PlannerCapacity(_Figures):
    """What `kvplan size` plans for the bench's engine flags, next to what the engine reports; or the
    reason there is no such figure (``error`` alone)."""

    num_blocks: int | None = None
    kv_cache_tokens: int | None = None
    block_size: int | None = None
    vllm_version: str | None = None
    error: str | None = None


class OnsetPrediction(_NewFieldsOptional):
    """The block rule (kvplan.plan.blocks.BlockRule) on the pool the engine reports, for the workload; on a model
    whose KV cache is several groups, the hybrid simulator's onsets (kvplan.plan.hybrid_rule.HybridRule), with
    ``kv_groups`` saying which."""

    ADDED: ClassVar[tuple[str, ...]] = ("kv_groups", "searched_up_to", "first_budget_wait")
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_blocks: int
    block_size: int
    prompt_tokens: int
    output_tokens: int
    max_num_seqs: int | None = None  # null: not the limit
    usable_blocks: int
    admit_blocks: int
    peak_blocks: int
    first_kv_wait: int | None  # null: never up to max_num_seqs
    first_preemption: int | None
    exact: bool = False  # the requests are identical (else: mean lengths)
    # The model's KV cache groups ("sliding 64 + full attention") when the hybrid simulator predicted the onsets
    # (none of them up to ``searched_up_to`` streams when null); null: the block rule on one group.
    kv_groups: str | None = None
    searched_up_to: int | None = None
    # The hybrid simulator's first streams at which a request waits for the token budget (max_num_batched_tokens, or
    # a chunk Mamba's block-aligned split rounds down to no block) rather than for KV blocks: vLLM's waiting gauge
    # counts it too (kvplan.plan.hybrid_rule). Searched below ``first_kv_wait`` (up to ``searched_up_to`` without
    # one); null: none there, or the block rule (not predicted).
    first_budget_wait: int | None = None

    @classmethod
    def from_rule(cls, rule: Any, exact: bool) -> OnsetPrediction:
        hybrid = ({"kv_groups": rule.kv_groups, "searched_up_to": rule.searched_up_to,
                   "first_budget_wait": rule.first_budget_wait} if hasattr(rule, "kv_groups") else {})
        return cls(num_blocks=rule.num_blocks, block_size=rule.block_size, prompt_tokens=rule.prompt_tokens,
                   output_tokens=rule.output_tokens,
                   max_num_seqs=None if rule.max_num_seqs >= (1 << 30) else rule.max_num_seqs,
                   usable_blocks=rule.usable_blocks, admit_blocks=rule.admit_blocks, peak_blocks=rule.peak_blocks,
                   first_kv_wait=rule.first_kv_wait, first_preemption=rule.first_preemption, exact=exact, **hybrid)

    def onset(self, name: OnsetName) -> int | None:
        return self.first_kv_wait if name == "first_kv_wait" else self.first_preemption

    @property
    def none_text(self) -> str:
        """What a null onset says: never (the block rule), or none up to the top the simulator searched."""
        return "never" if self.searched_up_to is None else f"none up to {self.searched_up_to}"


class OnsetAgreement(_Figures):
    """Does each measured onset equal the predicted one (null: not measured)? ``{}`` without a prediction."""

    first_kv_wait: bool | None = None
    first_preemption: bool | None = None

    def onset(self, name: OnsetName) -> bool | None:
        return self.first_kv_wait if name == "first_kv_wait" else self.first_preemption

    def differs(self) -> bool:
        return self.first_kv_wait is False or self.first_preemption is False


class MeasuredOnsets(_Figures):
    """The onsets the sweep found (null: not searched); ``{}`` from a harness that measures none."""

    first_kv_wait: Onset | None = None
    first_preemption: Onset | None = None
    agrees_with_prediction: OnsetAgreement = Field(default_factory=OnsetAgreement)

    def onset(self, name: OnsetName) -> Onset | None:
        return self.first_kv_wait if name == "first_kv_wait" else self.first_preemption


class PredictedPoint(_NewFieldsOptional):
    """What the block rule (or the hybrid simulator) says of one concurrency."""

    ADDED: ClassVar[tuple[str, ...]] = ("waits_for_budget",)
    model_config = ConfigDict(frozen=True, extra="forbid")

    waits_for_kv: bool
    preempts: bool
    kv_fill: float  # share of the pool the point's requests pin at their peak
    label: str  # KV-limited | budget-limited | admission-limited | neither
    # the hybrid simulator's: a request waits for the token budget (null: the block rule, or a load at or above the
    # first KV wait with no budget wait below it: not searched)
    waits_for_budget: bool | None = None

    @classmethod
    def from_rule(cls, rule: Any, concurrency: int) -> PredictedPoint:
        budget = rule.waits_for_budget(concurrency) if hasattr(rule, "waits_for_budget") else None
        return cls(waits_for_kv=rule.waits_for_kv(concurrency), preempts=rule.preempts(concurrency),
                   kv_fill=round(rule.kv_fill(concurrency), 4), label=rule.label(concurrency), waits_for_budget=budget)


class PredictedLatency(_Figures):
    """The latency the simulator predicts for one point's load with the run's step-time model
    (kvplan.bench.latency): p50 and p99 in seconds, output tokens/s; or why none (``error``)."""

    source: Literal["prior", "calibrated"] | None = None
    ttft: LatencyStats | None = None
    itl: LatencyStats | None = None
    tpot: LatencyStats | None = None
    e2e: LatencyStats | None = None
    output_tokens_per_s: float | None = None
    simulated_requests: int | None = None  # fewer than the point's when the simulation was bounded
    # vLLM's prefix-cache hit rate the simulation counts (hits / queries, tokens; None: nothing looked up).
    prefix_hit_rate: float | None = None
    # The point began on the pool the warm-up and the earlier points left (`LatencyModelInfo.pool`), not an empty one.
    carried_pool: bool | None = None
    error: str | None = None

    def stat(self, metric: str, key: str) -> float | None:
        stats = getattr(self, metric, None)
        return None if stats is None else stats.stat(key)


class LatencyModelInfo(BaseModel):
    """The run's step-time model: ``prior`` (the GPU catalog's figures x assumed efficiencies),
    ``calibrated`` (kvplan calibrate --bench), or ``none`` (``basis`` says why: no prior for a CPU engine)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["prior", "calibrated", "none"]
    basis: str
    pool: str | None = None  # what pool each point's prediction starts from, when not an empty one
    note: str | None = None  # calibrated: the run's prompts leave the lengths the calibration saw (one line)


class SloResult(BaseModel):
    """One SLO of one point (seconds): its target, the point's value, whether it is met (null: no value)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: float
    value: float | None
    met: bool | None


class RateSearchResult(BaseModel):
    """What the automatic rate search found: the SLO threshold lies in [highest_meeting_slo, first_missing_slo)."""

    highest_meeting_slo: float | None  # requests/s; null: no measured rate met the SLOs
    first_missing_slo: float | None  # requests/s; null: every measured rate met them
    resolved: bool  # the bracket is within the resolution
    stopped: str  # resolved | max points | met up to the ceiling | missed down to the floor
    points: int
    start: float
    resolution: float
    max_points: int

    def describe(self) -> str:
        met = "none" if self.highest_meeting_slo is None else f"{self.highest_meeting_slo:g} requests/s"
        missed = "none" if self.first_missing_slo is None else f"{self.first_missing_slo:g} requests/s"
        how = (f"within {self.resolution:.0%}" if self.resolved else f"not resolved to {self.resolution:.0%}: "
               f"{self.stopped}")
        return (f"highest rate meeting the SLOs: {met}; first rate missing them: {missed} "
                f"({how}; {self.points} point{'s' if self.points != 1 else ''} from {self.start:g} requests/s)")


class ReplayFigures(_Figures):
    """One replay point: measured against predicted."""

    sessions: int
    requests: int
    prefix_queries: Count | None = Field(None, description="tokens looked up in the prefix cache (engine counter)")
    prefix_hits: Count | None = Field(None, description="tokens found there (engine counter)")
    hit_rate: float | None = Field(None, description="prefix_hits / prefix_queries, as the engine counted them")
    predicted_hit_rate: float | None = None  # at the nominal timing
    predicted_hit_rate_low: float | None = None  # the range over the client timings simulated
    predicted_hit_rate_high: float | None = None
    predicted_queries: int | None = None
    predicted_hits: int | None = None
    predicted_preemption: bool | None = None  # None: some client timings preempt, others do not
    predicted_by: str = "none"
    reused_prompt_tokens: Count | None = Field(None, description="prompt tokens served from cache (= prefix_hits)")
    computed_prompt_tokens: Count | None = Field(None, description="prompt tokens computed (queries - hits)")
    ttft_hit: LatencyStats = Field(default_factory=LatencyStats)  # turns with cached_tokens > 0
    ttft_miss: LatencyStats = Field(default_factory=LatencyStats)  # turns with cached_tokens == 0
    cached_tokens_reported: bool = False  # the server reported usage.prompt_tokens_details.cached_tokens
    peak_sessions_in_flight: int = 0  # sessions with a request sent and not yet ended, at once (client side)
    send_skew: LatencyStats = Field(default_factory=LatencyStats)  # actual send - scheduled time


class GpuFigures(_Figures):
    """The GPUs during one point (kvplan.bench.gpu_telemetry): over every sample of every GPU seen."""

    source: str  # "DCGM exporter" or "NVML"
    gpus: int  # GPUs the samples named
    samples: int  # samples taken (each of every GPU)
    util_mean_pct: float | None = None  # GPU utilization, % of the sample period a kernel ran
    util_peak_pct: float | None = None
    memory_used_peak_mib: float | None = None  # framebuffer memory used, the fullest GPU's
    power_peak_w: float | None = None  # board power, the hungriest GPU's
    sm_clock_min_mhz: float | None = None  # the lowest SM clock seen: below the GPU's boost when it throttled


class PrometheusInfo(BaseModel):
    """Where a run's server figures came from when --prometheus was given: the API's URL (credentials never kept),
    the selector, the request headers' names (values never kept)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    selector: str | None = None
    headers: list[str] = Field(default_factory=list)  # "Authorization: ***"
    engine_metrics: bool = False  # the engine's /metrics was scraped beside (PointResult.server_scraped)

    def describe(self) -> str:
        """One line for the reports: where the server figures came from."""
        picked = f" {self.selector}" if self.selector else ""
        headers = f", headers {', '.join(self.headers)}" if self.headers else ""
        beside = ("the engine's /metrics scraped beside (server_scraped)" if self.engine_metrics
                  else "the engine's /metrics not read")
        return f"Prometheus {self.url}{picked} by PromQL over each point's window{headers}; {beside}"


class ReplicaPoint(_NewFieldsOptional):
    """One replica during one point of a fleet run (kvplan.bench.fleet): what the client routed to it, what its own
    /metrics said, and the block rule on its own pool at its share of the load. The same for one engine of a
    data-parallel server (vLLM's ``engine`` label: its own pool, its own figures; its requests the DP coordinator's
    choice, so no client count)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    ADDED: ClassVar[tuple[str, ...]] = ("engines",)

    index: int  # 0-based, in the order of --url (or --metrics-url behind a gateway)
    name: str  # its URL as shown (credentials masked)
    requests: int | None = None  # the client sent it this many (null behind a gateway: the gateway chose)
    requests_ok: int | None = None
    peak_in_flight: int | None = None  # the most the client had at it at once (null behind a gateway)
    server: ServerFigures = Field(default_factory=ServerFigures)  # from its own /metrics
    waited_for_kv: bool = False
    wait_evidence: list[str] = Field(default_factory=list)
    preempted: bool = False
    label: str = "neither"  # KV-limited | admission-limited | neither | failed
    # seconds into the point when one of its scrapes first showed the event (null: none did; the counters read
    # after the point may still show it)
    first_kv_wait_s: float | None = None
    first_preemption_s: float | None = None
    predicted: PredictedPoint | None = None  # the block rule on its pool, at the requests the route gives it
    engines: list[ReplicaPoint] | None = None  # a data-parallel replica: each engine's (which then judge it)


class PointResult(_NewFieldsOptional):
    """One line of points.jsonl."""

    ADDED: ClassVar[tuple[str, ...]] = ("predicted_latency", "retries", "replay", "gpu", "server_scraped", "replicas",
                                        "engines", "waited_for_budget")

    seq: int
    concurrency: int
    status: Literal["ok", "failed"]
    error: str | None = None
    started_at: str
    wall_s: float
    first_index: int
    requests: int
    requests_ok: int
    requests_failed: int
    output_tokens: int
    throughput_tok_s: float | None
    ttft: LatencyStats
    itl: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    server: ServerFigures = Field(default_factory=ServerFigures)
    waited_for_kv: bool
    wait_evidence: list[str] = Field(default_factory=list)
    preempted: bool
    label: str
    # True: the waiting gauge showed requests waiting, but for the token budget, not KV (label "budget-limited",
    # kvplan.bench.point.budget_wait); null: not so judged
    waited_for_budget: bool | None = None
    predicted: PredictedPoint | None = None
    predicted_latency: PredictedLatency | None = None  # null: not predicted (older runs, no step-time model)
    notes: list[str] = Field(default_factory=list)
    # Load: closed loop at `concurrency` streams, or open loop at `rate` requests/s (then `concurrency`
    # is the most requests the client had in flight at once).
    mode: Literal["concurrency", "rate"] = "concurrency"
    rate: float | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None  # open loop: the cap on requests in flight
    latency_from: str = LATENCY_FROM
    send_lag: LatencyStats = Field(default_factory=LatencyStats)  # actual send - scheduled time
    request_throughput: float | None = None  # completed requests / wall time
    multi_token_requests: int = 0  # requests whose deliveries carried several tokens
    retries: int | None = None  # requests resent after a reused connection dropped them unanswered (null: older runs)
    warnings: list[str] = Field(default_factory=list)  # percentiles resting on too few samples
    slo: dict[str, SloResult] | None = None  # SLO key (ttft_p99) -> its result
    slo_met: bool | None = None  # every SLO percentile of the point within its target
    goodput_share: float | None = None  # requests meeting every SLO / requests
    goodput_req_s: float | None = None
    goodput_tok_s: float | None = None
    # --traffic: the point replayed the first `concurrency` sessions; its prefix-cache figures,
    # measured and predicted (kvplan.bench.replay)
    replay: ReplayFigures | None = None
    gpu: GpuFigures | None = None  # --gpu-metrics: the GPUs' utilization, memory, power and clocks during the point
    # --prometheus: `server` holds Prometheus' figures; these are the engine's own /metrics, scraped beside them
    # when it answered (null: not scraped), so the two can be compared
    server_scraped: ServerFigures | None = None
    # several replicas (kvplan.bench.fleet): each one's figures; ``server`` then holds the fleet's (counters summed,
    # KV usage the fullest replica's, running and waiting the sum of each replica's peak)
    replicas: list[ReplicaPoint] | None = None
    # a data-parallel server (two engines or more): each engine's figures, judged on its own pool; the point waited
    # for KV or preempted when an engine did (``server`` holds the engines' summed figures)
    engines: list[ReplicaPoint] | None = None

    @property
    def load(self) -> float:
        return self.rate if self.mode == "rate" and self.rate is not None else float(self.concurrency)

    @property
    def load_key(self) -> tuple[str, float]:
        return (self.mode, self.load)

    def latencies(self) -> dict[str, LatencyStats]:
        """ttft, itl, tpot, e2e by name (what an SLO key's metric names)."""
        return {m: getattr(self, m) for m in METRICS}

    def outcome(self) -> PointOutcome:
        return PointOutcome(self.concurrency, self.waited_for_kv, self.preempted, self.status != "ok")


class FleetReplica(BaseModel):
    """One replica of a fleet run: where it is, the pool its /metrics reports, the block rule on that pool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int
    name: str  # its URL as shown (credentials masked): where its requests go, or its --metrics-url behind a gateway
    metrics_url: str  # the server whose /metrics was read (credentials masked)
    capacity: EngineCapacity = Field(default_factory=EngineCapacity)
    prediction: OnsetPrediction | None = None  # in its own concurrency (null: its pool is unknown)


class FleetOnset(_NewFieldsOptional):
    """One onset of a fleet run, in streams over the whole fleet: the first replica to reach it, predicted and
    measured. ``share`` / ``in_flight``: that replica's part of the load there. The same for a data-parallel server's
    engines, where the rule bounds the load (``predicted_earliest`` to ``predicted``) and does not say which engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    ADDED: ClassVar[tuple[str, ...]] = ("predicted_earliest",)

    predicted: int | None = None  # null: never up to each replica's max_num_seqs, or not predicted
    # data parallel: the fewest streams the onset can come at (all of them on one engine); ``predicted`` is then the
    # most (the even split a point's first requests get), and ``agrees`` means measured within the two
    predicted_earliest: int | None = None
    predicted_replica: str | None = None
    predicted_share: int | None = None  # requests the route gives that replica at the predicted onset
    measured: int | None = None  # null: not seen (or not searched)
    measured_replica: str | None = None  # of the replicas showing it at that point, the first a scrape saw
    measured_in_flight: int | None = None  # the most requests the client had at that replica in that point
    agrees: bool | None = None  # same load and same replica (null: not measured or not predicted)


class FleetSummary(BaseModel):
    """The replicas of a fleet run (``--url A --url B``, or a gateway with ``--metrics-url``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # data-parallel: the engines of one server (BenchSummary.engines), its API server spreading the requests
    route: Literal["round-robin", "least-outstanding", "gateway", "data-parallel"]
    gateway: str | None = None  # behind a gateway (or a data-parallel server's API server): its URL (credentials masked)
    replicas: list[FleetReplica]  # data-parallel: its engines
    first_kv_wait: FleetOnset = Field(default_factory=FleetOnset)
    first_preemption: FleetOnset = Field(default_factory=FleetOnset)
    prediction_basis: str  # how the fleet's onsets were predicted, in words (or why they were not)

    def onset(self, name: OnsetName) -> FleetOnset:
        return self.first_kv_wait if name == "first_kv_wait" else self.first_preemption


class BenchSummary(_NewFieldsOptional):
    """summary.json: one run (kvplan's own, or another harness's results read as one)."""

    ADDED: ClassVar[tuple[str, ...]] = ("latency_model", "tls", "prometheus", "fleet", "prediction_note", "engines")

    kvplan_version: str = __version__
    status: Literal["complete", "interrupted", "failed"]
    error: str | None = None
    run_dir: str
    mode: Literal["launch", "attach"]
    base_url: str
    model: str
    deployment: str | None = None
    # The onsets as plain fields (kvplan check --bench reads measured_first_preemption; null = none
    # seen up to the top of the sweep, or not searched when status is not "complete").
    measured_first_kv_wait: int | None = None
    measured_first_preemption: int | None = None
    predicted_first_kv_wait: int | None = None
    predicted_first_preemption: int | None = None
    engine_command: str | None = None
    metrics_error: str | None = None  # set when the server's /metrics could not be read
    workload: str
    capacity: EngineCapacity = Field(default_factory=EngineCapacity)
    planner: PlannerCapacity | None = None
    prediction: OnsetPrediction | None = None
    measured: MeasuredOnsets = Field(default_factory=MeasuredOnsets)
    points: list[PointResult]
    load_mode: Literal["concurrency", "rate"] = "concurrency"
    load_description: str | None = None  # how each point was loaded and sized
    latency_from: str = LATENCY_FROM
    slo: dict[str, float] = Field(default_factory=dict)
    highest_load_meeting_slo: Count | None = None  # concurrency or rate; null: none (or no SLO)
    source: str = "kvplan"
    rate_search: RateSearchResult | None = None  # --sweep-rate auto: what the search found
    headers: list[str] = Field(default_factory=list)  # extra request headers, values masked: "X-Token: ***"
    proxy: str | None = None  # the proxy every request went through (credentials masked); null: direct
    # TLS to an https server: "verified", "verified with --ca-bundle FILE", "NOT verified (--insecure)"; null: http
    tls: str | None = None
    latency_model: LatencyModelInfo | None = None  # what predicted the points' latency; null: older runs
    prometheus: PrometheusInfo | None = None  # --prometheus: the points' server figures came from there
    fleet: FleetSummary | None = None  # several replicas: each one's pool and the first to wait / preempt
    prediction_note: str | None = Field(None, description="why the onsets are not predicted on a known pool")
    # a data-parallel server (two engines or more, one --url): each engine's pool and the first engine to wait /
    # preempt, as a fleet's replicas (route "data-parallel"); the points' ``engines`` hold each engine's figures
    engines: FleetSummary | None = None

    @property
    def rate_mode(self) -> bool:
        return self.load_mode == "rate"


def highest_load_meeting(points: list[PointResult]) -> float | None:
    """The highest load (concurrency or rate) of a finished point meeting every SLO, below the first
    finished point that does not (a load above a miss is not trusted to hold)."""
    best = None
    for p in sorted((p for p in points if p.status == "ok" and p.slo_met is not None), key=lambda p: p.load):
        if not p.slo_met:
            break
        best = p.load
    return best
