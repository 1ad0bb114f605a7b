"""What one bench run is asked to do, as stored in run.json (so ``--resume`` continues it): the server or engine, the
workload, the load profile's options, SLOs and limits."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer, model_validator

from kvplan.bench.engine import EngineConfig
from kvplan.bench.limits import check_bench_bounds
from kvplan.bench.replay import TrafficReplay
from kvplan.bench.workload import Workload
from kvplan.errors import ExitCode, KvplanError
from kvplan.vllm.args import ENGINE_FIELDS, EngineArgs

#: Requests per point when neither --requests, --requests-per-stream nor --duration is given: enough
#: for a p99 that is not just the largest sample (kvplan.bench.stats.min_samples).
DEFAULT_REQUESTS = 100
MAX_PERCENTILES = 8  # --percentiles: at most this many


class BenchFailed(KvplanError):
    """The run could not go on (engine died, server went away): exit code 4 (ExitCode.RUN_FAILED)."""

    exit_code = int(ExitCode.RUN_FAILED)


class RateSearchConfig(BaseModel):
    """``--sweep-rate auto``: where the search starts, when it stops (kvplan.bench.sweep.search_rate)."""

    start: float = 1.0  # requests/s of the first point
    resolution: float = 0.1  # stop when (first missed - highest met) / highest met <= this
    max_points: int = 12


class PrometheusConfig(BaseModel):
    """--prometheus: the Prometheus every point's server figures are read from (kvplan.bench.prometheus), as run.json
    keeps it: no secret (the URL without its credentials, ``credentials`` saying it had some; header names only)."""

    url: str
    selector: str | None = None  # the label matchers, without braces (kvplan.bench.prometheus.parse_selector)
    header_names: list[str] = Field(default_factory=list)  # --prometheus-header names (values are never stored)
    credentials: bool = False  # the URL held user:password@ (never stored: --resume asks for it again)
    wait_s: float = Field(60.0, gt=0, le=3600)  # --prometheus-wait: the most a point waits for a fresh scrape


#: Replicas one run may name (--url or --metrics-url): above the fleet one client process can load and scrape
#: (each replica's /metrics is read every --scrape-interval).
MAX_REPLICAS = 64


class FleetConfig(BaseModel):
    """Several replicas (kvplan.bench.fleet): ``--url A --url B`` (kvplan spreads the requests by ``route``), or one
    gateway ``--url`` and one ``--metrics-url`` per replica (route ``gateway``: the gateway spreads them). Stored in
    run.json with any credential in a URL masked."""

    urls: list[str] = Field(default_factory=list, max_length=MAX_REPLICAS)  # where requests go, one per replica
    metrics_urls: list[str] = Field(default_factory=list, max_length=MAX_REPLICAS)  # each replica's server (/metrics)
    route: Literal["round-robin", "least-outstanding", "gateway"] = "round-robin"

    @model_validator(mode="after")
    def _one_shape(self) -> FleetConfig:
        if self.route == "gateway":
            if len(self.urls) != 1 or not self.metrics_urls:
                raise KvplanError("a gateway run has one --url and a --metrics-url per replica")
        elif len(self.urls) < 2 or (self.metrics_urls and len(self.metrics_urls) != len(self.urls)):
            raise KvplanError("a fleet of replicas has two --url or more (and, if given, one --metrics-url each)")
        return self

    @property
    def replicas(self) -> list[str]:
        """The servers whose /metrics are read, one per replica."""
        return list(self.metrics_urls or self.urls)


class BenchConfig(BaseModel):
    """Everything a run needs; stored in run.json so ``--resume`` can continue it."""

    url: str | None = None  # attach to a running server instead of launching
    engine: dict[str, Any] | None = None  # EngineConfig fields (launch mode)
    model: str | None = None  # model name in requests (default: the server's first model)
    workload: dict[str, Any] = Field(default_factory=dict)  # Workload fields
    sweep: list[int] | None = None  # None: automatic
    max_concurrency: int | None = None
    include_levels: list[int] = Field(default_factory=list)  # also measured by an automatic sweep
    requests_per_stream: int | None = None  # closed loop: each stream sends this many (old runs: 3)
    requests: int | None = None  # requests per point (default DEFAULT_REQUESTS unless duration_s is set)
    duration_s: float | None = None  # per point: no new request after this many seconds
    rates: list[float] | None = None  # open loop: one point per rate (requests/s) instead of concurrencies
    rate_search: RateSearchConfig | None = None  # open loop: search the highest rate meeting the SLOs
    burstiness: float = 1.0  # open loop: gamma shape of the inter-arrival gaps (1 = Poisson)
    rate_max_concurrency: int | None = None  # open loop: at most this many requests in flight
    slo: dict[str, float] = Field(default_factory=dict)  # SLO key -> seconds (kvplan.bench.slo)
    warmup: bool = True  # one unrecorded round before the first point
    prompt_sweep: str | None = None  # --prompt-sweep COUNT[:MAX_TOKENS]: 1-stream TTFTs of other prompt lengths
    scrape_interval_s: float = 0.5
    request_timeout_s: float = 300.0
    startup_timeout_s: float = 900.0
    max_num_seqs: int | None = None  # the engine's, for the prediction (None: not the limit)
    # attached (--url): the engine's token budget, for the prediction (None: not the limit); launched: engine's args
    max_num_batched_tokens: int | None = None
    planner_gpu: str | None = None  # --gpu for the planner's capacity next to the engine's
    deployment: str | None = None  # the kvplan.yaml deployment this run measures
    header_names: list[str] = Field(default_factory=list)  # --header names (values are never stored)
    steptime: str | None = None  # a calibrated step-time model (RUN or RUN/steptime.json) for predicted latency
    keep_alive: bool = True  # reuse connections (False: one per request, as kvplan did before)
    ca_bundle: str | None = None  # --ca-bundle: PEM CA certificates to verify an https server with
    insecure: bool = False  # --insecure: no TLS certificate verification
    gpu_metrics: str | None = None  # --gpu-metrics: a DCGM exporter's /metrics URL, or "nvml" (the local GPUs)
    # --percentiles: more percentiles of every latency (0 < q < 100), beside p50/p90/p95/p99
    percentiles: list[float] = Field(default_factory=list, max_length=MAX_PERCENTILES)
    traffic: TrafficReplay | None = None  # --traffic: replay sessions (kvplan.bench.replay) instead of a sweep
    prometheus: PrometheusConfig | None = None  # --prometheus: server figures by PromQL instead of /metrics alone
    fleet: FleetConfig | None = None  # several replicas (kvplan.bench.fleet); None: the one server of ``url``

    @model_serializer(mode="wrap")
    def _as_always_stored(self, handler):
        """A run stores the config it always stored: no ``fleet: null`` (one server), no ``max_num_batched_tokens:
        null`` (no budget given)."""
        data = handler(self)
        if isinstance(data, dict):
            for key in ("fleet", "max_num_batched_tokens"):
                if key in data and data[key] is None:
                    del data[key]
        return data

    @model_validator(mode="after")
    def _within_bounds(self) -> BenchConfig:
        check_bench_bounds(self)  # the command line and a resumed run.json alike
        bad = [q for q in self.percentiles if not (isinstance(q, (int, float)) and 0 < q < 100)]
        if bad:
            raise KvplanError(f"invalid --percentiles {bad[0]!r}", "give percentiles between 0 and 100, e.g. 50,90,99,99.9")
        if self.fleet is not None and self.traffic is not None:
            raise KvplanError("--traffic replays sessions on one server, not over several replicas",
                              "give one --url with --traffic (a session's turns must reach the replica holding its cache)")
        if self.fleet is not None and self.prometheus is not None:
            raise KvplanError("--prometheus reads one server's figures; several replicas are each scraped at their "
                              "/metrics", "leave --prometheus out with several --url or --metrics-url")
        if self.fleet is not None and (self.url is None or self.engine is not None):
            raise KvplanError("several replicas are attached to, never launched", "give each replica's --url")
        return self

    def engine_config(self) -> EngineConfig | None:
        if self.engine is None:
            return None
        data = {key: value for key, value in self.engine.items() if key not in ENGINE_FIELDS}
        for key in ("extra_args", "engine_cmd"):
            data[key] = tuple(data.get(key) or ())
        data["env"] = tuple(tuple(pair) for pair in data.get("env") or ())
        return EngineConfig(args=EngineArgs.from_stored(self.engine), **data)

    def workload_obj(self, nonce: str = "") -> Workload:
        data = dict(self.workload)
        data["trace"] = tuple(tuple(pair) for pair in data.get("trace") or ())
        if "token_id_range" in data:
            data["token_id_range"] = tuple(data["token_id_range"])
        data["nonce"] = nonce
        return Workload(**data)
