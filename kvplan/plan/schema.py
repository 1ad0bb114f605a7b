"""The contract between the planner and its edges, and the --json schema.

These are frozen stdlib dataclasses, validated and serialized by pydantic at the edges
(``pydantic.TypeAdapter(SizePlan)``: `kvplan schema`, `--json`): the planner builds them
without paying for validation it does not need, and the JSON schema is the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvplan.calibration import Calibration
from kvplan.errors import KvplanError
from kvplan.model.encoders import MAX_MM_PIXELS
from kvplan.plan.offload import OffloadTier, check_offloading_size
from kvplan.plan.speculative import SpeculativeConfig, parse_speculative_config
from kvplan.plan.steptime import StepTimeModel
from kvplan.vllm.args import READ_BACK

if TYPE_CHECKING:
    from kvplan.plan.capacity import Capacity

_MIN_ONE = ("tensor_parallel_size", "pipeline_parallel_size", "decode_context_parallel_size", "data_parallel_size",
            "block_size", "max_model_len",
            "kv_cache_memory_bytes", "num_gpu_blocks_override", "max_num_seqs", "max_num_batched_tokens",
            "weights_bytes", "concurrency", "prompt_tokens", "mm_max_pixels", "pd_decode_tp", "pd_prompt_tokens")


_MAX = {"draft_layers": 1024, "tensor_parallel_size": 4096, "pipeline_parallel_size": 4096,
        "decode_context_parallel_size": 4096, "data_parallel_size": 65536, "concurrency": 100_000_000, "max_num_seqs": 100_000_000,
        "mm_max_pixels": MAX_MM_PIXELS, "pd_decode_tp": 4096}


@dataclass(frozen=True)
class Settings:
    """How a model is deployed: what `vllm serve` would be given, plus the workload asked."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    hybrid_kv_cache_manager: bool | None = None  # None: vLLM's default for the model
    usage_context: str = "serve"  # `vllm serve` (serve) or the offline LLM class (llm)
    weights_bytes: int | None = None  # loaded weights per device, if known
    # None: vLLM's default (on in V1). Off turns Mamba prefix caching ("align" mode) off too.
    enable_prefix_caching: bool | None = None
    # None: vLLM's default for the release (on from 0.32 unless pipeline parallel).
    async_scheduling: bool | None = None
    mamba_ssm_cache_dtype: str = "auto"  # vLLM's --mamba-ssm-cache-dtype
    decode_context_parallel_size: int = 1  # vLLM's --decode-context-parallel-size
    # vLLM's --data-parallel-size: replicas of tp x pp GPUs, each with its own KV pool (kvplan size sets it
    # from the GPUs given). MoE experts are sharded over all of them (kvplan.plan.capacity).
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False  # vLLM's --enable-expert-parallel: whole experts per GPU
    # Speculative decoding: vLLM's --speculative-config as vLLM resolves it (kvplan.plan.speculative).
    speculative: SpeculativeConfig | None = None
    # KV-holding layers of the draft, shaped like the target's last attention layer and sharing its pool;
    # 0: as the speculative config gives them (MTP: the checkpoint's modules; EAGLE: 1).
    draft_layers: int = 0
    # vLLM's --language-model-only (or every --limit-mm-per-prompt modality at 0): the
    # multimodal towers are not built, so their weights are not loaded.
    language_model_only: bool = False
    # The processor's largest image in pixels (vLLM's --mm-processor-kwargs '{"max_pixels": N}'); None: the
    # processor's default. It sizes the encoder pass of the profile run (kvplan.model.encoders).
    mm_max_pixels: int | None = None
    skip_mm_profiling: bool = False  # vLLM's --skip-mm-profiling: no encoder pass in the profile run
    # The workload: concurrent requests of prompt + output tokens, optionally sharing a prefix.
    concurrency: int = 1
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    shared_prefix_tokens: int = 0
    # vLLM's --kv-offloading-size (GiB over the engine's ranks) and --kv-offloading-backend: a CPU tier beside
    # the GPU pool (kvplan.plan.offload); the pool itself is planned as without it.
    kv_offloading_size: float | None = None
    kv_offloading_backend: str | None = None  # None: vLLM's default, native
    # The RAM of the host one engine runs on, bytes (--host-memory; the local MemTotal with --gpu auto): the CPU
    # tier's host memory must fit in it. None: not known, not checked.
    host_memory_bytes: int | None = None
    # Prefill/decode disaggregation over vLLM's NixlConnector (kvplan.plan.disagg): this deployment is the
    # prefill instance; the decode instance's TP, the prompt moved (None: the context length) and the tokens
    # the decode's own prefix cache already holds. None: no P/D transfer asked.
    pd_decode_tp: int | None = None
    pd_prompt_tokens: int | None = None
    pd_decode_hit_tokens: int = 0
    pd_link_gb_per_s: float | None = None  # one NIC's rate, GB/s, beside the standard ones

    def __post_init__(self) -> None:
        for name in _MIN_ONE:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise KvplanError(f"invalid {name}: {value!r} must be a whole number >= 1")
        for name in ("output_tokens", "shared_prefix_tokens", "draft_layers", "pd_decode_hit_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise KvplanError(f"invalid {name}: {value!r} must be a whole number >= 0")
        for name, cap in _MAX.items():  # far above any real deployment: larger is a typo or an attack
            value = getattr(self, name)
            if isinstance(value, int) and value > cap:
                raise KvplanError(f"invalid {name}: {value:,} (at most {cap:,})")
        util = self.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            raise KvplanError(f"invalid gpu_memory_utilization: {util!r} must be in (0, 1]")
        if self.mamba_ssm_cache_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise KvplanError(f"invalid mamba_ssm_cache_dtype: {self.mamba_ssm_cache_dtype!r} "
                              "(auto, float32, bfloat16 or float16)")
        if self.usage_context not in ("serve", "llm"):
            raise KvplanError(f"invalid usage_context: {self.usage_context!r} (serve or llm)")
        check_offloading_size(self.kv_offloading_size, self.kv_offloading_backend or "native")
        rate = self.pd_link_gb_per_s
        if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate <= 100_000):
            raise KvplanError(f"invalid P/D link rate: {rate!r} GB/s", "give one NIC's rate in GB/s, e.g. 50 (400 Gb/s)")

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)


