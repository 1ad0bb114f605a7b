"""Read vLLM's ``/metrics`` (Prometheus text) with prometheus_client's parser.

Metric names differ between releases; ``kvplan/vllm/metric_names.py`` lists each quantity's
aliases, newest first.

Samples of several engines (data parallel) are summed, KV usage takes the maximum; each engine's own
figures are kept beside (``Snapshot.engines``), since each engine has its own KV pool. During a
point kvplan scrapes every ``--scrape-interval`` (``GAUGES`` only, so parsing stays cheap) and
once in full before and after it (counters and histograms, as deltas). The server renders all of
/metrics for every GET, whatever the client keeps: 7-15 ms of server CPU per scrape on the tiny
CPU engine, 1-3% of a core at the default 2 Hz, with the server's mean TTFT unchanged beyond
run-to-run noise (scraper on / off, benchmarks/bench_vs_vllm_bench.py); a 20 Hz scraper was
measured raising it by 18-39%.

A /metrics that lies is data, not a fact: NaN, infinite and negative samples are dropped (a gauge
or counter is never negative), a counter that went down (a reset engine) gives no delta, and only
a finite positive preemption delta counts as preemption. Parsing runs in a worker thread
(``asyncio.to_thread``), never on the event loop that timestamps streamed tokens: a 2 MB
/metrics cannot move ITL.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvplan.bench.client import REDIRECT_HINT, Client, is_redirect
from kvplan.bench.results import ServerFigures
from kvplan.sglang import metric_names as sglang_names
from kvplan.term import printable
from kvplan.vllm import metric_names as vllm_names
from kvplan.vllm.metric_names import CACHE_INFO, TIER_COUNTERS, WAITING_BY_REASON

#: Each quantity's names over the engines the bench reads, vLLM's first: their prefixes never meet, so a server's
#: /metrics answers under one engine's names (kvplan/vllm/metric_names.py, kvplan/sglang/metric_names.py).
ALIASES: dict[str, tuple[str, ...]] = {key: names + sglang_names.ALIASES.get(key, ())
                                       for key, names in vllm_names.ALIASES.items()}
HISTOGRAMS: dict[str, tuple[str, ...]] = {key: names + sglang_names.HISTOGRAMS.get(key, ())
                                          for key, names in vllm_names.HISTOGRAMS.items()}

#: What the fast scrape keeps (line prefixes).
GAUGES = ("running", "waiting", "kv_usage", "preemptions")

#: The label vLLM puts on every per-engine sample: a data-parallel server (``--data-parallel-size N``) runs N engine
#: cores behind one API server, each with its own scheduler and KV pool, and one PrometheusStatLogger labels each
#: engine's children ``engine="<index>"`` (vllm/v1/metrics/loggers.py@0.32.0, ``engine_indexes``).
ENGINE_LABEL = "engine"
#: The most engines kvplan reads on one server, as it reads at most 64 replicas a run (kvplan.bench.config.MAX_REPLICAS):
#: each engine's figures and fast-scrape series go into every point's record. A /metrics naming more is refused.
MAX_ENGINES = 64


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets ``[(le, count)]`` plus sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, before: Histogram | None) -> Histogram:
        if before is None:
            return self
        old = dict(before.buckets)
        return Histogram(tuple((le, c - old.get(le, 0.0)) for le, c in self.buckets),
                         self.sum - before.sum, self.count - before.count)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear inside the bucket."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if le == float("inf"):
                    return prev_le
                if c == prev_c:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le


@dataclass
class Snapshot:
    """One scrape: scalar values by quantity, histograms, cache_config_info labels."""

    t_s: float
    values: dict[str, float] = field(default_factory=dict)
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    cache_info: dict[str, str] | None = None
    model_names: frozenset[str] = frozenset()  # the model_name labels of a full scrape (the models it serves)
    # Data parallel (two engines or more): each engine's own snapshot, by engine index; empty for one engine
    engines: dict[int, Snapshot] = field(default_factory=dict)
    engine_error: str | None = None  # why the engine labels cannot be read as engines (the split is then not made)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def _filter_lines(text: str, prefixes: Iterable[str]) -> str:
    keep = tuple(prefixes)
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[2].startswith(keep):
                out.append(line)
        elif line.startswith(keep):
            out.append(line)
    return "\n".join(out) + "\n"


def parse_metrics(text: str, t_s: float = 0.0, only: Iterable[str] | None = None) -> Snapshot:
    """Parse Prometheus text into a Snapshot; ``only`` limits it to some quantities (fast)."""
    from prometheus_client.parser import text_string_to_metric_families

    if only is not None:
        names = [alias for key in only for alias in ALIASES.get(key, ())]
        if "waiting" in only:
            names.append(WAITING_BY_REASON)
        text = _filter_lines(text, names)
    samples: dict[str, list] = {}
    declared: set[str] = set()  # families /metrics names, with or without samples
    insane: set[str] = set()  # sample names with a NaN, infinite or negative value
    for family in text_string_to_metric_families(text):
        declared.add(family.name)
        for sample in family.samples:
            if _sane(sample.value):
                samples.setdefault(sample.name, []).append(sample)
            else:
                insane.add(sample.name)
    return snapshot_of(samples, t_s, only, declared, insane)


def snapshot_of(samples: dict[str, list], t_s: float, only: Iterable[str] | None = None,
                declared: set[str] = frozenset(), insane: set[str] = frozenset()) -> Snapshot:
    """A Snapshot from sane samples by sample name (each with ``.labels`` and ``.value``), whatever read them:
    /metrics text here, Prometheus' query API in kvplan.bench.prometheus. The rules are the same for both: each
    quantity from the first of its names present, summed over engines (KV usage: their maximum); with two engines or
    more, each engine's own snapshot beside (``engines``)."""
    snap = _pooled(samples, t_s, only, declared, insane)
    indexes, snap.engine_error = engine_indexes(samples)
    if len(indexes) > 1:
        by_label: dict[str, dict[str, list]] = {label: {} for _, label in indexes}
        for name, group in samples.items():  # one pass: a sample without the label belongs to no engine
            for s in group:
                mine = by_label.get(s.labels.get(ENGINE_LABEL))
                if mine is not None:
                    mine.setdefault(name, []).append(s)
        snap.engines = {index: _pooled(by_label[label], t_s, only, declared, insane) for index, label in indexes}
    return snap


