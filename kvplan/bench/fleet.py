"""Several replicas in one bench run: ``kvplan bench --url A --url B ...`` (kvplan spreads the requests, ``--route``,
kvplan.bench.route) or ``--url GATEWAY --metrics-url A --metrics-url B`` (the gateway spreads them). kvplan attaches
to a fleet; it never launches one.

**Figures.** Each replica's /metrics is scraped on its own by the one-server code (kvplan.bench.metrics: a full
scrape before and after a point, fast ones in between) and summarized on its own (kvplan.bench.point.server_figures),
so its preemptions, waiting queue, KV usage and prefix hits are its own; a data-parallel replica's engines (vLLM's
``engine`` label) add up inside its figures, as for one URL. A point then says:

- per replica (``PointResult.replicas``): its figures, the requests the client sent it, the most it held at once,
  and whether *it* waited for KV or preempted, judged as one server is (kvplan.bench.point.wait_evidence) at the
  load the client had at it (behind a gateway: the most its own gauges showed);
- for the fleet (``PointResult.server``): counters summed over the replicas, KV usage the fullest replica's,
  running and waiting the sum of each replica's own peak (their peaks need not coincide: an upper bound), the
  server's TTFT from the replicas' histograms added bucket by bucket;
- the fleet waited for KV / preempted when some replica did. So an onset is the load at which the FIRST replica
  reaches its own, never a sum of queues over replicas, and the summary names that replica: of those showing the
  event at the onset point, the one a scrape saw first.

**Prediction** (``FleetRule``). Each replica's pool is read back from its own /metrics (vllm:cache_config_info) and
the block rule (kvplan.plan.blocks) on it gives that replica's onsets ``o_i`` in its own concurrency. A point of
``c`` streams sends its first ``c`` requests one to each replica in turn: ``ceil((c - i) / N)`` to replica ``i``
(kvplan.bench.route.share). Least outstanding keeps that split for the whole point. Round robin gives each replica
every N-th request, but not every N-th *held* request: in a closed loop the requests a replica holds drift from the
split as requests end out of turn, so the prediction (the even split) is where its onset is at the latest, and the
measured one can come at fewer streams (the summary says which route a prediction was made for). Replica ``i`` reaches ``o_i`` at
``c_i = N (o_i - 1) + i + 1`` streams; the fleet's onset is the smallest ``c_i`` (never a tie: the ``c_i`` differ
modulo ``N``), and its replica is the one predicted first. By hand, two equal pools whose own onset is 5:
``c_0 = 2 x 4 + 1 = 9`` (5 requests on the first, 4 on the second) and ``c_1 = 10``: the first ``--url`` preempts
first, at 9 streams. Behind a gateway the split is the gateway's, which kvplan does not see: it predicts the even
split and says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvplan.bench.client import Client, credential_secrets, split_credentials
from kvplan.bench.config import MAX_REPLICAS, BenchConfig, FleetConfig
from kvplan.bench.loadgen import RequestRecord, run_stoppable
from kvplan.bench.metrics import Histogram, Snapshot, scrape_during, scrape_once
from kvplan.bench.point import engine_points, failed_point, pool_point, pools_label, server_figures
from kvplan.bench.results import (
    ONSETS,
    FleetOnset,
    FleetReplica,
    FleetSummary,
    OnsetName,
    OnsetPrediction,
    PointResult,
    PredictedPoint,
    ReplicaPoint,
    ServerFigures,
)
from kvplan.bench.route import ROUTES, Router, share
from kvplan.bench.sweep import Onset, block_rule
from kvplan.bench.workload import Workload
from kvplan.engines import EngineCapacity, engine_named
from kvplan.errors import KvplanError
from kvplan.paths import parse_json_text
from kvplan.plan.blocks import BlockRule
from kvplan.plan.hybrid_rule import HybridRule
from kvplan.term import printable
from kvplan.vllm.startup_log import redact

#: Full scrapes (before and after a point) in flight at once: a fleet of lying servers cannot make kvplan hold
#: every replica's /metrics at its size limit together.
FULL_SCRAPES_AT_ONCE = 8
#: ServerFigures that add up over replicas (deltas of counters over the point).
SUMMED = ("preemptions", "prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "external_queries",
          "external_hits", "offload_load_bytes", "offload_load_s", "offload_store_bytes", "offload_store_s")
#: Gauges whose fleet figure is the sum of each replica's own peak.
PEAKS_SUMMED = ("peak_running", "peak_waiting", "peak_waiting_capacity", "peak_in_engine")


# ---------------------------------------------------------------- the command line


def _identity(url: str) -> tuple[str, str, int | None, str]:
    """What makes two URLs the same server: scheme, host, port (the scheme's default filled in) and path, without
    credentials, case or trailing slashes."""
    bare = split_credentials(url)[0]
    try:
        parts = urlsplit(bare)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        raise KvplanError(f"invalid URL {redact(url)[:200]!r}", "use http://host:port") from None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def _checked(urls: list[str], flag: str) -> list[str]:
    """Each URL http(s) with a host, none given twice (two --url of one server would load it twice as hard)."""
    seen: dict[tuple, str] = {}
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url) > 2048 or not _identity(url)[1]:
            raise KvplanError(f"invalid {flag} {redact(url)[:200]!r}", "use http://host:port")
        key = _identity(url)
        if key in seen:
            raise KvplanError(f"invalid {flag} {redact(url)[:200]!r}: the same server as {redact(seen[key])[:200]!r}",
                              "name each replica once")
        seen[key] = url
    return urls


def metrics_base(url: str) -> str:
    """A --metrics-url as the server to scrape: ``http://pod:8000/metrics`` and ``http://pod:8000`` alike."""
    url = url.rstrip("/")
    return url[: -len("/metrics")] if url.endswith("/metrics") else url


def fleet_config(urls: list[str], metrics_urls: list[str], route: str | None) -> FleetConfig | None:
    """--url (repeatable), --metrics-url (repeatable) and --route as a FleetConfig; None for one server."""
    if len(urls) > MAX_REPLICAS or len(metrics_urls) > MAX_REPLICAS:
        raise KvplanError(f"at most {MAX_REPLICAS} replicas a run")
    if route is not None and route not in ROUTES:
        raise KvplanError(f"invalid --route {printable(route, 40)!r}", f"use one of {', '.join(ROUTES)}")
    if len(urls) <= 1 and not metrics_urls:
        if route is not None:
            raise KvplanError("--route spreads requests over several --url", "give each replica's --url")
        return None
    if not urls:
        raise KvplanError("--metrics-url names the replicas behind a gateway", "give the gateway's --url too")
    _checked(urls, "--url")
    _checked([metrics_base(u) for u in metrics_urls], "--metrics-url")
    if len(urls) == 1:
        if route is not None:
            raise KvplanError("--route is kvplan's choice of replica; behind a gateway, the gateway chooses",
                              "leave --route out, or give each replica's --url instead of the gateway's")
        return FleetConfig(urls=urls, metrics_urls=[metrics_base(u) for u in metrics_urls], route="gateway")
    if metrics_urls and len(metrics_urls) != len(urls):
        raise KvplanError(f"{len(urls)} --url and {len(metrics_urls)} --metrics-url",
                          "give one --metrics-url per --url, in the same order (or none: each --url's /metrics)")
    return FleetConfig(urls=urls, metrics_urls=[metrics_base(u) for u in metrics_urls],
                       route=route or "round-robin")  # type: ignore[arg-type]


def resumed_fleet(cfg: BenchConfig, urls: list[str], metrics_urls: list[str], route: str | None,
                  run_dir) -> BenchConfig:
    """--resume of a fleet run: the replicas of run.json, or the same number restated (same route); URLs whose
    credentials run.json masked must be restated. A run of one server does not become a fleet's."""
    old = cfg.fleet
    if old is None:
        raise KvplanError(f"cannot resume {run_dir} with several replicas: it measured one server",
                          "resume it with one --url, or start a new run")
    if route is not None and route != old.route:
        raise KvplanError(f"cannot resume {run_dir} with --route {printable(route, 40)}: it routed by {old.route}")
    if not urls and not metrics_urls:
        if any("***" in u for u in old.urls + old.metrics_urls):
            raise KvplanError(f"cannot resume {run_dir}: its URLs held credentials, which kvplan never stores",
                              "restate every replica with --url (and --metrics-url)")
        return cfg
    new = fleet_config(urls, metrics_urls, None if old.route == "gateway" else old.route)
    if new is None or new.route != old.route or len(new.replicas) != len(old.replicas):
        raise KvplanError(f"cannot resume {run_dir}: it measured {len(old.replicas)} replicas ({old.route})",
                          "restate the same replicas, in the same order")
    return cfg.model_copy(update={"url": new.urls[0], "engine": None, "fleet": new})


def fleet_secrets(fleet: FleetConfig | None) -> tuple[str, ...]:
    """The credentials of every URL of the fleet: masked wherever a server echoes one back."""
    return tuple(s for u in (fleet.urls + fleet.metrics_urls if fleet else []) for s in credential_secrets(u))


# ---------------------------------------------------------------- the prediction


class FleetRule:
    """The block rule of a fleet, in streams over the whole fleet: the questions a BlockRule answers for one server
    (the load profiles, the warm-up and each point ask them), answered from each replica's own rule at the share
    of the load the route gives it (module docstring)."""

    def __init__(self, rules: list[BlockRule], names: list[str]):
        self.rules, self.names = rules, names

    def share(self, concurrency: int, replica: int) -> int:
        return share(concurrency, replica, len(self.rules))

    def own_onsets(self, name: OnsetName) -> list[int]:
        """Each replica's onset in its own concurrency (those that reach it)."""
        return [onset for r in self.rules
                if (onset := r.first_kv_wait if name == "first_kv_wait" else r.first_preemption) is not None]

    def first(self, name: OnsetName) -> tuple[int, int] | None:
        """(streams over the fleet, replica index) of the first replica to reach the onset; None: none does."""
        n = len(self.rules)
        at = [(n * (onset - 1) + i + 1, i) for i, r in enumerate(self.rules)
              if (onset := r.first_kv_wait if name == "first_kv_wait" else r.first_preemption) is not None]
        return min(at) if at else None

    @property
    def first_kv_wait(self) -> int | None:
        found = self.first("first_kv_wait")
        return None if found is None else found[0]

    @property
    def first_preemption(self) -> int | None:
        found = self.first("first_preemption")
        return None if found is None else found[0]

    @property
    def usable_blocks(self) -> int:  # kvplan.bench.sweep.default_max_concurrency, when no replica waits
        return sum(r.usable_blocks for r in self.rules)

    @property
    def admit_blocks(self) -> int:
        return max(r.admit_blocks for r in self.rules)

    def waits_for_kv(self, concurrency: int) -> bool:
        return any(r.waits_for_kv(self.share(concurrency, i)) for i, r in enumerate(self.rules))

    def preempts(self, concurrency: int) -> bool:
        return any(r.preempts(self.share(concurrency, i)) for i, r in enumerate(self.rules))

    def kv_fill(self, concurrency: int) -> float:
        """The fullest replica's predicted peak share of its pool."""
        return max(r.kv_fill(self.share(concurrency, i)) for i, r in enumerate(self.rules))

    def label(self, concurrency: int) -> str:
        labels = {r.label(self.share(concurrency, i)) for i, r in enumerate(self.rules)}
        return next((x for x in ("KV-limited", "admission-limited") if x in labels), "neither")


# ---------------------------------------------------------------- the replicas


@dataclass(frozen=True)
class Replica:
    index: int
    url: str | None  # where its requests go (None behind a gateway)
    metrics_url: str  # the server whose /metrics is read

    @property
    def name(self) -> str:
        """How it is shown everywhere (credentials masked)."""
        return redact((self.url or self.metrics_url).rstrip("/"))


def model_cards(client: Client, base_url: str) -> tuple[int, dict[str, dict]]:
    """(HTTP status, each served model's card by its id, in the list's order) of ``base_url``/v1/models; none when the
    answer is not a model list (a lying server: read by the bounded JSON reader, entries without an id skipped)."""
    status, body = client.get(base_url.rstrip("/") + "/v1/models", timeout_s=10)
    try:
        data = parse_json_text(body, "/v1/models")["data"] if status == 200 else []
        cards = {c["id"]: c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)}
    except (KvplanError, KeyError, TypeError):
        cards = {}
    return status, cards