# The report's parts: frozen and never compared, so no __eq__/__hash__ to generate at start-up.
output_record = dataclass(frozen=True, eq=False)


def settings_from_engine_args(source: object, **extra: object) -> Settings:
    """The planner's ``Settings`` from anything that names vLLM's engine arguments as vLLM does (a
    parsed start-up log, a public report, the bench's EngineArgs): the inverse of ``engine_args``.
    ``extra`` sets what such a source does not carry (usage context, workload, weights) or overrides it."""
    values: dict[str, object] = {}
    for name, default in READ_BACK:
        value = getattr(source, name, None)
        values[name] = default if value is None else value
    for name in ("enforce_eager", "language_model_only", "skip_mm_profiling"):
        values[name] = bool(values[name])
    spec = getattr(source, "speculative_config", None)  # vLLM's dict (a log's non-default args) or its JSON
    if spec:
        values["speculative"] = parse_speculative_config(spec, strict=False)  # another release's keys too
    kwargs = getattr(source, "mm_processor_kwargs", None)  # EngineArgs carries vLLM's dict
    if values["mm_max_pixels"] is None and isinstance(kwargs, dict):
        values["mm_max_pixels"] = kwargs.get("max_pixels")
    values.update(extra)
    return Settings(**values)


@output_record
class MemoryTerm:
    """One named term of the per-device KV budget."""

    name: str
    bytes: int
    low_bytes: int
    high_bytes: int
    sign: int  # +1 adds to the KV budget, -1 takes from it, 0 informative
    how: str


@output_record
class KVGroupInfo:
    kind: str
    layers: int
    padding_layers: int
    block_size: int
    detail: str


@output_record
class ConcurrencyCell:
    context_tokens: int
    concurrency: int
    blocks_needed: int
    pool_fraction: float
    fits: bool