def engine_indexes(samples: dict[str, list]) -> tuple[list[tuple[int, str]], str | None]:
    """The engines the samples name ((index, label) in index order) and why they are not engines, if so: a label
    that is no engine index (vLLM writes ``str(index)``), two labels of one index, or more than MAX_ENGINES."""
    labels: set[str] = set()
    for group in samples.values():
        for s in group:
            label = s.labels.get(ENGINE_LABEL)
            if label is not None:
                labels.add(label)
                if len(labels) > MAX_ENGINES:
                    return [], f"more than {MAX_ENGINES} engine labels (engine=...), over the {MAX_ENGINES} kvplan reads"
    if len(labels) < 2:
        return [], None
    bad = next((label for label in sorted(labels) if not (label.isascii() and label.isdecimal() and len(label) < 10)),
               None)
    if bad is not None:
        return [], f"the engine label {printable(bad, 40)!r} is not an engine index (vLLM writes 0, 1, ...)"
    indexes = sorted((int(label), label) for label in labels)
    if len({i for i, _ in indexes}) != len(indexes):
        return [], f"two engine labels of one index ({', '.join(sorted(labels))[:200]})"
    return indexes, None


def _pooled(samples: dict[str, list], t_s: float, only: Iterable[str] | None, declared: set[str],
            insane: set[str]) -> Snapshot:
    snap = Snapshot(t_s)
    for key, aliases in ALIASES.items():
        for alias in aliases:
            if alias in samples:
                vals = [s.value for s in samples[alias]]
                snap.values[key] = max(vals) if key == "kv_usage" else sum(vals)
                break
    for s in samples.get(WAITING_BY_REASON, []):
        reason = s.labels.get("reason", "")
        snap.waiting_by_reason[reason] = snap.waiting_by_reason.get(reason, 0.0) + s.value
    if only is None:
        for key, aliases in HISTOGRAMS.items():
            for alias in aliases:
                hist = _histogram(samples, alias)
                if hist is not None:
                    snap.histograms[key] = hist
                    break
        snap.values.update(_tier_counters(samples, declared, insane))
        snap.model_names = frozenset(s.labels["model_name"] for group in samples.values() for s in group
                                     if "model_name" in s.labels)
        info = samples.get(CACHE_INFO)
        if info:
            snap.cache_info = {k: v for k, v in info[0].labels.items() if k not in ("engine", "model_name")}
    return snap


