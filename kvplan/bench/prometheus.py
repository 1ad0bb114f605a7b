"""Server figures from Prometheus: ``kvplan bench --prometheus URL [--selector '{namespace="x"}']``.

In a cluster the engines sit behind a gateway and Prometheus already scrapes every replica. There the bench reads
each point's server figures by PromQL through Prometheus' HTTP API (``GET /api/v1/query``;
https://prometheus.io/docs/prometheus/latest/querying/api/) instead of scraping the engine itself, and beside it
when the engine's own /metrics answers too (``PointResult.server_scraped``, for comparison). The figures follow
the scraped path's rules (kvplan.bench.metrics): the same names per release (kvplan/vllm/metric_names.py,
kvplan/sglang/metric_names.py), each quantity from the first of its names present, counters summed over every
series the selector matches (replicas and vLLM's ``engine`` label alike), KV usage their maximum, NaN, infinite
and negative samples dropped. They land in the same ``ServerFigures``, with ``source: "prometheus"``, so the
onsets and reports read them unchanged.

**The window.** Prometheus knows a counter's value at the end of a point only once a scrape after the end has
landed: up to one scrape interval later. So after the point's last request the bench asks Prometheus for its own
clock (``time()``) and polls until every matched series has a sample stamped later (``timestamp(...)``: each
sample of a scrape carries the scrape's start time), that is, a scrape begun after the point ended. That moment
is the point's end mark. The same wait makes the first point's start mark; a later point starts at the previous
end mark, because nothing ran between them. The cost is about one scrape interval per point, waited for at most
``--prometheus-wait`` seconds.

**The figures over [start mark, end mark]:**

- Counters and histograms come from the instant vector at each mark. The figure is the difference, after minus
  before, and none when a series went down (an engine reset), exactly as the scraper's before/after deltas.
  ``increase(x[w])`` is not used: PromQL extrapolates it from the samples inside the range to the range's ends.
  Prometheus' documentation of increase() says: "the increase is extrapolated to cover the full time range ...
  so that it is possible to get a non-integer result even if a counter increases only by integer increments".
  8 preemptions could then read as 8.4. The two marks are samples, so their difference is the count the engine
  kept.
- Gauges (running, waiting, KV usage; preemptions for the chart) come from the range vector ``x[w]`` at the end
  mark: every sample Prometheus took in the window, which is what ``max_over_time(x[w])`` maximizes. They are
  summed over series at each sample time, so a peak is the most held at once, as the scraper's is. Prometheus
  samples each scrape interval and the bench's scraper every --scrape-interval, so two gauge peaks agree only
  where the peak lasted longer than both intervals.

What Prometheus answers is data, not fact. Each answer is read through the run's HTTP policy
(kvplan.bench.client.Client.get: at most 16 MiB, a deadline, no redirects, the environment's proxy, TLS as for
the engine). An answer that is not the API's JSON, holds another result type, or matches more than MAX_SERIES
series is a one-line error, never a figure. Prometheus is another origin than the engine: its credentials are
its own (user:password@ in --prometheus, --prometheus-header), and the engine's key and headers never go there.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlencode

from kvplan.bench.client import REDIRECT_HINT, Client, credential_secrets, is_redirect, split_credentials
from kvplan.bench.config import PrometheusConfig
from kvplan.bench.metrics import ALIASES, GAUGES, HISTOGRAMS, Snapshot, snapshot_of, summarize
from kvplan.bench.results import ServerFigures
from kvplan.errors import KvplanError
from kvplan.term import printable
from kvplan.vllm.metric_names import CACHE_INFO, WAITING_BY_REASON
from kvplan.vllm.startup_log import redact

QUERY_PATH = "/api/v1/query"
DEFAULT_WAIT_S = 60.0  # --prometheus-wait: most production scrape intervals are 15-30 s
MAX_SERIES = 10_000  # series one answer may hold: more is not one deployment's engines
MAX_WINDOW_SAMPLES = 2_000_000  # series x sample times of one point's gauges
POLL_S = (0.05, 1.0)  # between two looks for a fresh sample: the first wait, growing by half each look up to the last
QUERY_TIMEOUT_S = 10.0
#: The labels of Prometheus' own that tell scrape targets apart (an unselected Prometheus may scrape several).
TARGET_LABELS = ("job", "instance")
#: Labels of vllm:cache_config_info that are not the engine's cache config (Prometheus' target and vLLM's own).
_NOT_CACHE_CONFIG = {"__name__", "engine", "model_name", *TARGET_LABELS}

#: One label matcher of a selector: name, operator, double-quoted value (backslash escapes).
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\\n]|\\.)*)"\s*')
MAX_SELECTOR_CHARS = 2000

SELECTOR_HINT = "write it as PromQL label matchers: --selector '{namespace=\"prod\",pod=~\"vllm-.*\"}'"


class PrometheusError(KvplanError):
    """Prometheus cannot give a figure: one line (exit 2 before the points; a failed point during them)."""


def parse_selector(text: str | None) -> str | None:
    """``{a="b", c=~"d"}`` -> ``a="b",c=~"d"`` (the matchers, checked one by one; None for none). A selector is
    spliced into every query, so anything that is not a plain matcher list is refused here."""
    if text is None:
        return None
    raw = text.strip()
    if len(raw) > MAX_SELECTOR_CHARS:
        raise KvplanError(f"invalid --selector: over {MAX_SELECTOR_CHARS} characters", SELECTOR_HINT)
    if not (raw.startswith("{") and raw.endswith("}")):
        raise KvplanError(f"invalid --selector {printable(raw, 100)!r}: not in braces", SELECTOR_HINT)
    inner, pos, matchers = raw[1:-1].strip(), 0, []
    while pos < len(inner) and inner[pos:].strip():  # a trailing comma (and blanks) may end the list
        m = _MATCHER.match(inner, pos)
        if m is None:
            raise KvplanError(f"invalid --selector {printable(raw, 100)!r}: no label matcher at "
                              f"{printable(inner[pos:pos + 30], 40)!r}", SELECTOR_HINT)
        if m.group(1) == "__name__":
            raise KvplanError("invalid --selector: it names __name__", "kvplan picks the metric names; select the "
                              "engines by their labels (namespace, pod, job, instance)")
        matchers.append(f'{m.group(1)}{m.group(2)}"{m.group(3)}"')
        pos = m.end()
        if pos < len(inner):
            if inner[pos] != ",":
                raise KvplanError(f"invalid --selector {printable(raw, 100)!r}: matchers are separated by commas",
                                  SELECTOR_HINT)
            pos += 1
    return ",".join(matchers) or None


class _Sample(NamedTuple):
    """One series' value, shaped as kvplan.bench.metrics.snapshot_of reads a parsed /metrics sample."""

    labels: dict[str, str]
    value: float