@output_record
class Suggestion:
    change: str
    flags: str  # as `kvplan size` / `vllm serve` options
    result: str
    fits: bool
    # The same change by setting name (max_model_len, concurrency, kv_cache_dtype, gpu,
    # tensor_parallel_size, max_num_seqs), for tools that write it elsewhere (kvplan.yaml).
    updates: dict[str, str] = field(default_factory=dict)


@output_record
class PDTransferPlan:
    """`kvplan size --pd-decode-tp N`: one request's KV moved from this (prefill) deployment to a decode
    instance over vLLM's NixlConnector (kvplan.plan.disagg, vLLM 0.32): each decode rank reads its own page of
    every prompt block its prefix cache lacks (the last partial block whole)."""

    prompt_tokens: int
    decode_hit_tokens: int  # the decode's own prefix-cache hit, full blocks: not moved
    block_size: int
    blocks: int  # blocks moved, per layer
    prefill_tp: int
    decode_tp: int
    replicated: bool  # every decode rank reads whole blocks (MLA, or fewer KV heads than the decode TP)
    decode_block_bytes: int  # one decode rank's block over all its layers
    bytes_per_decode_rank: int
    sources_per_decode_rank: list[list[int]]  # the prefill ranks each decode rank reads, one NIXL READ each
    sent_per_prefill_rank: list[int]
    total_bytes: int  # over every link
    transfers: int  # NIXL READs, one per (decode rank, source rank)
    transfer_s: dict[str, float]  # link (one NIC per GPU on each side) -> seconds for the busiest NIC, no overhead


@output_record
class WorkloadTier:
    """`kvplan size --workload FILE --kv-offloading-size GiB`: the CPU tier behind the pool, requests served
    one at a time through both (kvplan.plan.tier_cache: vLLM 0.32's OffloadingConnector, under the tier's
    eviction policy and store threshold). Rates are shares of the prompt tokens (vLLM's prefix-cache and
    connector hit counters)."""

    tier_chunks: int  # chunks of one KV group's blocks the tier holds
    blocks_per_chunk: int
    gpu_hit_rate: float
    tier_hit_rate: float
    miss_rate: float
    unbounded_tier_hit_rate: float  # a tier that never evicts, behind the same pool
    tier_for_share: dict[str, int]  # "50%" / "90%" / "99%" of the unbounded tier's hits -> chunks needed
    tier_share_used: dict[str, float]  # the same, as a share of this tier (> 1: more than it)
    failed_stores: int  # requests whose new chunks outnumbered what the tier could free: stored nothing
    notes: list[str] = field(default_factory=list)
    eviction_policy: str = "lru"  # kv_connector_extra_config's eviction_policy modelled: lru (vLLM's default) or arc
    store_threshold: int = 0  # its store_threshold: < 2 stores every offered chunk (vLLM's default 0)


@output_record
class WorkloadPlan:
    """`kvplan size --workload FILE`: the traffic's prefix-cache working set on this deployment's pool,
    requests served one at a time (kvplan.plan.prefix_cache.working_set)."""

    source: str
    requests: int
    sessions: int
    block_size: int
    pool_blocks: int  # usable blocks of one replica
    queried_tokens: int
    achievable_hit_rate: float  # an unbounded pool's hits / queried tokens
    hit_rate_at_pool: float  # this pool's
    pool_for_share: dict[str, int]  # "50%" / "90%" / "99%" of the achievable hits -> blocks needed
    pool_share_used: dict[str, float]  # the same, as a share of this pool (> 1: it does not fit)
    sessions_held_at_once: int  # sessions whose largest turns fit together (the heaviest first)
    notes: list[str] = field(default_factory=list)
    tier: WorkloadTier | None = None  # with --kv-offloading-size (native backend): the CPU tier behind the pool