def served_models(client: Client, base_url: str) -> tuple[int, list[str]]:
    """(HTTP status, the model ids) of ``base_url``/v1/models (`model_cards`)."""
    status, cards = model_cards(client, base_url)
    return status, list(cards)


def card_context(card: dict) -> int | None:
    """The context a model card gives (vLLM's ``ModelCard.max_model_len``); None when it gives none."""
    value = card.get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class Fleet:
    """The replicas of one run: routing, scraping each one, judging each point, the fleet's summary."""

    def __init__(self, cfg: FleetConfig):
        self.cfg = cfg
        gateway = cfg.route == "gateway"
        request_urls = [None] * len(cfg.replicas) if gateway else cfg.urls
        self.replicas = [Replica(i, url, metrics_base(m)) for i, (url, m) in enumerate(zip(request_urls, cfg.replicas))]
        self.gateway = redact(cfg.urls[0].rstrip("/")) if gateway else None
        self.capacities: list[EngineCapacity] = [EngineCapacity() for _ in self.replicas]
        self.rules: list[BlockRule | None] = [None] * len(self.replicas)
        self.rule: FleetRule | None = None
        self.rule_exact = False
        self.basis = "not predicted: the replicas' pools were not read"
        self.engine_counts = [0] * len(self.replicas)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.replicas]

    def router(self) -> Router | None:
        """A point's router (None behind a gateway: every request goes to it)."""
        if self.gateway is not None:
            return None
        return Router([r.url or "" for r in self.replicas], self.names, self.cfg.route)

    # -------------------------------------------------------- before the first point

    def attach(self, client: Client, model: str, cfg: BenchConfig, workload: Workload) -> FleetRule | None:
        """Each replica serves ``model`` (its /v1/models, and the model_name its /metrics carry) and its /metrics can
        be read; its pool from them; the fleet's rule. One line (exit 2) for a replica that fails a check."""
        for r in self.replicas[1:] if self.gateway is None else []:  # the first: the run's own discovery
            _, ids = served_models(client, r.url or "")
            if ids and model not in ids:
                raise KvplanError(f"replica {r.name} serves {printable(', '.join(ids), 200)}, not {printable(model, 200)!r}",
                                  "every --url must be a replica of the same model")
        snaps = run_stoppable(self.scrape_all(client))
        for r, snap in zip(self.replicas, snaps):
            if isinstance(snap, BaseException):
                raise KvplanError(f"cannot read replica {r.name}'s /metrics ({client.scrub(str(snap))[:300]})",
                                  "kvplan bench reads each replica's KV figures from its own /metrics")
            if snap.model_names and model not in snap.model_names:
                raise KvplanError(f"replica {r.name}'s /metrics are for {printable(', '.join(sorted(snap.model_names)), 200)}, "
                                  f"not {printable(model, 200)!r}",
                                  "each --metrics-url must be a replica serving the model the requests ask for")
            if snap.engine_error:
                raise KvplanError(f"replica {r.name}'s /metrics: {snap.engine_error}",
                                  "kvplan bench reads each engine's KV figures by vLLM's engine label")
        vllm = engine_named("vllm")  # an attached server's pool, read as for one URL (kvplan.engines)
        self.capacities = [vllm.capacity_from_metrics(s.cache_info) if s.cache_info else EngineCapacity() for s in snaps]
        self.engine_counts = [len(s.engines) for s in snaps]  # data-parallel replicas' engines (0: one engine)
        self._predict(cfg, workload)
        return self.rule

    def not_predicted(self, why: str) -> None:
        """Withdraw the fleet's prediction (the replicas' pools stay read), saying why."""
        self.rule, self.rules = None, [None] * len(self.replicas)
        self.basis = f"not predicted: {why}"

    def _predict(self, cfg: BenchConfig, workload: Workload) -> None:
        prompt, output = workload.rule_lengths
        data_parallel = next(((r, n) for r, n in zip(self.replicas, self.engine_counts) if n), None)
        if data_parallel is not None:  # its onset is a range, not a load (EnginePools): not composed over replicas
            self.basis = (f"not predicted: replica {data_parallel[0].name} is data-parallel ({data_parallel[1]} "
                          "engines): each engine's figures are read and judged, but a fleet of such replicas is not "
                          "predicted")
            return
        for i, cap in enumerate(self.capacities):
            if cap.num_blocks is None or cap.block_size is None:
                self.basis = f"not predicted: replica {self.replicas[i].name}'s /metrics do not give its pool"
                return
            try:
                self.rules[i] = block_rule(cap.num_blocks, cap.block_size, prompt, output, cfg.max_num_seqs,
                                           cap.vllm_version)
            except KvplanError as exc:
                self.basis = f"not predicted: replica {self.replicas[i].name}: {exc}"
                return
        self.rule = FleetRule([r for r in self.rules if r is not None], self.names)
        self.rule_exact = workload.identical
        n = len(self.replicas)
        split = {
            "least-outstanding": "least outstanding requests keeps that split",
            "round-robin": "round robin sends each replica every N-th request, so its request count is exact, but "
                           "the requests it holds at once drift from that split as requests end out of turn (more on "
                           "a slower replica): a replica can reach its onset at fewer streams than predicted",
            "gateway": "predicted as if the gateway split the load that way (kvplan does not see its split)",
        }[self.cfg.route]
        self.basis = (f"each replica's block rule on the pool its /metrics report; c streams give replica i "
                      f"ceil((c - i) / {n}) (the first c requests one to each replica in turn); {split}")

    @property
    def capacity(self) -> EngineCapacity:
        """The fleet's pool: the replicas' summed, when each reported its own with one block size."""
        return summed_capacity(self.capacities, f"{len(self.capacities)} replicas' metrics, summed")

    # -------------------------------------------------------- one point

    async def scrape_all(self, client: Client) -> list[Snapshot | BaseException]:
        """One full scrape of every replica, FULL_SCRAPES_AT_ONCE at a time (each may read and parse up to
        kvplan.bench.metrics.MAX_METRICS_BYTES); a replica that cannot be read gives its exception."""
        gate = asyncio.Semaphore(FULL_SCRAPES_AT_ONCE)

        async def one(replica: Replica) -> Snapshot:
            async with gate:
                return await scrape_once(replica.metrics_url, client=client)

        return await asyncio.gather(*(one(r) for r in self.replicas), return_exceptions=True)

    async def before_point(self, client: Client) -> tuple[list[Snapshot] | None, str | None]:
        """(each replica's scrape, None), or (None, why the point cannot start: the replica that cannot be read)."""
        snaps = await self.scrape_all(client)
        for r, snap in zip(self.replicas, snaps):
            if isinstance(snap, BaseException):
                return None, f"cannot read replica {r.name}'s /metrics ({type(snap).__name__}: {snap})"
        return snaps, None  # type: ignore[return-value]

    def scrapes_during(self, client: Client, interval_s: float, scraping: asyncio.Event, t0: float
                       ) -> tuple[list[asyncio.Task], list[list[Snapshot]]]:
        """One fast scraper per replica (kvplan.bench.metrics.scrape_during), each into its own list; they end at
        ``scraping``."""
        during: list[list[Snapshot]] = [[] for _ in self.replicas]
        tasks = [asyncio.create_task(scrape_during(r.metrics_url, interval_s, scraping, t0, out, client=client))
                 for r, out in zip(self.replicas, during)]
        return tasks, during

    async def after_point(self, client: Client) -> list[Snapshot | None]:
        """Each replica's full scrape after the point (None for one that did not answer: its figures stop at its
        last fast scrape)."""
        return [None if isinstance(s, BaseException) else s for s in await self.scrape_all(client)]

    def judge(self, point: PointResult, records: list[RequestRecord], before: list[Snapshot],
              during: list[list[Snapshot]], after: list[Snapshot | None], cfg: BenchConfig) -> PointResult:
        """The point with each replica's figures and the fleet's (module docstring)."""
        closed = point.mode == "concurrency"
        replicas = []
        for r in self.replicas:
            srv = server_figures(before[r.index], during[r.index], after[r.index])
            mine = None if self.gateway is not None else [x for x in records if x.replica == r.index]
            failed = point.status != "ok" if mine is None else any(not x.ok for x in mine)
            engines, why = engine_points(before[r.index], during[r.index], after[r.index], cfg, failed)
            if why is not None:
                point = failed_point(point, f"replica {r.name}: {why}")
                failed = True
            rule = self.rules[r.index]
            replicas.append(pool_point(
                r.index, r.name, srv, cfg, failed, mine,
                None if rule is None or not closed or self.rule is None
                else PredictedPoint.from_rule(rule, self.rule.share(point.concurrency, r.index)),
                engines))
        label = pools_label([p.label for p in replicas], point.status != "ok")
        return point.model_copy(update={
            "server": fleet_figures([p.server for p in replicas], before, after),
            "replicas": replicas,
            "waited_for_kv": any(p.waited_for_kv for p in replicas),
            "wait_evidence": [f"{e} ({p.name})" for p in replicas for e in p.wait_evidence],
            "preempted": any(p.preempted for p in replicas),
            "label": label,
        })

    # -------------------------------------------------------- the run

    def summary(self, points: list[PointResult], onsets: dict[OnsetName, Onset | None]) -> FleetSummary:
        replicas = [FleetReplica(index=r.index, name=r.name, metrics_url=redact(r.metrics_url), capacity=cap,
                                 prediction=None if rule is None else OnsetPrediction.from_rule(rule, self.rule_exact))
                    for r, cap, rule in zip(self.replicas, self.capacities, self.rules)]
        found = {key: pools_onset(self.rule, self.names, key, points, onsets.get(key), lambda p: p.replicas)
                 for key in ONSETS}
        return FleetSummary(route=self.cfg.route, gateway=self.gateway, replicas=replicas,
                            first_kv_wait=found["first_kv_wait"], first_preemption=found["first_preemption"],
                            prediction_basis=self.basis)