def _tier_counters(samples: dict[str, list], declared: set[str], insane: set[str]) -> dict[str, float]:
    """The KV tier's counters (TIER_COUNTERS): the first name whose family is declared, its samples (with the label
    asked) summed over engines; 0 where the family is declared with no sample yet (vLLM creates a labelled child at
    the first transfer); nothing where a sample of it is not a finite number >= 0."""
    out: dict[str, float] = {}
    for key, names in TIER_COUNTERS.items():
        for name, label in names:
            if name.removesuffix("_total") not in declared:
                continue
            if name in insane:
                break
            out[key] = sum(s.value for s in samples.get(name, [])
                           if label is None or s.labels.get(label[0]) == label[1])
            break
    return out


def _sane(value) -> bool:
    """Every vLLM sample is a finite number >= 0 (counters, gauges, bucket counts, sums of durations)."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _histogram(samples: dict[str, list], name: str) -> Histogram | None:
    buckets = samples.get(name + "_bucket")
    if not buckets:
        return None
    by_le: dict[float, float] = {}
    for s in buckets:
        try:
            le = float(s.labels.get("le", "inf"))
        except ValueError:
            continue
        if math.isnan(le):
            continue
        by_le[le] = by_le.get(le, 0.0) + s.value
    total = sum(s.value for s in samples.get(name + "_sum", []))
    count = sum(s.value for s in samples.get(name + "_count", []))
    return Histogram(tuple(sorted(by_le.items())), total, count)


def _delta(after: Snapshot, before: Snapshot, key: str) -> float | None:
    """A counter's increase; None when unknown or when the counter went down (the engine reset it,
    or the server lies): a reset is never read as a negative count."""
    a, b = after.get(key), before.get(key)
    if a is None or b is None or a < b:
        return None
    d = a - b
    return d if math.isfinite(d) else None


def _histogram_delta(after: Snapshot, before: Snapshot, key: str) -> Histogram | None:
    """A histogram's increase over a point; None when unknown or when it went down (reset between scrapes)."""
    hist = after.histograms.get(key)
    if hist is None:
        return None
    d = hist.minus(before.histograms.get(key))
    return d if d.count >= 0 and d.sum >= 0 and all(c >= 0 for _, c in d.buckets) else None