@output_record
class SizePlan:
    """Everything `kvplan size` answers. Top-level names are stable for scripts."""

    model: str
    model_source: str
    model_source_detail: str
    gpu: str
    gpu_count: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    replicas: int
    vllm_version: str
    attention: str
    kv_cache_dtype: str
    kv_bytes_per_token: int  # whole model, every attention layer, one token
    kv_bytes_per_token_per_device: float
    kv_bytes_per_token_all_devices: float
    block_size: int
    block_bytes: int  # one block id across its group's layers, per device
    kv_groups: list[KVGroupInfo]
    memory_terms: list[MemoryTerm]
    available_kv_bytes: int
    available_kv_bytes_low: int
    available_kv_bytes_high: int
    weights_bytes: int  # loaded weights per device
    weights_total_bytes: int
    weights_source: str
    num_blocks: int
    kv_cache_tokens: int  # "GPU KV cache size: N tokens" as that vLLM prints it
    max_model_len: int
    max_concurrency: float  # "Maximum concurrency for L tokens per request" as printed
    request_tokens: int
    concurrency: int
    blocks_per_request: int
    max_concurrency_at_request: int  # requests of request_tokens that fit at once, per replica x replicas
    max_context_at_concurrency: int
    max_num_seqs: int
    max_num_batched_tokens: int
    fits: bool  # at the estimate: what the exit code says (0 / 1)
    # The verdict at the low end of the KV budget's range too (--strict exits 1 without it); range_note
    # says where the verdict does not hold across the range (a FITS whose low end does not fit, or a
    # DOES NOT FIT whose high end would).
    fits_across_range: bool
    range_note: str | None
    verdict: str
    limiting_term: str
    table: list[ConcurrencyCell]
    suggestions: list[Suggestion]
    vllm_serve_command: str
    notes: list[str] = field(default_factory=list)
    # "kvplan rules", "vLLM 0.32.0 (exact)" (learned from the installed engine), or
    # "unverified: ..." (an unknown model_type planned as a plain decoder on request).
    layout_source: str = "kvplan rules"
    # The capacity line(s) vLLM logs at start-up, as this release words them.
    vllm_startup_lines: list[str] = field(default_factory=list)
    # With --prompt: a step-time estimate (kvplan.plan.steptime.quick_latency): ttft_ms, tpot_ms, e2e_ms,
    # output_tokens_per_s, and "source" (prior: roofline x assumed efficiencies; or calibrated).
    latency: dict[str, object] | None = None
    workload: WorkloadPlan | None = None  # --workload FILE
    offload: OffloadTier | None = None  # --kv-offloading-size GiB (native backend): the CPU tier, per replica
    pd_transfer: PDTransferPlan | None = None  # --pd-decode-tp N: the prefill -> decode transfer of one request

    # The Capacity the plan was made from rides along outside the fields (so never in the JSON): what goes on
    # from a plan (check's margin and fleet gate, --workload's pool) reads its pool and layout from it instead
    # of planning again, which could differ (calibrations, measured weights).
    def with_capacity(self, cap: Capacity) -> SizePlan:
        object.__setattr__(self, "_capacity", cap)
        return self

    @property
    def capacity(self) -> Capacity:
        return self.__dict__["_capacity"]

    def replace(self, **changes: object) -> SizePlan:
        new = dataclasses.replace(self, **changes)
        return new.with_capacity(self.capacity) if "_capacity" in self.__dict__ else new


# --------------------------------------------------------------------------- kvplan fit --json
# What `kvplan fit --json` prints (kvplan.cli.fit_cmd builds it; `kvplan schema fit` prints this schema).
# Times in the unit their name says (_ms, _s); rates per second; memory in blocks of the plan's block size.


@output_record
class FitLatencyEstimate:
    """One request's latency at the asked concurrency, from the step-time prior (roofline x assumed efficiencies)."""

    ttft_ms: float
    tpot_ms: float
    e2e_s: float
    output_tokens_per_s: float  # all replicas
    source: str  # "prior"


@output_record
class FitFleetPrediction:
    """The scheduler simulator's prediction (kvplan.plan.steptime.LatencyPrediction.to_json); `fit --rate`: one
    replica at its share of the rate (kvplan.plan.fleet)."""

    ttft_ms: dict[str, float | None]  # percentile ("p50" ... "p99", "mean") -> ms
    itl_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    queueing_ms: dict[str, float | None]
    output_tokens_per_s: float  # one replica (fit --rate); all replicas (FitLatencyPrediction)
    preemptions: int
    peak_kv_fill: float  # the largest share of the pool in use
    source: str  # "prior" or "calibrated"