def summed_capacity(caps: list[EngineCapacity], source: str) -> EngineCapacity:
    """Several pools as one: their blocks summed, when each is known and all have one block size."""
    if any(c.num_blocks is None for c in caps) or len({c.block_size for c in caps}) != 1:
        return EngineCapacity()
    tokens = [c.kv_cache_tokens for c in caps]
    return EngineCapacity(num_blocks=sum(c.num_blocks or 0 for c in caps), block_size=caps[0].block_size,
                          kv_cache_tokens=None if None in tokens else sum(t or 0 for t in tokens), source=source)


class EnginePools:
    """The engines of one data-parallel vLLM server (``--data-parallel-size N``: N engine cores behind one API server,
    each with its own scheduler and KV pool; its /metrics label each engine's figures ``engine="i"``).

    **Pools.** The API server's vllm:cache_config_info carries, under every engine's label, the engines' blocks
    *summed* (``num_gpu_blocks``: "Sum num_gpu_blocks from all engines in DP case", vllm/v1/engine/core_client.py@0.32.0,
    where each engine's handshake is read) and one engine's ``kv_cache_size_tokens``. So each engine's pool is taken as
    ``num_gpu_blocks / N`` (vLLM starts every engine with the same flags: an override pins them equal; a profiled
    pool can differ between GPUs by a few blocks, which vLLM's figures do not show).

    **Split.** The API server's DPLBAsyncMPClient.get_core_engine_for_request (same file) sends each request to the
    engine with the lowest ``max(requests this client has in flight there, waiting + running in the coordinator's
    latest snapshot)`` (the snapshot is published at most every 100 ms, vllm/v1/engine/coordinator.py@0.32.0; a
    queue on an engine over half full of KV adds to its score), ties to a scan start that rotates by one engine with
    every request routed since the server started. A point's first ``c`` requests reach idle engines at once, so each
    gets ``floor(c / N)`` or ``ceil(c / N)``: the block rule of one engine, at ``ceil(c / N)``, says the load by which
    the first engine has reached its own onset ``o``: ``N (o - 1) + 1`` streams at the latest. Later in a point a
    stale snapshot can leave one engine holding more than ``ceil(c / N)`` (a request goes to the engine the snapshot
    still shows emptier): the onset can then come at fewer streams, down to ``o`` (every stream on one engine), as
    the coordinator's timing decides, which kvplan cannot predict. Nor which engine: that is the rotation's (it
    counts every request the server has routed, other clients' too) and the snapshot's. So the prediction is the
    range ``o`` to ``N (o - 1) + 1``, no engine named. Measured on the tiny CPU engine, 2 engines of 17 blocks,
    prompts and outputs of 64 tokens (``o`` = 5): the first preemption at 7 streams, inside 5 to 9."""

    def __init__(self, snap: Snapshot, server: str, metrics_url: str):
        self.indexes = sorted(snap.engines)
        self.names = [f"engine {i}" for i in self.indexes]
        self.server, self.metrics_url = server, metrics_url
        n = len(self.indexes)
        whole = engine_named("vllm").capacity_from_metrics(snap.cache_info) if snap.cache_info else EngineCapacity()
        each = EngineCapacity()
        if whole.num_blocks is not None and whole.num_blocks % n == 0:
            each = EngineCapacity(num_blocks=whole.num_blocks // n, block_size=whole.block_size,
                                  kv_cache_tokens=whole.kv_cache_tokens,
                                  source=f"metrics: {whole.num_blocks:,} blocks over {n} engines, each 1/{n}")
        self.capacities = [each] * n
        self.rules: list[BlockRule | None] = [None] * n
        self.rule: FleetRule | None = None
        self.rule_exact = False
        self.basis = ("not predicted: the server's /metrics do not give its engines' pools"
                      if each.num_blocks is None or each.block_size is None else "not predicted")

    @property
    def capacity(self) -> EngineCapacity:
        """The server's pool: its engines' summed."""
        return summed_capacity(self.capacities, f"{len(self.capacities)} engines' pools, summed")

    def predict(self, rule: BlockRule | HybridRule | None, exact: bool, why_not: str | None) -> FleetRule | None:
        """The server's rule from one engine's (``rule``: the block rule on one engine's pool, or the hybrid
        simulator's for a model of several KV cache groups), or None and why."""
        if rule is None:
            if why_not:
                self.basis = f"not predicted: {why_not}"
            return None
        n = len(self.indexes)
        self.rules = [rule] * n
        self.rule, self.rule_exact = FleetRule(self.rules, self.names), exact
        what = "hybrid simulator" if isinstance(rule, HybridRule) else "block rule"
        self.basis = (f"each engine's {what} on its pool; a point's first c requests reach the idle engines "
                      f"split ceil(c / {n}) / floor(c / {n}) (vLLM's DP coordinator, vllm/v1/engine/core_client.py"
                      "@0.32.0: the fewest in flight, the tie to an engine that rotates with every request the server "
                      f"routes), so the first engine reaches its onset o by {n} (o - 1) + 1 streams; later requests go "
                      "by the coordinator's 100 ms snapshot of each engine's queue, which can load one engine past "
                      "the even split: the onset can come at fewer streams, down to o, as its timing decides (not "
                      "predicted), and which engine is not determinate")
        return self.rule

    def summary(self, points: list[PointResult], onsets: dict[OnsetName, Onset | None]) -> FleetSummary:
        engines = [FleetReplica(index=i, name=name, metrics_url=redact(self.metrics_url), capacity=cap,
                                prediction=None if rule is None else OnsetPrediction.from_rule(rule, self.rule_exact))
                   for i, name, cap, rule in zip(self.indexes, self.names, self.capacities, self.rules)]
        found = {key: pools_onset(self.rule, self.names, key, points, onsets.get(key), lambda p: p.engines,
                                  which_predicted=False) for key in ONSETS}
        return FleetSummary(route="data-parallel", gateway=self.server, replicas=engines,
                            first_kv_wait=found["first_kv_wait"], first_preemption=found["first_preemption"],
                            prediction_basis=self.basis)