def _peak(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def summarize(before: Snapshot, during: list[Snapshot], after: Snapshot) -> ServerFigures:
    """Combine the full scrapes around a point with the fast ones taken during it: deltas of counters,
    peaks of gauges (every figure given, None where the server did not say)."""
    every = [before, *during, after]
    pm: dict = {"scrapes": len(during)}
    pm["preemptions"] = _delta(after, before, "preemptions")
    pm["peak_running"] = _peak(s.get("running") for s in every)
    pm["peak_waiting"] = _peak(s.get("waiting") for s in every)
    pm["peak_waiting_capacity"] = _peak(s.waiting_by_reason.get("capacity") for s in every)
    pm["peak_kv_usage"] = _peak(s.get("kv_usage") for s in every)
    pm["peak_in_engine"] = _peak(
        (s.get("running") or 0.0) + (s.get("waiting") or 0.0) if s.get("running") is not None else None for s in every
    )
    for key in ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", *TIER_COUNTERS):
        pm[key] = _delta(after, before, key)
    pm.update(server_ttft_mean_s=None, server_ttft_p50_s=None, server_ttft_p99_s=None, server_ttft_count=None)
    for key in ("ttft", "itl"):  # the server's own view of the latencies (ITL only when its histogram is there)
        d = _histogram_delta(after, before, key)
        if d is not None:
            pm.update({f"server_{key}_mean_s": d.mean, f"server_{key}_p50_s": d.quantile(0.5),
                       f"server_{key}_p99_s": d.quantile(0.99), f"server_{key}_count": d.count})
    for key in ("queue", "prefill"):
        d = _histogram_delta(after, before, key)
        pm[f"server_{key}_mean_s"] = d.mean if d is not None else None
    base = before.get("preemptions") or 0.0
    series = []
    for s in during:
        seen = s.get("preemptions")
        series.append((round(s.t_s, 4), s.get("running") or 0.0, s.get("waiting") or 0.0,
                       s.get("kv_usage") or 0.0, max(0.0, seen - base) if seen is not None else 0.0))
    return ServerFigures(**pm, series=series)


def preempted(preemptions) -> bool:
    """Whether a point's preemption delta is evidence of preemption: a finite count above zero."""
    return isinstance(preemptions, (int, float)) and not isinstance(preemptions, bool) \
        and math.isfinite(preemptions) and preemptions > 0


MAX_METRICS_BYTES = 64 * 1024 * 1024  # a /metrics larger than this is not read


async def fetch_text(session, url: str, request_kwargs: dict | None = None) -> str:
    """GET ``url`` as text (at most MAX_METRICS_BYTES); ``request_kwargs``: headers and proxy (Client.aio_kwargs)."""
    async with session.get(url, **(request_kwargs or {})) as resp:
        if resp.status != 200:
            why = f", a redirect: {REDIRECT_HINT}" if is_redirect(resp.status) else ""
            raise RuntimeError(f"GET {url}: HTTP {resp.status}{why}")
        if (resp.content_length or 0) > MAX_METRICS_BYTES:
            raise RuntimeError(f"GET {url}: {resp.content_length:,} bytes, over the {MAX_METRICS_BYTES:,} read")
        parts, size = [], 0
        while True:
            chunk = await resp.content.read(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_METRICS_BYTES:
                raise RuntimeError(f"GET {url}: over the {MAX_METRICS_BYTES:,} bytes read")
            parts.append(chunk)
        return b"".join(parts).decode("utf-8", errors="replace")


def _session(timeout_s: float, client, base_url: str):
    """(session, /metrics URL without credentials, its request kwargs): the run's headers and proxy
    (kvplan.bench.client); aiohttp's trust_env stays off, the proxy is the Client's decision."""
    import aiohttp

    url, kwargs = client.aio_kwargs(base_url.rstrip("/") + "/metrics")
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), trust_env=False), url, kwargs


def _client(client, api_key: str | None):
    return client if client is not None else Client(api_key=api_key)


async def scrape_once(base_url: str, timeout_s: float = 10.0, api_key: str | None = None, client=None) -> Snapshot:
    """One full scrape (its own session); parsed in a worker thread. ``client``: a
    kvplan.bench.client.Client (key, headers, proxy) instead of ``api_key``."""
    session, url, kwargs = _session(timeout_s, _client(client, api_key), base_url)
    async with session:
        text = await fetch_text(session, url, kwargs)
    t = time.perf_counter()
    try:
        return await asyncio.to_thread(parse_metrics, text, t)
    except ValueError as exc:  # not Prometheus text
        raise RuntimeError(f"GET {url}: not Prometheus text ({str(exc)[:200]})") from None


async def scrape_during(
    base_url: str,
    interval_s: float,
    stop: asyncio.Event,
    t0: float,
    out: list[Snapshot],
    on_scrape: Callable[[Snapshot], None] | None = None,
    api_key: str | None = None,
    client=None,
) -> None:
    """Fast scrapes of the GAUGES every ``interval_s`` until ``stop`` is set; errors are skipped.
    The text is filtered and parsed in a worker thread: the event loop keeps timestamping tokens."""
    session, url, kwargs = _session(max(2.0, 20 * interval_s), _client(client, api_key), base_url)
    async with session:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                text = await fetch_text(session, url, kwargs)
                snap = await asyncio.to_thread(parse_metrics, text, start - t0, GAUGES)
                out.append(snap)
                if on_scrape:
                    on_scrape(snap)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed or garbled scrape is skipped, never fatal
                pass
            wait = interval_s - (time.perf_counter() - start)
            if wait > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