@output_record
class FitLatencyPrediction(FitFleetPrediction):
    """With --slo: the prediction of the deployment under the asked closed-loop load."""

    requests_per_stream: int
    load: str


@output_record
class FitSloCheck:
    target_ms: float
    predicted_ms: float | None
    met: bool | None


@output_record
class FitDeployment:
    """One deployment that fits, planned as `kvplan size` plans it."""

    gpu: str
    gpus: int  # GPUs of the whole deployment (tensor x pipeline x data parallel)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int  # replicas
    kv_cache_dtype: str
    max_model_len: int  # tokens
    headroom: float  # share of the pool left at the asked load (0.2: 20%)
    blocks_needed: int  # blocks the asked load holds, per replica
    usable_blocks: int  # blocks of one replica's pool
    price_per_hour: float | None  # with --price or a catalog price, the deployment's
    verdict: str
    latency_estimate: FitLatencyEstimate | None
    latency_predicted: FitLatencyPrediction | None
    slo: dict[str, FitSloCheck] | None  # SLO name ("ttft_p99"...) -> target and prediction
    vllm_serve_command: str


@output_record
class FitOutput:
    """Everything `kvplan fit` answers: the deployments that fit, best first, and why others were rejected."""

    model: str
    model_source: str
    vllm_version: str  # the rules planned with
    ctx: int  # context asked, tokens
    concurrency: int
    prompt_tokens: int | None
    output_tokens: int | None
    candidates_evaluated: int
    candidates_fitting: int
    search_seconds: float
    rejected: dict[str, int]  # reason -> candidates
    slo: dict[str, float] | None  # SLO name -> target in ms
    slo_description: str | None
    slo_rejected: dict[str, int]  # reason -> deployments the SLOs ruled out
    slo_simulated: int  # deployments simulated for the SLOs
    slo_search_stopped: bool  # the simulation budget ran out before every deployment was tried
    deployments: list[FitDeployment]


# `kvplan fit --rate R --json` (kvplan.cli.fit_cmd._fleet_payload; `kvplan schema fit-rate`).


@output_record
class FitFleet:
    """The fewest replicas of one deployment shape that serve the rate at the SLOs."""

    gpu: str
    gpus_per_replica: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kv_cache_dtype: str
    max_model_len: int
    replicas: int | None  # None: no colocated fleet meets the SLOs, only its P/D pair (--pd)
    gpus: int | None  # all replicas
    per_replica_rate_per_s: float | None
    binding: str  # what bounds a replica's rate: kv, batch, compute or none ("-" without a fleet)
    price_per_hour: float | None  # all replicas
    usd_per_million_output_tokens: float | None
    latency_predicted: FitFleetPrediction | None
    slo: dict[str, FitSloCheck]
    simulations: int
    vllm_serve_command: str  # one replica
    pd: FitPDPair | None = None  # --pd: the same engine as prefill and decode replicas


@output_record
class FitPDPair:
    """`fit --rate --pd`: one shape as prefill and decode replicas (kvplan.plan.fleet.pd_replicas_for_rate)."""

    replicas: int | None  # prefill + decode; None: no pair meets the SLOs (reason)
    prefill_replicas: int | None  # simulated at the TTFT target less the transfer and the decode's first step
    decode_replicas: int | None  # steady state: rate / (decode_concurrency / (output x decode_step))
    gpus: int | None
    transfer_ms: float | None  # one request's KV over the busiest NIC (kvplan.plan.disagg)
    decode_concurrency: int | None  # requests one decode replica runs at once
    decode_step_ms: float | None
    decode_binding: str | None  # kv | batch | tpot: what caps the decode concurrency
    prefill_binding: str | None  # kv | batch | compute | none, as a fleet's binding
    link_gb_per_s: float
    reason: str  # why there is no pair, or ""
    price_per_hour: float | None = None
    usd_per_million_output_tokens: float | None = None