@dataclass
class Series:
    """One series of an answer: its labels (``__name__`` included) and its samples ``[(t_s, value)]``."""

    labels: dict[str, str]
    samples: list[tuple[float, float]]

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


@dataclass
class Prometheus:
    """Reads one run's server figures from the Prometheus at ``url`` (which may hold credentials: never shown,
    never stored). ``selector``: the matchers parse_selector returned. ``discover`` first, then ``mark`` and
    ``figures`` per point."""

    url: str
    selector: str | None
    client: Client
    wait_s: float = DEFAULT_WAIT_S
    names: dict[str, str] = field(default_factory=dict)  # quantity -> the name the engines answer under
    histograms: dict[str, str] = field(default_factory=dict)  # "ttft"/"itl"/... -> histogram name
    last_mark: float | None = None  # the end mark of the last point: the next one's start
    has_cache_config: bool = False  # the selected engines' vllm:cache_config_info is there

    @property
    def bare_url(self) -> str:
        return split_credentials(self.url.rstrip("/"))[0]

    @property
    def shown(self) -> str:
        """The URL for messages and files: no credentials."""
        return redact(self.bare_url)

    @property
    def shown_selector(self) -> str:
        return "{" + (self.selector or "") + "}"

    # ---------------------------------------------------------------- one query

    def query(self, expr: str, at: float | None = None, what: str | None = None) -> dict:
        """The ``data`` of a successful answer to ``expr`` evaluated at ``at`` (Prometheus' clock, seconds; None:
        its now); PrometheusError with Prometheus' own reason otherwise. ``what``: the query in words, for
        messages (else the query itself)."""
        params = {"query": expr} if at is None else {"query": expr, "time": repr(float(at))}
        url = f"{self.url.rstrip('/')}{QUERY_PATH}?{urlencode(params)}"
        where = f"{self.shown}{QUERY_PATH}{self.client.via(self.bare_url)}"
        status, body = self.client.get(url, timeout_s=QUERY_TIMEOUT_S)
        if status == 0:
            raise PrometheusError(f"Prometheus does not answer at {where}", "check --prometheus (scheme, host, port)")
        if status in (401, 403):
            raise PrometheusError(f"{where} answered HTTP {status}: Prometheus wants credentials",
                                  "pass --prometheus-header 'Authorization: Bearer TOKEN', or user:password@ in "
                                  "the --prometheus URL")
        if is_redirect(status):
            raise PrometheusError(f"{where} answered HTTP {status}, a redirect",
                                  REDIRECT_HINT.replace("--url", "--prometheus"))
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict) or answer.get("status") not in ("success", "error"):
            raise PrometheusError(f"{where} answered HTTP {status} with no Prometheus API answer (not its JSON, "
                                  "or cut at 16 MiB)", "is --prometheus the Prometheus server's URL?")
        if answer["status"] == "error" or status != 200:
            why = f"{answer.get('errorType', '')}: {answer.get('error', '')}".strip(": ")
            raise PrometheusError(f"Prometheus refused the query {what or repr(printable(expr, 160))} (HTTP {status}"
                                  f"{', ' + printable(self.client.scrub(why), 300) if why else ''})")
        data = answer.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise self._lie(expr, "no result list")
        return data

    def _lie(self, expr: str, why: str) -> PrometheusError:
        return PrometheusError(f"Prometheus' answer to {printable(expr, 160)!r} is not one it gives ({why})",
                               "is --prometheus the Prometheus server's URL?")

    def series(self, expr: str, at: float | None = None, what: str | None = None) -> list[Series]:
        """The series of an instant query (``vector``: one sample each) or of a range vector (``matrix``)."""
        data = self.query(expr, at, what)
        kind, result = data.get("resultType"), data["result"]
        if kind not in ("vector", "matrix"):
            raise self._lie(expr, f"a {printable(kind, 20)} where a vector was asked")
        if len(result) > MAX_SERIES:
            raise PrometheusError(f"{len(result):,} series match {self.shown_selector} (more than {MAX_SERIES:,}: "
                                  "not one deployment's engines)", "narrow --selector")
        out = []
        for item in result:
            labels = item.get("metric") if isinstance(item, dict) else None
            if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in labels.items()):
                raise self._lie(expr, "a series without string labels")
            points = [item.get("value")] if kind == "vector" else item.get("values")
            if not isinstance(points, list):
                raise self._lie(expr, "a series without samples")
            out.append(Series(labels, [self._point(expr, p) for p in points]))
        return out

    def _point(self, expr: str, point) -> tuple[float, float]:
        """``[1712345678.123, "5"]`` -> (time, value); the value may be NaN or infinite (the snapshot drops it)."""
        if not (isinstance(point, list) and len(point) == 2 and isinstance(point[1], str)):
            raise self._lie(expr, "a sample that is not [time, \"value\"]")
        t = point[0]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise self._lie(expr, "a sample time that is not a number")
        try:
            return float(t), float(point[1])
        except ValueError:
            raise self._lie(expr, "a sample value that is not a number") from None

    def scalar(self, expr: str) -> float:
        data = self.query(expr)
        value = data["result"]
        if data.get("resultType") != "scalar":
            raise self._lie(expr, "no scalar")
        t, v = self._point(expr, value)
        if not math.isfinite(v):
            raise self._lie(expr, "a clock that is not a number")
        return v

    def _select(self, names) -> str:
        """A selector of every name in ``names`` within the run's --selector."""
        pick = "|".join(sorted(set(names)))
        return "{" + f'__name__=~"{pick}"' + (f",{self.selector}" if self.selector else "") + "}"

    # ---------------------------------------------------------------- once a run

    def check(self) -> None:
        """Prometheus answers a query (before a run folder exists)."""
        self.scalar("time()")

    def discover(self, model: str | None) -> None:
        """Which names the selected engines answer under; refused (one line) when the selector matches no engine,
        several scrape targets without a selector, or another model than the one benched."""
        every = {n for names in ALIASES.values() for n in names} | {WAITING_BY_REASON, CACHE_INFO}
        every |= {h + "_bucket" for names in HISTOGRAMS.values() for h in names}
        groups = self.series(f"count by (__name__, {', '.join(TARGET_LABELS)}, model_name) ({self._select(every)})",
                             what=f"for the engines' series {self.shown_selector}")
        present = {s.name for s in groups}
        if not present:
            raise PrometheusError(f"Prometheus at {self.shown} has no vLLM or SGLang series matching "
                                  f"{self.shown_selector}", "check --selector against the labels Prometheus gives "
                                  "the engine's series (job, instance, and what its relabelling adds), and that it "
                                  "scrapes the engine's /metrics")
        targets = sorted({tuple(s.labels.get(k, "") for k in TARGET_LABELS) for s in groups})
        if self.selector is None and len(targets) > 1:
            shown = ", ".join(f"{job}/{inst}" for job, inst in targets[:3]) + (", ..." if len(targets) > 3 else "")
            raise PrometheusError(f"Prometheus at {self.shown} scrapes vLLM or SGLang at {len(targets)} targets "
                                  f"({printable(shown, 200)})", "pass --selector to pick the deployment benched, "
                                  "e.g. --selector '{job=\"vllm\"}'")
        models = {s.labels["model_name"] for s in groups if s.labels.get("model_name")}
        if model and models and model not in models:
            raise PrometheusError(f"the series {self.shown_selector} selects are of model "
                                  f"{printable(', '.join(sorted(models)), 200)}, not of {printable(model, 200)!r} "
                                  "that the bench sends", "narrow --selector to the engines serving it")
        self.names = {key: next(n for n in names if n in present)
                      for key, names in ALIASES.items() if any(n in present for n in names)}
        self.histograms = {key: next(h for h in names if h + "_bucket" in present)
                           for key, names in HISTOGRAMS.items() if any(h + "_bucket" in present for h in names)}
        if WAITING_BY_REASON in present:
            self.names["waiting_by_reason"] = WAITING_BY_REASON
        self.has_cache_config = CACHE_INFO in present
        if self._clock() is None:
            raise PrometheusError(f"Prometheus at {self.shown} has no running, waiting or KV usage gauge matching "
                                  f"{self.shown_selector}", "the bench times each point's window by one")

    def _clock(self) -> str | None:
        """The gauge whose sample times show when each engine was last scraped."""
        return next((self.names[k] for k in ("running", "waiting", "kv_usage") if k in self.names), None)

    def cache_config(self) -> dict[str, str] | None:
        """The labels of vllm:cache_config_info (the engine's KV pool), when Prometheus holds it."""
        if not self.has_cache_config:
            return None
        found = self.series(self._select([CACHE_INFO]))
        return {k: v for k, v in found[0].labels.items() if k not in _NOT_CACHE_CONFIG} if found else None

    def _every_name(self) -> set[str]:
        names = set(self.names.values())
        for h in self.histograms.values():
            names |= {h + "_bucket", h + "_sum", h + "_count"}
        return names

    # ---------------------------------------------------------------- per point

    async def mark(self, reuse: bool = False) -> float:
        """A time on Prometheus' clock by which every selected engine has been scraped since this call began:
        the instant vectors there hold nothing older. ``reuse``: the last end mark, when nothing ran since.
        Async, each query in a worker thread: Ctrl-C stops the wait between two looks."""
        if reuse and self.last_mark is not None:
            return self.last_mark
        clock = self._clock()
        now = await asyncio.to_thread(self.scalar, "time()")
        deadline, pause = time.monotonic() + self.wait_s, POLL_S[0]
        while True:
            expr = f"timestamp({self._select([clock])})"
            stamps = [s.samples[0][1] for s in await asyncio.to_thread(self.series, expr)]
            if not all(math.isfinite(t) for t in stamps):
                raise self._lie(expr, "a sample time that is not a number")
            if not stamps:
                raise PrometheusError(f"Prometheus no longer holds any {clock} series matching "
                                      f"{self.shown_selector} (the engines stopped being scraped)")
            if min(stamps) > now:
                self.last_mark = max(stamps)
                return self.last_mark
            if time.monotonic() > deadline:
                raise PrometheusError(f"Prometheus took no new sample of every selected engine within "
                                      f"{self.wait_s:g} s", "raise --prometheus-wait above its scrape interval")
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, POLL_S[1])

    def snapshot(self, at: float, start: float) -> Snapshot:
        """Every figure's series at ``at``, summed as the scraper sums /metrics."""
        found = self.series(self._select(self._every_name()), at)
        return _snapshot([(s.labels, s.samples[-1][1]) for s in found], at - start)

    def during(self, start: float, end: float) -> list[Snapshot]:
        """The gauges at every sample time in (start, end], each series at its latest sample by then."""
        gauges = [self.names[k] for k in (*GAUGES, "waiting_by_reason") if k in self.names]
        window_ms = max(1, round((end - start) * 1000))
        found = self.series(f"{self._select(gauges)}[{window_ms}ms]", end)
        times = sorted({t for s in found for t, _ in s.samples if start < t <= end})
        if len(times) * max(1, len(found)) > MAX_WINDOW_SAMPLES:
            raise PrometheusError(f"the point's window holds {len(found):,} series x {len(times):,} sample times",
                                  "narrow --selector")
        stamps = [[t for t, _ in s.samples] for s in found]
        out = []
        for t in times:
            now = []
            for s, ts in zip(found, stamps):
                i = bisect_right(ts, t)
                if i:
                    now.append((s.labels, s.samples[i - 1][1]))
            out.append(_snapshot(now, t - start, only=GAUGES))
        return out

    def figures(self, start: float, end: float) -> ServerFigures:
        """A point's figures over [start, end] (two marks), by the scraper's rules (kvplan.bench.metrics.summarize)."""
        figures = summarize(self.snapshot(start, start), self.during(start, end), self.snapshot(end, start))
        return figures.model_copy(update={"source": "prometheus"})


def _snapshot(values: list[tuple[dict[str, str], float]], t_s: float, only=None) -> Snapshot:
    """A Snapshot of (labels with __name__, value) pairs: NaN, infinite and negative values dropped, as from
    /metrics (kvplan.bench.metrics._sane)."""
    samples: dict[str, list] = {}
    insane: set[str] = set()
    for labels, value in values:
        name = labels.get("__name__", "")
        if math.isfinite(value) and value >= 0:
            samples.setdefault(name, []).append(_Sample({k: v for k, v in labels.items() if k != "__name__"}, value))
        else:
            insane.add(name)
    return snapshot_of(samples, t_s, only, insane=insane)


def prometheus_for(config: PrometheusConfig, url: str | None, headers: tuple[tuple[str, str], ...],
                   ca_bundle: str | None, insecure: bool) -> Prometheus:
    """A run's reader: ``url`` as given (credentials and all), else the stored one (--resume, when it had none);
    the engine's TLS choices, none of its credentials (another origin)."""
    url = url or config.url
    client = Client(headers=tuple(headers), url_secrets=credential_secrets(url), ca_bundle=ca_bundle,
                    insecure=insecure)
    return Prometheus(url=url, selector=config.selector, client=client, wait_s=config.wait_s)