def pools_onset(rule: FleetRule | None, names: list[str], key: OnsetName, points: list[PointResult],
                onset: Onset | None, pools_of: Callable[[PointResult], list[ReplicaPoint] | None],
                which_predicted: bool = True) -> FleetOnset:
    """One onset over several pools (a fleet's replicas, or a data-parallel server's engines: ``pools_of`` a point):
    the load at which the first pool reaches its own, predicted and measured, and which pool. ``which_predicted``
    False (vLLM's DP coordinator, EnginePools): the rule bounds the load, from the fewest streams one pool's own onset
    needs to the even split's, and does not say which pool; agreeing is a measured load within those bounds."""
    out: dict = {}
    first = None if rule is None else rule.first(key)
    if first is not None:
        load, i = first
        out.update(predicted=load, predicted_replica=names[i] if which_predicted else None,
                   predicted_share=rule.share(load, i))
        if not which_predicted:
            out["predicted_earliest"] = min(rule.own_onsets(key))
    if onset is not None and onset.first is not None:
        at = next((p for p in points if p.mode == "concurrency" and p.concurrency == onset.first
                   and pools_of(p) is not None), None)
        who = None if at is None else first_pool(pools_of(at) or [], key)
        out.update(measured=onset.first, measured_replica=None if who is None else who.name,
                   measured_in_flight=None if who is None else who.peak_in_flight)
    if onset is not None and rule is not None and not which_predicted:
        out["agrees"] = (onset.first is None and first is None) or (
            onset.first is not None and first is not None and out["predicted_earliest"] <= onset.first <= first[0])
    elif onset is not None and rule is not None:
        same_load = onset.first == out.get("predicted")
        out["agrees"] = same_load and (onset.first is None
                                       or out.get("measured_replica") == out.get("predicted_replica"))
    return FleetOnset(**out)