@output_record
class FleetFitOutput:
    """Everything `kvplan fit --rate R` answers: fleets, cheapest (else fewest GPUs) first."""

    model: str
    model_source: str
    vllm_version: str
    ctx: int
    rate_per_s: float  # requests per second, all replicas
    prompt_tokens: int | None
    output_tokens: int | None
    candidates_evaluated: int
    candidates_fitting: int
    rejected: dict[str, int]  # reason -> candidates
    slo: dict[str, float]  # SLO name -> target in ms
    slo_description: str
    shapes_sized: int
    fleet_unmet: dict[str, int]  # reason -> shapes that met no SLO within max_replicas
    fleet_simulations: int
    fleet_search_stopped: bool  # the shape or simulation limit was reached
    max_replicas: int
    pd: bool  # --pd: every fleet carries its P/D pair
    pd_link_gb_per_s: float | None
    fleets: list[FitFleet]
    search_seconds: float
    steptime_run: str | None = None  # --steptime RUN: the measured engine sized (no GPU search); None: the search
    steptime_note: str | None = None  # --steptime RUN: the prompt lies outside the lengths its calibration saw


@output_record
class GpuRow:
    """One row of `kvplan gpus --json` (the GPU catalog, profiles/gpus.json)."""

    name: str
    memory_mib: int  # what the driver reports (nvidia-smi's total)
    cuda_total_gib: float  # what CUDA reports as total, which vLLM's memory budget starts from
    cuda_total_measured: bool  # false: estimated (the driver total minus the median reserve of measured rows)
    bandwidth_gbps: float | None  # memory bandwidth, GB/s
    bf16_dense_tflops: float | None  # dense BF16 TFLOP/s (no sparsity)


@output_record
class ModelRow:
    """One row of `kvplan models --json` (the bundled model profiles)."""

    model: str  # the Hub id
    attention: str  # e.g. "GQA", "MLA", "hybrid (attention + recurrent state)"
    kv_bytes_per_token: int  # KV bytes a token takes over all layers, in the model's dtype, before TP
    params_b: float  # parameters, billions


# --------------------------------------------------------------------------- kvplan calibrate --json


@dataclass(frozen=True, eq=False)
class StartupCalibrationOutput(Calibration):
    """`kvplan calibrate LOG --json`: the start-up measured (GiB per GPU, as vLLM printed them) and recorded."""

    residual_gib: float = 0.0  # measured overhead - kvplan's modelled overhead: what `kvplan size` shifts by
    profile: str = ""  # the calibration file it was written to


@output_record
class StepTimeCalibrationOutput:
    """`kvplan calibrate --bench RUN --json`: the step-time model fitted to a bench run (RUN/steptime.json)."""

    schema: int
    run_dir: str
    model: str
    device: str
    workload: dict[str, Any]  # the run's workload, as run.json records it
    scheduler: dict[str, Any]  # the engine's scheduler limits the fit assumed
    points_used: list[float]  # the concurrencies of the points fitted
    recorded_at: str  # ISO time
    steptime: StepTimeModel  # seconds a step: overhead + memory / (bandwidth x efficiency) + compute / ...
    written: str  # the steptime.json written
    # [shortest, longest] prompt the fit saw, tokens (points and --prompt-sweep); a prediction outside says so
    prompt_tokens_seen: list[int] | None = None
    prompt_sweep_requests: int = 0  # requests of RUN/prompt_sweep.json (kvplan bench --prompt-sweep) fitted too
    # the data's price of a prompt token: 1-stream TTFT vs prompt tokens, Theil-Sen slope with Sen's 95% interval
    # (data_ms_per_token, data_low/high_ms_per_token), next to the model's (model_ms_per_token); null: too few lengths
    prompt_token_price: dict[str, Any] | None = None
    # ms a request spends outside the engine's steps at one stream (at request_overhead_held_at_rps) by vLLM's own queue
    # and prefill histograms, where the run recorded them: the request overhead's line goes through it
    # (kvplan.plan.steptime.outside_steps_at_one_stream); null: fitted from the TTFTs alone
    request_overhead_held_ms: float | None = None
    request_overhead_held_at_rps: float | None = None


#: `kvplan schema calibrate`: either record, by the command's mode.
CalibrateOutput = StartupCalibrationOutput | StepTimeCalibrationOutput
