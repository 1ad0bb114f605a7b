"""One bench run: engine (launched or attached) -> capacity -> prediction -> sweep -> results.

Ties the parts together; each part stays testable on its own (engine.py, loadgen.py, metrics.py,
sweep.py, store.py, outputs/). Every finished point is appended to the run folder before the
next one starts; the engine is stopped in ``finally`` whatever happens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan import __version__
from kvplan.bench import store as st
from kvplan.bench.client import GET_BODY_S, REDIRECT_HINT, Client, credential_secrets, is_redirect, masked_headers, shown_proxy
from kvplan.bench.config import DEFAULT_REQUESTS, BenchConfig, BenchFailed
from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port, no_interrupts
from kvplan.bench.fleet import EnginePools, Fleet, card_context, fleet_secrets, model_cards
from kvplan.bench.gpu_telemetry import sample_during, summarize_gpu, telemetry_client
from kvplan.bench.latency import no_prediction, predictor_for
from kvplan.bench.loadgen import RequestRecord, StopSignal, run_closed_loop, run_open_loop, run_sessions, run_stoppable
from kvplan.bench.loads import ClosedLoad, Load, OpenLoad, ReplayLoad
from kvplan.bench.metrics import Snapshot, scrape_during, scrape_once
from kvplan.bench.outputs import write_reports
from kvplan.bench.point import engine_list, peak_in_flight, point_result
from kvplan.bench.profiles import profile_for
from kvplan.bench.prometheus import Prometheus
from kvplan.bench.prompt_sweep import (
    PROMPT_SWEEP_FILE,
    parse_prompt_sweep,
    sweep_from_records,
    sweep_lengths,
    sweep_specs,
    write_prompt_sweep,
)
from kvplan.bench.replay import (
    ServedGroups,
    first_sessions,
    load_replay_traffic,
    replay_figures,
    request_specs,
    served_groups,
    session_sends,
)
from kvplan.bench.results import (
    BenchSummary,
    MeasuredOnsets,
    OnsetAgreement,
    OnsetName,
    OnsetPrediction,
    PlannerCapacity,
    PointResult,
    PredictedLatency,
    PrometheusInfo,
    RateSearchResult,
    ServerFigures,
    highest_load_meeting,
)
from kvplan.bench.sweep import (
    Onset,
    RateSearch,
    SweepStopped,
    block_rule,
)
from kvplan.bench.view import NullView
from kvplan.deploy import load_model, plan_deployment, select_gpus
from kvplan.engines import EngineCapacity, engine_named
from kvplan.engines.vllm import version_from_endpoint
from kvplan.errors import KvplanError
from kvplan.plan.blocks import BlockRule
from kvplan.plan.hybrid_cache import MANAGER_OF_KIND
from kvplan.plan.hybrid_rule import HybridRule
from kvplan.plan.schema import settings_from_engine_args
from kvplan.plan.simulate import SchedulerConfig
from kvplan.term import esc, printable
from kvplan.units import cdiv
from kvplan.vllm.rules import rules_for
from kvplan.vllm.startup_log import read_startup_log, redact

if TYPE_CHECKING:
    from kvplan.bench.latency import PointPredictor

def _first(onset: Onset | None) -> int | None:
    return None if onset is None else onset.first


class BenchRun:
    """Drive one run. ``execute()`` returns the summary; the engine is always stopped."""

    def __init__(self, cfg: BenchConfig, store: st.RunStore, view: NullView | None = None,
                 previous: list[dict[str, Any]] | None = None, api_key: str | None = None,
                 expected_model: str | None = None, headers: tuple[tuple[str, str], ...] = (),
                 prometheus: Prometheus | None = None):
        self.cfg = cfg
        # The key (a bearer token) and --header values go with every client request and probe; held
        # here only, never in BenchConfig (which run.json stores) nor in any file (kvplan.bench.client).
        self.client = Client(api_key=api_key or None, headers=tuple(headers),
                             url_secrets=credential_secrets(cfg.url or "") + fleet_secrets(cfg.fleet),
                             ca_bundle=cfg.ca_bundle, insecure=cfg.insecure)
        self.expected_model = expected_model or None  # --resume: the model the run's points measured
        self.store = store
        # --prometheus: the points' server figures by PromQL (kvplan.bench.prometheus); its credentials are its own
        self.prometheus = prometheus
        self.store.secrets = tuple(self.client.secrets()) + (tuple(prometheus.client.secrets()) if prometheus else ())
        self.view = view or NullView()
        self.launcher: EngineLauncher | None = None
        self.base_url = cfg.url.rstrip("/") if cfg.url else ""
        self.model = cfg.model or ""
        self.capacity = EngineCapacity()
        self.served_groups: ServedGroups | None = None  # the served model's KV cache groups (a replay's prediction)
        self.prediction_note: str | None = None  # why the onsets are not predicted, when the pool is known
        self.rule: BlockRule | HybridRule | None = None
        self.rule_exact = False
        self.planner: PlannerCapacity | None = None
        self.nonce = str(time.time_ns())
        self.workload = cfg.workload_obj(self.nonce)
        self.points: list[PointResult] = []
        for number, row in enumerate(previous or [], start=1):  # --resume: finished points count, failed ones run again
            point = _resumed_point(row, number, store)
            if point.status == "ok":
                self.points = [p for p in self.points if p.load_key != point.load_key] + [point]
        self.run_info: dict[str, Any] = {}
        self._next_index = 0
        self._request_rows: list[dict[str, Any]] = []
        self.summary_obj: BenchSummary | None = None
        self.metrics_error: str | None = None  # the server has no readable /metrics
        self.onsets: dict[OnsetName, Onset | None] = {"first_kv_wait": None, "first_preemption": None}
        self.rate_search: RateSearch | None = None
        self.latency: PointPredictor | None = None
        # --traffic: the sessions every point replays a part of
        self.traffic = load_replay_traffic(cfg.traffic) if cfg.traffic is not None else None
        self.profile = profile_for(cfg)  # which points the run measures (kvplan/bench/profiles/)
        self.fleet = Fleet(cfg.fleet) if cfg.fleet is not None else None  # several replicas (kvplan.bench.fleet)
        self.engines: EnginePools | None = None  # a data-parallel server's engines (kvplan.bench.fleet.EnginePools)
        self.max_model_len: int | None = None  # the served context, when the server or its log says it
        self.model_cards: dict[str, dict] = {}  # the server's /v1/models, by model id

    @property
    def api_key(self) -> str | None:
        return self.client.api_key

    @property
    def run_dir(self) -> Path:
        return self.store.path

    @property
    def shown_url(self) -> str:
        """The server's URL for messages: credentials in it masked."""
        return redact(self.base_url)

    # ---------------------------------------------------------------- engine and capacity

    def _start_engine(self) -> None:
        ecfg = self.cfg.engine_config()
        assert ecfg is not None
        if ecfg.port == 0:  # automatic: a free port now (also on --resume)
            ecfg = dataclasses.replace(ecfg, port=free_port(ecfg.host))
        # An engine kvplan starts listens on this machine: the probe and the load reach it directly, never
        # through a proxy of the environment (which could not reach it).
        self.client = dataclasses.replace(self.client, use_env_proxy=False)
        self.launcher = EngineLauncher(ecfg, self.store.engine_log, startup_timeout_s=self.cfg.startup_timeout_s,
                                       api_key=self.api_key, headers=self.client.headers)
        self.launcher.start()
        if self.launcher.api_key:  # --engine-arg=--api-key=K: the client sends K
            self.client = dataclasses.replace(self.client, api_key=self.launcher.api_key)
        self.base_url = ecfg.base_url
        self.run_info["engine"] = {"pid": self.launcher.pid, "command": self.launcher.command,
                                   "log": st.ENGINE_LOG, "base_url": self.base_url}
        self._write_run()
        self.view.engine_starting(0.0)
        took = self.launcher.wait_ready(on_tick=self.view.engine_starting)
        # The load generator must never be what is measured: the engine's own busy-polling processes yield
        # the CPU to its API server and to this client (EngineLauncher.yield_cpu_to_front_end).
        self.run_info["engine"]["reniced_processes"] = self.launcher.yield_cpu_to_front_end()
        self.run_info["engine"]["ready_after_s"] = round(took, 1)
        self.view.engine_ready(took)

    def _attach(self, base_url: str) -> None:
        """The server at ``base_url`` answers as a vLLM OpenAI server, without a key it lacks or a redirect."""
        shown_url = redact(base_url)
        via = self.client.via(base_url)
        status, _ = self.client.get(base_url + "/v1/models", timeout_s=5)
        if status == 0:
            raise KvplanError(f"nothing answers at {shown_url}{via}", "start vLLM there, or check --url (scheme, host, port)"
                              + (" and the proxy (HTTP_PROXY, NO_PROXY)" if via else ""))
        if status in (401, 403):
            hint = ("pass --api-key (or set OPENAI_API_KEY)" if not self.api_key and not self.client.headers
                    else "check --api-key and --header")
            raise KvplanError(f"{shown_url}/v1/models answered HTTP {status}{via}: the server wants an API key", hint)
        if status == 407:
            raise KvplanError(f"the proxy {shown_proxy(self.client.proxy(base_url))} answered HTTP 407: it wants "
                              "credentials", "put them in the proxy URL (HTTP_PROXY=http://user:pass@host:port)")
        if is_redirect(status):
            raise KvplanError(f"{shown_url}/v1/models answered HTTP {status}, a redirect{via}", REDIRECT_HINT)
        if status != 200:
            raise KvplanError(f"{shown_url}/v1/models answered HTTP {status}{via}",
                              "is this a vLLM OpenAI-compatible server?")
        health, _ = self.client.get(base_url + "/health", timeout_s=5)
        if is_redirect(health):
            raise KvplanError(f"{shown_url}/health answered HTTP {health}, a redirect{via}", REDIRECT_HINT)
        if health == 0:
            raise KvplanError(f"{shown_url}/health gave no whole answer within {5 + GET_BODY_S:g} s{via}",
                              "is this a vLLM OpenAI-compatible server?")
        if health not in (200, 404):
            raise KvplanError(f"{shown_url}/health answered HTTP {health}{via}: the engine is not healthy")

    def _discover_model(self) -> None:
        _, self.model_cards = model_cards(self.client, self.base_url)
        ids = list(self.model_cards)
        if self.expected_model is not None:
            # --resume: the finished points measured that model; points of another one must not join them.
            if ids and self.expected_model not in ids:
                raise KvplanError(
                    f"cannot resume: the run measured {printable(self.expected_model, 200)!r}, but "
                    f"{self.shown_url} serves {printable(', '.join(ids), 300)}",
                    "resume against the server the run started with, or start a new run")
            if not ids:
                raise KvplanError(f"cannot resume: {self.shown_url}/v1/models does not say which model it serves",
                                  "a resumed run must be checked to measure the same model")
            if not self.model:
                self.model = self.expected_model
        if not self.model:
            if not ids:
                raise KvplanError(f"{self.shown_url}/v1/models lists no model", "pass the served model name with --model-name")
            self.model = ids[0]
        elif ids and self.model not in ids:
            raise KvplanError(f"the server does not serve {self.model!r}", f"it serves: {', '.join(ids)}")

    def _read_capacity(self, snap: Snapshot | None) -> None:
        """The pool the engine reports, by its own door (kvplan.engines): its /metrics first, its log to fill in."""
        engine = engine_named(self.launcher.cfg.engine if self.launcher is not None else "vllm")
        cap = EngineCapacity()
        if snap is not None and snap.cache_info:
            cap = engine.capacity_from_metrics(snap.cache_info)
        if self.launcher is not None:
            try:
                log_cap = engine.capacity_from_log(read_startup_log(str(self.store.engine_log), "engine log"))
            except (OSError, KvplanError):
                log_cap = EngineCapacity()
            cap = cap.merged(log_cap) if cap.source else log_cap.merged(cap)
        if cap.vllm_version is None and (self.launcher is None or self.launcher.cfg.engine == "vllm"):
            # A server kvplan did not start: its release (which decides, say, a Mamba-2 mixer's checkpoint page in
            # the replay's prediction) from its /version; a server without one leaves it unknown.
            status, body = self.client.get(self.base_url + "/version", timeout_s=5)
            cap = dataclasses.replace(cap, vllm_version=version_from_endpoint(body) if status == 200 else None)
        self.capacity = cap

    def _served_context(self) -> int | None:
        """The engine's max_model_len: as its /v1/models says (vLLM's ``ModelCard``), else as kvplan launched it
        (--ctx), else as its start-up log printed it (the context of "Maximum concurrency for N tokens")."""
        said = card_context(self.model_cards.get(self.model, {}))
        if said is None and self.launcher is not None:
            said = self.launcher.cfg.args.max_model_len
        return said or self.capacity.max_concurrency_len

    def _check_context(self, what: str, requests: Iterable[tuple[str, int, int]]) -> None:
        """Refuse ``what`` before it sends anything when one of its ``requests`` (name, prompt, output tokens) asks for
        more tokens than the engine's context: vLLM refuses a prompt longer than max_model_len and cuts a request's
        output to what fits (``get_max_tokens``, vllm/entrypoints/serve/utils/api_utils.py@0.32.0), so the point would
        fail, or measure a workload other than the one asked. A point's requests are known before it starts: drawn
        lengths are seeded per request number, a replay's turns are the traffic's. (A point that runs for a duration
        has no count: its requests are not checked.)"""
        if self.max_model_len is None:
            return
        for name, prompt, output in requests:
            if prompt + output > self.max_model_len:
                raise KvplanError(f"{what}: {name} asks for {prompt} prompt + {output} output tokens, more than the "
                                  f"engine's max_model_len {self.max_model_len} (vLLM would refuse it or cut its output)",
                                  "lower --prompt, --output or --spread, replay other traffic, or serve a longer "
                                  "context (--ctx)")

    def _numbered(self, first_index: int, count: int) -> Iterator[tuple[str, int, int]]:
        """The workload's requests ``first_index`` .. ``first_index + count - 1``: (name, prompt, output tokens)."""
        return ((f"request {i}", *self.workload.lengths(i)) for i in range(first_index, first_index + count))

    def _data_parallel(self, snap: Snapshot | None) -> None:
        """The block rule: on the one pool, or on one engine's of a data-parallel server (kvplan.bench.fleet.
        EnginePools), whose first engine to reach its onset is the server's. One line for engine labels that are
        no engines."""
        if snap is not None and snap.engine_error:
            raise KvplanError(f"{self.shown_url}/metrics: {snap.engine_error}",
                              "kvplan bench reads each engine's KV figures by vLLM's engine label")
        if snap is None or not snap.engines:
            self._predict()
            return
        self.engines = EnginePools(snap, self.shown_url, self.base_url)
        self.capacity = self.engines.capacities[0]
        self._predict()
        self.rule = self.engines.predict(self.rule, self.rule_exact, self.prediction_note)
        self.capacity = self.engines.capacity

    def _predict(self) -> None:
        w = self.workload
        if self.capacity.num_blocks is None or self.capacity.block_size is None:
            return
        prompt, output = w.rule_lengths
        try:
            self.rule = block_rule(self.capacity.num_blocks, self.capacity.block_size, prompt, output,
                                   self.cfg.max_num_seqs, self.capacity.vllm_version)
        except KvplanError:
            self.rule = None
        self.rule_exact = w.identical
        # The block rule counts one full-attention group. A model whose KV cache has several (sliding-window or
        # chunked-local layers beside full ones) takes blocks in every group from the one pool, so the rule would
        # promise more requests than fit: the hybrid simulator predicts its onsets (kvplan.plan.hybrid_rule), recurrent
        # state groups included, with its waits for the token budget, which vLLM's waiting gauge counts as it counts
        # waits for KV (kvplan.bench.point.budget_wait tells them apart); a group kvplan does not model gets no onset
        # prediction, and the reason said.
        if self.rule is None:
            return
        config = self._scheduler_config()
        served = self._served_groups(config)
        if served.one_full_attention_group is not False:
            return
        self.rule = None
        what = (f"the model's KV cache is {len(served.kinds)} group(s) ({', '.join(served.kinds)}) taking blocks "
                "from one pool")
        if served.groups is None:  # a group kvplan does not model, or an engine it cannot read
            unmodelled = sorted({k for k in served.kinds if k not in MANAGER_OF_KIND})
            why = (f"kvplan's simulator does not model the onsets of {', '.join(unmodelled)} groups" if unmodelled
                   else served.refused or served.unknown)
            self.prediction_note = f"onsets not predicted: {what}, and {why}"
        elif self.traffic is not None or self.profile.load_mode != "concurrency":
            self.prediction_note = (f"onsets not predicted: {what}; the hybrid simulator predicts the onsets of "
                                    "closed-loop sweeps (--traffic replays: each point's own prediction)")
        else:
            self.view.message(f"{what}: predicting the onsets with the hybrid simulator ({served.groups.describe()})")
            try:
                self.rule = HybridRule(config, served.groups, w.lengths, prompt, output, self._stream_requests,
                                       w.shared_prefix)
            except KvplanError as exc:
                self.prediction_note = f"onsets not predicted: {what}, and {exc.message}"
        if self.prediction_note:
            self.view.message(self.prediction_note)

    def _fleet_groups(self) -> None:
        """The fleet's rule counts one full-attention group per replica: a model whose KV cache is several groups
        takes blocks in each from one pool, so that rule would promise more requests than fit (the one-URL path
        simulates them, kvplan.plan.hybrid_rule; a fleet of them is not predicted)."""
        block_size = next((c.block_size for c in self.fleet.capacities if c.block_size), None)
        if self.rule is None or block_size is None:
            return
        served = self.served_groups = served_groups(self.model, None, block_size, None)
        if served.one_full_attention_group is False:
            self.rule = None
            self.fleet.not_predicted(f"the model's KV cache is {len(served.kinds)} group(s) ({', '.join(served.kinds)}) "
                                     "taking blocks from one pool, which kvplan predicts for one server, not a fleet")
            self.view.message(self.fleet.basis)

    def _served_groups(self, config: SchedulerConfig) -> ServedGroups:
        """The served model's KV cache groups on the engine's pool (``config``), read once a run."""
        if self.served_groups is None:
            ecfg = self.cfg.engine_config()
            self.served_groups = served_groups(
                ecfg.model if ecfg else self.model, ecfg.args if ecfg else None, config.block_size,
                config.max_num_batched_tokens if config.max_num_batched_tokens < 1 << 30 else None,
                self.capacity.vllm_version, self.cfg.planner_gpu)
        return self.served_groups

    def _stream_requests(self, concurrency: int) -> int:
        """Requests each of ``concurrency`` streams sends (the streams share a point's budget when not set)."""
        return self.cfg.requests_per_stream or cdiv(self.point_requests(concurrency) or DEFAULT_REQUESTS, concurrency)

    def _scheduler_config(self) -> SchedulerConfig:
        """The simulator's view of the engine: its reported pool, the run's limits, its release's rules."""
        cap = self.capacity
        assert cap.num_blocks is not None and cap.block_size is not None
        rules = rules_for(cap.vllm_version) if cap.vllm_version else rules_for(None)
        ecfg = self.cfg.engine_config()
        budget = ecfg.args.max_num_batched_tokens if ecfg else self.cfg.max_num_batched_tokens  # launched: its flags
        return SchedulerConfig(
            num_blocks=cap.num_blocks, block_size=cap.block_size, max_num_seqs=self.cfg.max_num_seqs or 1 << 30,
            max_num_batched_tokens=budget or 1 << 30,
            admit_full_prompt=rules.admit_full_prompt, uncached_blocks_first=rules.free_uncached_first,
            prefix_stats_at_admission=rules.prefix_stats_at_admission)

    @property
    def prediction(self) -> OnsetPrediction | None:
        """The block rule on the one server's pool (several replicas: each one's, in the summary's ``fleet``)."""
        if self.rule is None or self.fleet is not None or self.engines is not None:
            return None
        return OnsetPrediction.from_rule(self.rule, self.rule_exact)

    def _planner(self) -> None:
        """The planner's own pool for this deployment, next to the engine's (best effort)."""
        ecfg = self.cfg.engine_config()
        if ecfg is None:
            return
        try:
            self.planner = planner_capacity(ecfg, self.cfg.planner_gpu, self.cfg.max_num_seqs)
        except Exception as exc:  # noqa: BLE001 - the comparison must never stop a run
            self.planner = PlannerCapacity(error=f"{type(exc).__name__}: {exc}")

    def _latency_model(self) -> None:
        """The step-time model every point's latency is predicted with (best effort: never stops a run)."""
        if self.fleet is not None or self.engines is not None:
            self.latency = no_prediction(f"several {'replicas' if self.fleet else 'engines'}: latency is predicted "
                                         "for one engine")
            return
        try:
            cap = self.capacity
            served = self._served_groups(self._scheduler_config()) if cap.num_blocks and cap.block_size else None
            self.latency = predictor_for(self.cfg.model_dump(mode="json"), dataclasses.asdict(cap),
                                         self.model or None, Path(self.cfg.steptime) if self.cfg.steptime else None,
                                         served)
        except Exception as exc:  # noqa: BLE001 - a prediction must never stop a run
            self.latency = no_prediction(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    def _predict_latency(self, point: PointResult) -> PointResult:
        if self.latency is None:
            return point
        try:
            predicted = self.latency.predict(point)
        except Exception as exc:  # noqa: BLE001
            predicted = PredictedLatency(error=f"{type(exc).__name__}: {exc}")
        return point if predicted is None else point.model_copy(update={"predicted_latency": predicted})

    # ---------------------------------------------------------------- points

    def point_requests(self, concurrency: int | None) -> int | None:
        """Requests a point sends (None: as many as fit in duration_s)."""
        cfg = self.cfg
        if concurrency is not None and cfg.requests_per_stream:
            return concurrency * cfg.requests_per_stream
        if cfg.requests is None and cfg.duration_s is not None:
            return None
        n = cfg.requests or DEFAULT_REQUESTS
        return max(n, concurrency or 1)  # every stream sends at least once

    def load_description(self) -> str:
        return self.profile.describe(self)

    def progress(self, onsets: dict[OnsetName, Onset | None]) -> None:
        self.onsets = dict(onsets)
        self._write_run()

    def measure(self, load: Load) -> PointResult:
        """One point at ``load`` (ProfileContext.measure): measured, stored, shown."""
        seq = len(self.points)
        first_index = self._next_index  # request numbers (and the run's nonce) make prompts unique
        replayed = None
        match load:
            case ReplayLoad(sessions):
                replayed = first_sessions(self.traffic, sessions)
                self._check_context(f"the point at {load.label()}",
                                    ((t.label, t.prompt_tokens, t.output_tokens) for t in replayed.turns))
                total = replayed.num_requests
                self.view.point_started(load.label(), total)
            case OpenLoad():
                total = self.point_requests(None)
                self._check_context(f"the point at {load.label()}", self._numbered(first_index, total or 0))
                self.view.point_started(load.label(), total or 0)
            case ClosedLoad(concurrency):
                total = self.point_requests(concurrency)
                self._check_context(f"the point at concurrency {concurrency}", self._numbered(first_index, total or 0))
                self.view.point_started(concurrency, total or 0)
        started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        result = run_stoppable(self._point_async(load, seq, first_index, started_at, replayed))
        result = self._predict_latency(result) if replayed is None else result
        total = total or 0
        self._next_index += max(total, result.requests)
        self.points.append(result)
        self.store.append_requests(self._request_rows)
        self.store.append_point(result.model_dump(mode="json"))
        self.view.point_finished(result)
        return result

    async def _point_async(self, load: Load, seq: int, first_index: int, started_at: str,
                           replayed=None) -> PointResult:
        rate = load.rate if isinstance(load, OpenLoad) else None
        stop = StopSignal()
        before = None
        fleet_before = None  # several replicas: each one's scrapes (kvplan.bench.fleet), instead of the one server's
        if self.fleet is not None:
            fleet_before, why = await self.fleet.before_point(self.client)
            if why:
                stop.stop(why)
        elif self.metrics_error is None:
            try:
                before = await scrape_once(self.base_url, client=self.client)
            except Exception as exc:  # noqa: BLE001 - it answered at the start: the server is gone or broken
                stop.stop(self._dead_reason() or f"cannot read {self.shown_url}/metrics ({type(exc).__name__}: {exc})")
        prom_start = None
        if self.prometheus is not None and not stop.is_set():
            try:  # the window's start: the previous point's end mark, else a scrape taken from now on
                prom_start = await self.prometheus.mark(reuse=True)
            except KvplanError as exc:
                stop.stop(self._prometheus_said(exc))
        t0 = time.perf_counter()
        during: list[Snapshot] = []
        scraping = asyncio.Event()
        tasks = []
        if before is not None:
            tasks.append(asyncio.create_task(scrape_during(
                self.base_url, self.cfg.scrape_interval_s, scraping, t0, during,
                on_scrape=lambda s: self.view.scrape(s.values, s.waiting_by_reason.get("capacity")),
                client=self.client)))
        gpu_samples: list = []
        if self.cfg.gpu_metrics:  # stopped with the scrapes (a task after the first is cancelled at the end)
            tasks.insert(0, asyncio.create_task(sample_during(self.cfg.gpu_metrics, telemetry_client(self.client),
                                                              self.cfg.scrape_interval_s, scraping, gpu_samples)))
        fleet_during: list = []
        if fleet_before is not None:
            fleet_tasks, fleet_during = self.fleet.scrapes_during(self.client, self.cfg.scrape_interval_s, scraping, t0)
            tasks[:0] = fleet_tasks
        if self.launcher is not None:
            tasks.append(asyncio.create_task(self._watch_engine(stop)))
        if stop.is_set():
            records, wall, aborted = [], 0.0, stop.reason
        else:
            records, wall, aborted = await self._send(load, seq, first_index, stop, replayed)
        scraping.set()
        # the samplers (first in `tasks`) end themselves at `scraping`; the engine watch after them is cancelled
        keep = bool(self.cfg.gpu_metrics) + (before is not None) + (len(self.fleet.replicas) if fleet_before else 0)
        for task in tasks[keep:]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        dead = self._dead_reason()
        if aborted and not dead and self.launcher is not None:
            # The client can see the connections drop before the killed engine is reaped:
            # give the process a moment, so the point names the real cause.
            dead = await self._wait_dead(2.0)
        if dead:
            aborted = dead
        after = None
        if before is not None and not dead:
            try:
                after = await scrape_once(self.base_url, client=self.client)
            except Exception:  # noqa: BLE001
                after = None
        prom = None if self.prometheus is None else ServerFigures()  # with --prometheus, no figure unless from it
        if prom_start is not None:
            prom, why = await self._prometheus_figures(prom_start, dead)
            aborted = aborted or why
        match load:
            case OpenLoad():
                concurrency = peak_in_flight(records)  # what the open loop reached
            case ClosedLoad(concurrency) | ReplayLoad(sessions=concurrency):
                pass
        point = self._point_result(concurrency, seq, first_index, started_at, records, wall, aborted, before, during,
                                   after, rate, prom)
        if fleet_before is not None:
            point = self.fleet.judge(point, records, fleet_before, fleet_during,
                                     await self.fleet.after_point(self.client), self.cfg)
        if self.cfg.gpu_metrics:
            point = point.model_copy(update={"gpu": summarize_gpu(gpu_samples, self.cfg.gpu_metrics)})
        if replayed is not None:
            point = self._replay_figures(point, replayed, records)
        return point

    async def _prometheus_figures(self, start: float, dead: str | None) -> tuple[ServerFigures, str | None]:
        """The point's figures from Prometheus (kvplan.bench.prometheus), once it has scraped every engine after
        the point's end; or none, and why the point failed."""
        assert self.prometheus is not None
        if dead:
            self.prometheus.last_mark = None
            return ServerFigures(), None
        try:
            end = await self.prometheus.mark()
            return await asyncio.to_thread(self.prometheus.figures, start, end), None
        except KvplanError as exc:  # never a figure Prometheus did not give: the point fails, saying why
            self.prometheus.last_mark = None
            return ServerFigures(), self._prometheus_said(exc)

    def _prometheus_said(self, exc: KvplanError) -> str:
        """Why Prometheus gave no figure, for the point's error: neither origin's secrets in it."""
        assert self.prometheus is not None
        return self.client.scrub(self.prometheus.client.scrub(f"Prometheus: {exc}"))

    async def _send(self, load: Load, seq: int, first_index: int, stop: StopSignal,
                    replayed) -> tuple[list[RequestRecord], float, str | None]:
        """The point's requests, by the load's kind (kvplan.bench.loadgen): records, wall time, why it stopped."""
        done = lambda r: self.view.request_done(r.ok)  # noqa: E731
        cfg, w = self.cfg, self.workload
        match load:
            case ReplayLoad():
                assert cfg.traffic is not None
                sent = await run_sessions(
                    self.base_url, self.model, "completions", session_sends(replayed, cfg.traffic.time_scale),
                    request_specs(replayed, f"{self.nonce}:{seq}"), cfg.request_timeout_s, stop,
                    on_request_done=done, keep_alive=cfg.keep_alive, client=self.client)
            case OpenLoad(rate):
                sent = await run_open_loop(
                    self.base_url, self.model, w.api, rate, w.request, first_index,
                    total_requests=self.point_requests(None), duration_s=cfg.duration_s,
                    burstiness=cfg.burstiness, max_concurrency=cfg.rate_max_concurrency,
                    seed=w.seed + seq, request_timeout_s=cfg.request_timeout_s, stop=stop,
                    on_request_done=done, client=self.client, keep_alive=cfg.keep_alive, router=self._router())
            case ClosedLoad(concurrency):
                sent = await run_closed_loop(
                    self.base_url, self.model, w.api, concurrency, cfg.requests_per_stream,
                    w.request, first_index, cfg.request_timeout_s, stop,
                    on_request_done=done, client=self.client,
                    total_requests=None if cfg.requests_per_stream else self.point_requests(concurrency),
                    duration_s=None if cfg.requests_per_stream else cfg.duration_s,
                    keep_alive=cfg.keep_alive, router=self._router())
        return sent.records, sent.wall_s, sent.aborted

    def _router(self):
        """Which replica each request goes to (kvplan.bench.route): a new router for every point; None for one server."""
        return None if self.fleet is None else self.fleet.router()

    def _replay_figures(self, point: PointResult, replayed, records: list[RequestRecord]) -> PointResult:
        """The replay's prefix-cache figures against the simulator's (kvplan.bench.replay)."""

        cap = self.capacity
        config = self._scheduler_config() if cap.num_blocks and cap.block_size else None
        model = self.latency.model if self.latency is not None else None
        figures = replay_figures(replayed, records, point.server, config, self.cfg.traffic.time_scale, model,
                                 self._served_groups(config) if config is not None else None)
        notes = list(point.notes)
        notes = [n for n in notes if "may not have reached this concurrency" not in n]  # concurrency = sessions here
        return point.model_copy(update={"replay": figures, "notes": notes})

    async def _watch_engine(self, stop: StopSignal) -> None:
        while not stop.is_set():
            reason = self._dead_reason()
            if reason:
                stop.stop(reason)
                return
            await asyncio.sleep(0.2)

    async def _wait_dead(self, seconds: float) -> str | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            reason = self._dead_reason()
            if reason:
                return reason
            await asyncio.sleep(0.05)
        return None

    def _dead_reason(self) -> str | None:
        if self.launcher is None or self.launcher.alive():
            return None
        code = self.launcher.proc.returncode if self.launcher.proc else None
        return f"the engine exited (code {code})"

    def _point_result(self, concurrency: int, seq: int, first_index: int, started_at: str,
                      records: list[RequestRecord], wall: float, aborted: str | None,
                      before: Snapshot | None, during: list[Snapshot], after: Snapshot | None,
                      rate: float | None = None, prometheus: ServerFigures | None = None) -> PointResult:
        for r in records:  # a server may echo a key or header value back in an error body
            r.error = self.client.scrub(r.error)
        engines = [] if self.engines is None else self.engines.indexes  # a data-parallel server's, as at the start
        if before is not None and not before.engine_error and sorted(before.engines) != engines:
            aborted = aborted or (f"{self.shown_url}/metrics named engines {engine_list(sorted(before.engines))} at "
                                  f"this point's start, {engine_list(engines)} when the run began: the server "
                                  "restarted or rescaled, and the run's prediction was for the engines it began with")
        result, self._request_rows = point_result(self.cfg, self.rule, concurrency, seq, first_index, started_at,
                                                  records, wall, self.client.scrub(aborted), before, during, after,
                                                  rate, prometheus)
        return result

    # ---------------------------------------------------------------- the sweep

    def _sweep(self) -> None:
        if self.cfg.warmup:
            self._warm_up()
        if self.cfg.prompt_sweep and not (self.run_dir / PROMPT_SWEEP_FILE).exists():  # --resume: measured once
            self._prompt_sweep()
        result = self.profile.run(self)
        self.onsets = dict(result.onsets)
        self.rate_search = result.rate_search

    def _warm_up(self) -> None:
        """One unrecorded round below the predicted KV-wait onset: the engine's first batches of a
        new size are slow on some builds (CPU), and a stalled engine also stalls /metrics."""
        if self.rule is not None and self.rule.first_kv_wait:
            level = max(1, min(self.rule.first_kv_wait - 1, 32))
        else:
            level = 4
        self._check_context("the warm-up", self._numbered(self._next_index, level))
        self.view.message(f"warm-up: {level} stream{'s' if level != 1 else ''}, not recorded")
        load = run_stoppable(run_closed_loop(
            self.base_url, self.model, self.workload.api, level, 1, self.workload.request, self._next_index,
            self.cfg.request_timeout_s, client=self.client, keep_alive=self.cfg.keep_alive, router=self._router()))
        self._next_index += level
        if load.aborted:
            raise BenchFailed(f"the warm-up failed: {load.aborted}")
        bad = [r for r in load.records if not r.ok]
        if bad:
            raise BenchFailed(f"the warm-up failed: {bad[0].error}")

    def _prompt_sweep(self) -> None:
        """--prompt-sweep: one stream, prompts of the sweep's lengths (kvplan.bench.prompt_sweep), each TTFT recorded
        in RUN/prompt_sweep.json; its request numbers come before the points', so no prompt repeats."""
        engine = self.cfg.engine or {}
        count, longest = parse_prompt_sweep(self.cfg.prompt_sweep, engine.get("max_model_len"))
        lengths = sweep_lengths(count, longest)
        specs = sweep_specs(lengths, self.nonce, self.workload.token_id_range, self._next_index)
        by_index = {s.index: s for s in specs}
        self.view.message(f"prompt sweep: {len(lengths)} lengths of {lengths[0]}-{lengths[-1]} tokens, one stream")
        load = run_stoppable(run_closed_loop(
            self.base_url, self.model, "completions", 1, len(specs), by_index.__getitem__, self._next_index,
            self.cfg.request_timeout_s, client=self.client, keep_alive=self.cfg.keep_alive))
        self._next_index += len(specs)
        if load.aborted:
            raise BenchFailed(f"the prompt sweep failed: {load.aborted}")
        bad = [r for r in load.records if not r.ok]
        if bad:
            raise BenchFailed(f"the prompt sweep failed: {bad[0].error}")
        write_prompt_sweep(self.store, sweep_from_records(lengths, specs, load.records))

    # ---------------------------------------------------------------- results

    def _write_run(self) -> None:
        data = {
            "kvplan_version": __version__,
            "created": self.run_info.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": self.cfg.model_dump(mode="json"),
            **{k: v for k, v in self.run_info.items() if k != "created"},
            "base_url": self.base_url,
            "model": self.model,
            "capacity": dataclasses.asdict(self.capacity),
            "planner": None if self.planner is None else self.planner.model_dump(mode="json"),
            "prediction": None if self.prediction is None else self.prediction.model_dump(mode="json"),
            "latency_model": None if self.latency is None else self.latency.info_for(self.points).model_dump(mode="json"),
        }
        self.run_info.setdefault("created", data["created"])
        self.store.write_run(data)

    def summary(self, status: str, error: str | None) -> BenchSummary:
        ordered = sorted(self.points, key=lambda p: (p.mode, p.load, p.seq))
        rule = self.prediction
        agree = OnsetAgreement()
        if rule is not None:
            agree = OnsetAgreement(**{key: None if onset is None else onset.first == rule.onset(key)
                                      for key, onset in self.onsets.items()})
        fleet = None if self.fleet is None else self.fleet.summary(ordered, self.onsets)
        engines = None if self.engines is None else self.engines.summary(ordered, self.onsets)
        pools = fleet or engines  # several pools: the first to reach its onset
        if pools is not None and (self.fleet or self.engines).rule is not None:  # the same load (and replica first)
            agree = OnsetAgreement(**{key: pools.onset(key).agrees for key, onset in self.onsets.items()})
        measured = MeasuredOnsets(**self.onsets, agrees_with_prediction=agree)
        cmd = None
        if self.launcher is not None and self.launcher.command:
            import shlex

            cmd = shlex.join(self.launcher.command)
        return BenchSummary(
            status=status,  # type: ignore[arg-type]
            error=error,
            run_dir=str(self.store.path),
            mode="attach" if self.cfg.url else "launch",
            base_url=redact(self.base_url),
            model=self.model,
            deployment=self.cfg.deployment,
            measured_first_kv_wait=_first(self.onsets["first_kv_wait"]),
            measured_first_preemption=_first(self.onsets["first_preemption"]),
            predicted_first_kv_wait=rule.first_kv_wait if rule else pools.first_kv_wait.predicted if pools else None,
            predicted_first_preemption=rule.first_preemption if rule else pools.first_preemption.predicted if pools
            else None,
            engine_command=cmd,
            metrics_error=self.metrics_error,
            workload=self.traffic.describe() if self.traffic is not None else self.workload.describe(),
            capacity=self.capacity,
            planner=self.planner,
            prediction=rule,
            measured=measured,
            points=ordered,
            load_mode=self.profile.load_mode,
            rate_search=self._rate_search_result(),
            load_description=self.load_description(),
            slo=dict(self.cfg.slo),
            highest_load_meeting_slo=highest_load_meeting(ordered) if self.cfg.slo else None,
            headers=masked_headers(self.client.headers),
            proxy=shown_proxy(self.client.proxy(self.base_url)) if self.base_url else None,
            tls=self._tls_said(),
            latency_model=None if self.latency is None else self.latency.info_for(self.points),
            prometheus=self._prometheus_info(),
            fleet=fleet,
            prediction_note=self.prediction_note,
            engines=engines,
        )

    def _prometheus_info(self) -> PrometheusInfo | None:
        prom = self.prometheus
        if prom is None:
            return None
        return PrometheusInfo(url=prom.shown, selector=None if prom.selector is None else prom.shown_selector,
                              headers=masked_headers(prom.client.headers), engine_metrics=self.metrics_error is None)

    def _tls_said(self) -> str | None:
        """How the run's https requests were verified (null for http)."""
        if not self.base_url.startswith("https://"):
            return None
        if self.cfg.insecure:
            return "NOT verified (--insecure)"
        return f"verified with --ca-bundle {self.cfg.ca_bundle}" if self.cfg.ca_bundle else "verified"

    def _rate_search_result(self) -> RateSearchResult | None:
        rs, found = self.cfg.rate_search, self.rate_search
        if rs is None or found is None:
            return None
        return RateSearchResult(highest_meeting_slo=found.highest_met, first_missing_slo=found.first_missed,
                                resolved=found.resolved, stopped=found.stopped, points=len(found.measured),
                                start=rs.start, resolution=rs.resolution, max_points=rs.max_points)

    def finish(self, status: str, error: str | None) -> BenchSummary:
        summary = self.summary(status, error)
        write_reports(self.store, summary)
        return summary

    def execute(self) -> BenchSummary:
        """Run everything; always stop the engine and write the results of finished points."""
        status, error = "failed", None
        try:
            self._write_run()
            if self.cfg.url:
                for url in [self.base_url, *(self.cfg.fleet.urls[1:] if self.cfg.fleet else [])]:
                    self._attach(url.rstrip("/"))
            else:
                self._start_engine()
            self._discover_model()
            if self.fleet is not None:  # each replica's model, /metrics and pool; the fleet's onsets
                self.rule = self.fleet.attach(self.client, self.model, self.cfg, self.workload)
                self.capacity = self.fleet.capacity
                self._fleet_groups()
            else:
                if self.prometheus is not None:
                    self.prometheus.discover(self.model)  # a selector matching no engine: one line, before any point
                try:
                    snap = run_stoppable(scrape_once(self.base_url, client=self.client))
                except Exception as exc:  # noqa: BLE001 - a server without /metrics can still be benched
                    snap = None
                    self.metrics_error = f"{type(exc).__name__}: {exc}"
                    if self.prometheus is None:
                        self.view.message(f"no server metrics ({esc(self.metrics_error)}): onsets cannot be measured")
                    else:
                        self.view.message(f"the engine's /metrics is not read ({esc(self.metrics_error)}): server "
                                          f"figures from Prometheus alone")
                        snap = Snapshot(0.0, cache_info=self.prometheus.cache_config())
                self._read_capacity(snap)
                self._data_parallel(snap)
                self.max_model_len = self._served_context()
            self._planner()
            self._latency_model()
            self._write_run()
            try:
                self._sweep()
            except SweepStopped as exc:
                bad = next(p for p in reversed(self.points) if p.concurrency == exc.concurrency)
                done = sum(1 for p in self.points if p.status == "ok")
                error = (f"the point at concurrency {exc.concurrency} failed: {bad.error} "
                         f"({done} finished point{'s' if done != 1 else ''} kept in {self.store.path})")
                raise BenchFailed(error) from None
            status = "complete"
        except KeyboardInterrupt:
            status, error = "interrupted", "interrupted"
            raise
        except KvplanError as exc:
            error = str(exc).splitlines()[0]
            raise
        finally:
            with no_interrupts():
                if self.launcher is not None:
                    self.launcher.stop()
                if self.points or status != "failed":
                    self.summary_obj = self.finish(status, error)
        assert self.summary_obj is not None
        return self.summary_obj


def planner_capacity(ecfg: EngineConfig, gpu: str | None, max_num_seqs: int | None) -> PlannerCapacity:
    """What `kvplan size` plans for the same flags: blocks and KV tokens (for the report)."""

    if gpu is None and ecfg.args.num_gpu_blocks_override is None and ecfg.args.kv_cache_memory_bytes is None:
        return PlannerCapacity(error="pass --gpu to compare with the planner (the pool is not pinned)")
    selection = select_gpus(gpu, None, None if gpu else "1TiB")
    settings = settings_from_engine_args(ecfg.args, max_num_seqs=max_num_seqs)
    plan = plan_deployment(load_model(ecfg.model, offline=True), selection, settings)
    return PlannerCapacity(num_blocks=plan.num_blocks, kv_cache_tokens=plan.kv_cache_tokens,
                           block_size=plan.block_size, vllm_version=plan.vllm_version)


def _resumed_point(row: dict[str, Any], number: int, store: st.RunStore) -> PointResult:
    """A point of points.jsonl read back on --resume: a line that is JSON but no point kvplan writes (a field
    of another type, a missing one) is refused naming it, not an internal error."""
    from pydantic import ValidationError

    try:
        return PointResult.model_validate(row)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "the line"
        raise KvplanError(f"cannot resume {store.path}: point {number} of {st.POINTS_FILE} is not one kvplan wrote "
                          f"({where}: {first.get('msg', 'invalid')})",
                          "remove that line to measure the point again") from None


def resume_state(path: Path) -> tuple[st.RunStore, BenchConfig, list[dict[str, Any]]]:
    store = st.RunStore.open_existing(path)
    run = store.read_run()
    try:
        cfg = BenchConfig.model_validate(run["config"])
    except Exception as exc:  # noqa: BLE001
        raise KvplanError(f"cannot resume {path}: run.json has no usable config ({exc})") from None
    return store, cfg, store.read_points()


def resumed_model(path: Path) -> str | None:
    """The model name a run's requests used (run.json ``model``), which a resumed run must find served."""
    try:
        model = st.RunStore(path).read_run().get("model")
    except KvplanError:
        return None
    return model if isinstance(model, str) and model else None