def first_pool(pools: list[ReplicaPoint], key: OnsetName) -> ReplicaPoint | None:
    """Of the pools (replicas, engines) that showed the event in a point, the one a scrape saw first (the first listed
    when no scrape caught it in time, only the counters read after the point)."""
    showed = [p for p in pools if (p.waited_for_kv if key == "first_kv_wait" else p.preempted)]

    def seen(p: ReplicaPoint) -> tuple[bool, float, int]:
        t = p.first_kv_wait_s if key == "first_kv_wait" else p.first_preemption_s
        return t is None, t or 0.0, p.index

    return min(showed, key=seen, default=None)


def fleet_figures(figures: list[ServerFigures], before: list[Snapshot], after: list[Snapshot | None]) -> ServerFigures:
    """The fleet's figures from each replica's (module docstring): a sum where every replica gave the figure."""
    if all(f.empty for f in figures):
        return ServerFigures()
    out: dict = {"scrapes": min(f.scrapes for f in figures)}
    for key in SUMMED + PEAKS_SUMMED:
        values = [getattr(f, key) for f in figures]
        out[key] = None if None in values else sum(values)
    kv = [f.peak_kv_usage for f in figures if f.peak_kv_usage is not None]
    out["peak_kv_usage"] = max(kv) if kv else None
    ttft = _added_ttft(before, after)
    out.update(server_ttft_mean_s=None, server_ttft_p50_s=None, server_ttft_p99_s=None, server_ttft_count=None)
    if ttft is not None:
        out.update(server_ttft_mean_s=ttft.mean, server_ttft_p50_s=ttft.quantile(0.5),
                   server_ttft_p99_s=ttft.quantile(0.99), server_ttft_count=ttft.count)
    out["incomplete"] = any(f.incomplete for f in figures)
    return ServerFigures(**out)


def _added_ttft(before: list[Snapshot], after: list[Snapshot | None]) -> Histogram | None:
    """The replicas' TTFT histograms over the point, added bucket by bucket; None unless every replica gave one
    with the same buckets and none was reset."""
    deltas = []
    for b, a in zip(before, after):
        hist = None if a is None else a.histograms.get("ttft")
        if hist is None:
            return None
        d = hist.minus(b.histograms.get("ttft"))
        if d.count < 0 or d.sum < 0 or any(c < 0 for _, c in d.buckets):
            return None
        deltas.append(d)
    edges = {tuple(le for le, _ in d.buckets) for d in deltas}
    if len(edges) != 1:
        return None
    return Histogram(tuple((le, sum(d.buckets[k][1] for d in deltas)) for k, le in enumerate(edges.pop())),
                     sum(d.sum for d in deltas), sum(d.count for d in deltas))
