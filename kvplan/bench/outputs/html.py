"""report.html: one self-contained file (inline SVG charts, inline CSS, no script, no network) for
one run or several compared: onsets predicted vs measured, TTFT/ITL/E2E percentiles, throughput
and goodput, KV fill and preemptions, all against the load (concurrency or request rate)."""

from __future__ import annotations

import math
import re
import sys
from html import escape

from kvplan.bench.outputs.registry import output
from kvplan.bench.outputs.text import (
    DEFINITIONS,
    GPU_HEAD,
    PREDICTED_FIGURES,
    TIER_HEAD,
    budget_wait_text,
    gpu_rows,
    latency_model_text,
    onset_text,
    predicted_cells,
    tier_rows,
)
from kvplan.bench.results import BenchSummary, LatencyStats, PointResult
from kvplan.bench.slo import describe_slo
from kvplan.bench.store import RunStore
from kvplan.stats import percentile

HTML_FILE = "report.html"

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
W, H, L, R, T, B = 560, 300, 64, 16, 28, 44  # size and margins of a chart (T: above the legend)
ONSET_COLOURS = ("#e6820e", "#b00")  # first KV wait, first preemption (vertical lines)
LEGEND_ROW, LEGEND_SWATCH, LEGEND_GAP = 15, 20, 14  # px: a legend row's height, a swatch's length, between entries


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    if not 1e-300 < (hi - lo) / n < 1e300:  # a range no decimal step resolves (a 5e-324 or 1e308 figure)
        return [v for v in (lo, hi) if math.isfinite(v)]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _text_width(text: str, size: float = 11.0) -> float:
    """A generous estimate of a label's width in px (DejaVu/Liberation Sans at ``size`` px): the legend
    and the tick labels are laid out without a script, so they must not need the browser's measure."""
    wide = sum(1 for c in text if c in "mwMW%@")
    narrow = sum(1 for c in text if c in "il.,:;!|' ()[]tfrj1-")
    return size * (0.62 * len(text) + 0.3 * wide - 0.22 * narrow)


def _legend_rows(entries: list[tuple[str, str, str]], width: float) -> list[list[tuple[float, str, str, str]]]:
    """Entries (name, colour, dash) placed left to right in rows of at most ``width`` px: (x, ...)."""
    rows: list[list[tuple[float, str, str, str]]] = [[]]
    x = 0.0
    for name, colour, dash in entries:
        w = LEGEND_SWATCH + 4 + _text_width(name)
        if rows[-1] and x + w > width:
            rows.append([])
            x = 0.0
        rows[-1].append((x, name, colour, dash))
        x += w + LEGEND_GAP
    return rows


def chart(title: str, xlabel: str, ylabel: str, series: list[tuple[str, list[tuple[float, float]], str, str]],
          vlines: list[tuple[float, str, str, str]] = (), log_x: bool = False,
          hlines: list[tuple[float, str, str, str]] = ()) -> str:
    """An SVG line chart. series: (name, points, colour, dash); vlines: (x, label, colour, dash), the onsets;
    hlines: (y, label, colour, dash), targets such as an SLO.

    The legend (series and lines, each with its colour and dash) sits in rows between the title and the plot,
    never over the data; the lines carry no label of their own (their legend entry and a tooltip name them)."""
    pts = [(x, y) for _, ps, _, _ in series for x, y in ps if y is not None and math.isfinite(y)]
    if not pts:
        return f'<figure><figcaption>{escape(title)}</figcaption><p class="empty">no data</p></figure>'
    vlines = [v for v in vlines if v[0] is not None and math.isfinite(v[0])]
    hlines = [h for h in hlines if h[0] is not None and math.isfinite(h[0]) and h[0] > 0]
    xs = [x for x, _ in pts] + [v[0] for v in vlines]
    log_x = log_x and min(xs) > 0 and max(xs) / min(xs) >= 16
    fx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs))
    if x1 == x0:  # one load: a range around it (relative, so that a huge load still makes a range)
        x0, x1 = x0 - max(1.0, abs(x0) / 4), x1 + max(1.0, abs(x1) / 4)
    # The end points (and a line at an end) clear the frame and the y axis's labels. Halves throughout: a
    # range of figures near the float limit must not overflow to infinity (NaN coordinates).
    pad = (x1 / 2 - x0 / 2) * 0.08
    x0, x1 = max(x0 - pad, -sys.float_info.max), min(x1 + pad, sys.float_info.max)
    top_y = max([y for _, y in pts] + [h[0] for h in hlines])  # a target above every point still shows
    y1 = (top_y * 1.08 if top_y < 1e300 else top_y) or 1.0  # headroom, short of overflowing to infinity
    pw, ph = W - L - R, H - T - B
    drawn = [(name, sorted((x, y) for x, y in ps if y is not None and math.isfinite(y)), colour, dash)
             for name, ps, colour, dash in series]
    drawn = [d for d in drawn if d[1]]
    rows = _legend_rows([(name, colour, dash) for name, _, colour, dash in drawn]
                        + [(label, colour, dash) for _, label, colour, dash in vlines]
                        + [(label, colour, dash) for _, label, colour, dash in hlines], pw)
    top = T + LEGEND_ROW * len(rows)  # the plot's top edge, below the legend
    height = top + ph + B

    def sx(v: float) -> float:
        return L + (fx(v) / 2 - x0 / 2) / (x1 / 2 - x0 / 2) * pw

    def sy(v: float) -> float:
        return top + ph - v / y1 * ph

    out = [f'<figure><svg viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" '
           f'aria-label="{escape(title)}">',
           f'<text x="{W / 2}" y="16" text-anchor="middle" class="t">{escape(title)}</text>']
    for r, row in enumerate(rows):
        y = T + LEGEND_ROW * r + 4
        for x, name, colour, dash in row:
            out.append(f'<g class="legend"><line x1="{L + x:.1f}" x2="{L + x + LEGEND_SWATCH:.1f}" y1="{y - 4}" '
                       f'y2="{y - 4}" stroke="{colour}" stroke-width="2"' + (f' stroke-dasharray="{dash}"' if dash else "")
                       + f'/><text x="{L + x + LEGEND_SWATCH + 4:.1f}" y="{y}" fill="{colour}">{escape(name)}</text></g>')
    out.append(f'<rect x="{L}" y="{top}" width="{pw}" height="{ph}" class="frame"/>')
    for v in _ticks(0, y1):
        if v <= y1:
            out.append(f'<line x1="{L}" x2="{L + pw}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" class="grid"/>'
                       f'<text x="{L - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    xt = sorted({x for x, _ in pts}) if len({x for x, _ in pts}) <= 12 else _ticks(min(xs), max(xs))
    right = -math.inf  # the right end of the last x tick label drawn: the next one must clear it
    for v in xt:
        half = _text_width(_fmt(v)) / 2
        if sx(v) - half < right + 4:
            continue
        right = sx(v) + half
        out.append(f'<text x="{sx(v):.1f}" y="{top + ph + 14}" text-anchor="middle">{_fmt(v)}</text>')
    out.append(f'<text x="{L + pw / 2}" y="{height - 6}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" text-anchor="middle">{escape(ylabel)}</text>')
    at: dict[float, list] = {}  # lines at one load stand side by side, 2 px apart: none hides another
    for v in vlines:
        at.setdefault(round(sx(v[0]), 1), []).append(v)
    for x, same in at.items():
        for k, (_, label, colour, dash) in enumerate(same):
            lx = x + 2 * (k - (len(same) - 1) / 2)
            out.append(f'<line x1="{lx:.1f}" x2="{lx:.1f}" y1="{top}" y2="{top + ph}" stroke="{colour}" '
                       f'stroke-width="1.5" stroke-dasharray="{dash}"><title>{escape(label)}</title></line>')
    for y, label, colour, dash in hlines:
        out.append(f'<line class="target" x1="{L}" x2="{L + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="{colour}" '
                   f'stroke-width="1.5" stroke-dasharray="{dash}"><title>{escape(label)}</title></line>')
    for name, ps, colour, dash in drawn:
        path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(ps))
        out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"><title>{escape(name)}: '
                f'{_fmt(x)} -&gt; {_fmt(y)}</title></circle>' for x, y in ps]
    out.append("</svg></figure>")
    return "".join(out)


CSS = """body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:8px}
figure{margin:0}svg{font:11px system-ui,sans-serif;background:#fff}svg .t{font-weight:600;font-size:13px}
.frame{fill:none;stroke:#999}.grid{stroke:#eee}.warn{color:#a40}.empty{color:#888}code{background:#f5f5f5}"""


PREDICTED_DASH, PREDICTED_DASH_P99 = "2 3", "2 3 8 3"  # predicted series: dotted (p99: dot-dash)


def _pred_ms(p: PointResult, metric: str, key: str) -> float | None:
    v = None if p.predicted_latency is None else p.predicted_latency.stat(metric, key)
    return None if v is None else v * 1000


def _ms(stats: LatencyStats, key: str) -> float | None:
    v = stats.stat(key)
    return None if v is None else v * 1000


@output("html", HTML_FILE, order=30)
def write_html(summary: BenchSummary, store: RunStore) -> str:
    return html_report([summary], ttfts=ttfts_by_point(store))


#: Requests of one point kept for its TTFT distribution: a CDF needs no more, and a crafted requests.jsonl
#: (it is read one line at a time) must not grow the memory without end.
MAX_CDF_REQUESTS = 100_000


def ttfts_by_point(store: RunStore) -> dict[int, list[float]]:
    """Each point's completed requests' TTFTs in seconds, from the scheduled time (requests.jsonl), by point seq."""
    out: dict[int, list[float]] = {}
    for row in store.read_requests():
        seq, first, scheduled = row.get("seq"), row.get("first_token_s"), row.get("scheduled_s")
        if not (row.get("ok") is True and isinstance(seq, int) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (first, scheduled))):
            continue
        kept = out.setdefault(seq, [])
        if len(kept) < MAX_CDF_REQUESTS:
            kept.append(first - scheduled)
    return out


#: The shares of requests at which a CDF is drawn (%): every 5%, and the tail.
CDF_SHARES = (*range(0, 100, 5), 99, 100)


def _ttft_cdf(s: BenchSummary, ttfts: dict[int, list[float]]) -> str:
    """The TTFT distribution of every point of a run, one line per load: the share of its requests whose first token
    came within x ms."""
    series = []
    for k, p in enumerate(p for p in s.points if len(ttfts.get(p.seq, ())) >= 2):
        values = ttfts[p.seq]
        pts = [(1000 * percentile(values, share), float(share)) for share in CDF_SHARES]
        series.append((_where(p), pts, COLOURS[k % len(COLOURS)], "" if k < len(COLOURS) else "6 3"))
    if not series:
        return ""
    return chart("TTFT distribution by load", "TTFT ms (from the scheduled time)", "% of the point's requests", series)


def html_report(summaries: list[BenchSummary], title: str | None = None,
                ttfts: dict[int, list[float]] | None = None) -> str:
    """The report of one run, or the comparison of several (each run one colour); ``ttfts``: a single run's TTFTs by
    point (requests.jsonl), for its distribution by load."""
    runs = list(summaries)
    many = len(runs) > 1
    modes = {s.load_mode for s in runs}
    title = title or (f"kvplan bench: {runs[0].model}" if not many else f"kvplan: {len(runs)} runs compared")
    body = [f"<h1>{escape(title)}</h1>"]
    body.append("<table><tr><th>run</th><th>source</th><th>model</th><th>workload</th><th>load</th><th>status</th>"
                "<th>first KV wait<br>predicted / measured</th><th>first preemption<br>predicted / measured</th>"
                "<th>SLOs</th><th>highest load meeting SLOs</th></tr>")
    for i, s in enumerate(runs):
        pred = s.prediction
        slo = s.slo

        def onset(key, s=s, pred=pred):
            m = s.measured.onset(key)
            meas = "-" if m is None else onset_text(m)
            p = (pred.none_text if pred.onset(key) is None else str(pred.onset(key))) if pred else "-"
            return escape(f"{p} / {meas}")

        best = s.highest_load_meeting_slo
        body.append(
            f'<tr><td style="color:{COLOURS[i % len(COLOURS)]}">{escape(_run_name(s, i))}</td>'
            f"<td>{escape(s.source)}</td><td>{escape(s.model)}</td><td>{escape(s.workload)}</td>"
            f"<td>{escape(s.load_description or s.load_mode)}</td>"
            f"<td>{escape(s.status)}</td><td>{onset('first_kv_wait')}</td><td>{onset('first_preemption')}</td>"
            f"<td>{escape(describe_slo(slo)) if slo else '-'}</td><td>{'-' if best is None else _fmt(best)}</td></tr>")
    body.append("</table>")
    for i, s in enumerate(runs):  # waits for the token budget, which the waiting gauge counts as it counts KV waits
        budget = budget_wait_text(s)
        if budget:
            body.append(f"<p>{escape(_run_name(s, i) + ': ' if many else '')}{escape(budget[0].upper() + budget[1:])}."
                        "</p>")

    vlines = []  # the onsets of a concurrency sweep, predicted (dashed) and measured (dotted)
    if not many and modes == {"concurrency"}:
        pred = runs[0].prediction
        measured = runs[0].measured
        for key, what, colour in (("first_kv_wait", "KV wait", ONSET_COLOURS[0]),
                                  ("first_preemption", "preemption", ONSET_COLOURS[1])):
            level = pred.onset(key) if pred is not None else None
            if level:
                vlines.append((level, f"predicted {what} {level}", colour, "6 4"))
            m = measured.onset(key)
            if m is not None and m.first:
                vlines.append((m.first, f"measured {what} {onset_text(m)}", colour, "2 2"))
    if len(modes) == 1:
        xlabel = "request rate (req/s)" if modes == {"rate"} else "concurrent streams"
        body.append('<div class="charts">' + "".join(_load_charts(runs, list(range(len(runs))), xlabel, vlines))
                    + "</div>")
    else:  # streams and requests/s are not one axis: the runs of each kind of load get their own charts
        for mode, xlabel, heading in (("concurrency", "concurrent streams", "Runs by concurrency"),
                                      ("rate", "request rate (req/s)", "Runs by request rate")):
            chosen = [i for i, r in enumerate(runs) if r.load_mode == mode]
            if chosen:
                body.append(f"<h2>{heading}</h2>")
                body.append('<div class="charts">' + "".join(_load_charts(runs, chosen, xlabel, [])) + "</div>")
    if not many:
        timeline = _timeline_charts(runs[0])
        if timeline:
            body.append("<h2>Over time</h2><p>The server's own figures, scraped during every point, the points laid end "
                        "to end in the order they ran; dashed lines mark where the point of each measured onset "
                        "began.</p>")
            body.append('<div class="charts">' + "".join(timeline) + "</div>")
        cdf = _ttft_cdf(runs[0], ttfts or {})
        if cdf:
            body.append("<h2>Latency distribution</h2>")
            body.append(f'<div class="charts">{cdf}</div>')

    for i, s in enumerate(runs):
        body.append(f"<h2>{escape(_run_name(s, i))}: points</h2>")
        body.append(_capacity_table(s))
        body.append(_points_table(s))
        body.append(_replay_table(s))
        body.append(_tier_table(s))
        body.append(_gpu_table(s))
        body.append(_latency_table(s))
        if s.rate_search is not None:
            body.append(f"<p>Automatic rate search: {escape(s.rate_search.describe())}.</p>")
        if s.headers:  # names with masked values: the values are never stored
            body.append(f"<p>Request headers: {escape(', '.join(s.headers))} (values never stored).</p>")
        if s.proxy:
            body.append(f"<p>Proxy (from the environment): {escape(s.proxy)}.</p>")
        if s.prometheus:
            body.append(f"<p>Server figures: {escape(s.prometheus.describe())}.</p>")
        if s.tls:
            body.append(f'<p class="{"warn" if s.tls.startswith("NOT") else ""}">TLS: {escape(s.tls)}.</p>')
    body.append(f"<p>{escape(DEFINITIONS)}</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _replay_table(s: BenchSummary) -> str:
    """A --traffic run's prefix cache per point: the engine's hit rate beside the prediction."""
    rows = [p for p in s.points if p.replay is not None]
    if not rows:
        return ""

    def pct(x) -> str:
        return "-" if x is None else f"{x:.1%}"

    head = ["sessions", "requests", "queried tokens", "hits measured", "hits predicted", "predicted range",
            "preempts (predicted)", "predicted by"]
    out = ['<table class="replay"><caption>prefix cache: measured / predicted</caption><tr>'
           + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    for p in rows:
        r = p.replay
        want = {True: "yes", False: "no", None: "timing-dependent"}[r.predicted_preemption]
        cells = [str(r.sessions), str(r.requests), "-" if r.prefix_queries is None else f"{r.prefix_queries:,.0f}",
                 pct(r.hit_rate), pct(r.predicted_hit_rate), f"{pct(r.predicted_hit_rate_low)} - {pct(r.predicted_hit_rate_high)}",
                 f"{'yes' if p.preempted else 'no'} ({want})", r.predicted_by]
        out.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _plain_table(css_class: str, caption: str, head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A captioned table of text cells (escaped); nothing without rows."""
    if not rows:
        return ""
    return (f'<table class="{css_class}"><caption>{escape(caption, quote=False)}</caption><tr>'
            + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


def _gpu_table(s: BenchSummary) -> str:
    """The GPUs during each point, where --gpu-metrics sampled them."""
    return _plain_table("gpu", "GPUs (--gpu-metrics)", GPU_HEAD, gpu_rows(s.points))


def _tier_table(s: BenchSummary) -> str:
    """The KV tier's counters per point, where the server declares a KV connector's."""
    return _plain_table("tier", "KV tier (the engine's connector counters)", TIER_HEAD, tier_rows(s.points))


def _latency_table(s: BenchSummary) -> str:
    """Predicted / measured latency and throughput per point, and the step-time model's source."""
    text = latency_model_text(s)
    if text is None:
        return ""
    out = [f"<p>{escape(text)}</p>"]
    rows = [(p, predicted_cells(p)) for p in s.points]
    rows = [(p, c) for p, c in rows if c is not None]
    if rows:
        head = ["rate req/s" if s.rate_mode else "concurrency"] + [f"{h} ms" for _, _, h in PREDICTED_FIGURES] + [
            "output tok/s"]
        out.append('<table class="predicted"><caption>predicted / measured</caption><tr>'
                   + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>")
        for p, cells in rows:
            load = _fmt(p.rate) if p.mode == "rate" and p.rate is not None else str(p.concurrency)
            out.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in [load] + cells) + "</tr>")
        out.append("</table>")
    return "".join(out)


SLO_COLOUR, SLO_DASH = "#6a3d9a", "10 3 2 3"


def _load_charts(runs: list[BenchSummary], chosen: list[int], xlabel: str,
                 vlines: list[tuple[float, str, str, str]]) -> list[str]:
    """The figures against the load of the runs ``chosen`` (indices into ``runs``: a run keeps its colour)."""
    many = len(runs) > 1

    def series(metric_get, name_suffix: str, dash: str = "", only_ok: bool = True):
        out = []
        for i in chosen:
            s = runs[i]
            pts = [(p.load, metric_get(p)) for p in s.points if (p.status == "ok" or not only_ok)]
            name = (f"{_run_name(s, i)} " if many else "") + name_suffix
            out.append((name, [(x, y) for x, y in pts if y is not None], COLOURS[i % len(COLOURS)], dash))
        return out

    subset = [runs[i] for i in chosen]
    charts = []
    for metric, name in (("ttft", "TTFT"), ("itl", "ITL per token"), ("e2e", "E2E")):
        charts.append(chart(f"{name} vs load (ms)", xlabel, "ms",
                            series(lambda p, m=metric: _ms(getattr(p, m), "p50"), "p50")
                            + series(lambda p, m=metric: _ms(getattr(p, m), "p99"), "p99", "6 3")
                            + series(lambda p, m=metric: _pred_ms(p, m, "p50"), "p50 predicted", PREDICTED_DASH)
                            + series(lambda p, m=metric: _pred_ms(p, m, "p99"), "p99 predicted", PREDICTED_DASH_P99),
                            vlines if metric == "ttft" else [], log_x=True, hlines=_slo_lines(subset, metric)))
    charts.append(chart("Throughput and goodput vs load (output tok/s)", xlabel, "tok/s",
                        series(lambda p: p.throughput_tok_s, "throughput")
                        + series(lambda p: p.goodput_tok_s, "goodput", "6 3")
                        + series(lambda p: None if p.predicted_latency is None
                                 else p.predicted_latency.output_tokens_per_s, "throughput predicted",
                                 PREDICTED_DASH), log_x=True))
    charts.append(chart("KV cache fill vs load (%)", xlabel, "% of the pool",
                        series(lambda p: None if p.server.peak_kv_usage is None
                               else 100 * p.server.peak_kv_usage, "measured peak")
                        + series(lambda p: None if p.predicted is None else 100 * p.predicted.kv_fill,
                                 "predicted", "6 3"), vlines, log_x=True))
    charts.append(chart("Preemptions vs load", xlabel, "preemptions in the point",
                        series(lambda p: p.server.preemptions, "preemptions"), vlines, log_x=True))
    return charts


def _timeline_charts(s: BenchSummary) -> list[str]:
    """KV usage, running and waiting requests, and preemptions over the run's time: each point's scraped series
    (`ServerFigures.series`: seconds into the point, running, waiting, KV usage, preemptions since the point began),
    the points end to end; the start of each measured onset's point marked. Empty without a scraped series."""
    kv, running, waiting, preempted = [], [], [], []
    starts: dict[float, float] = {}  # a point's load -> when it began on the run's clock
    clock = total = 0.0
    for p in s.points:
        starts.setdefault(p.load, clock)
        last = 0.0
        for t, run, wait, usage, pre in p.server.series:
            kv.append((clock + t, 100 * usage))
            running.append((clock + t, run))
            waiting.append((clock + t, wait))
            preempted.append((clock + t, total + pre))
            last = pre
        total += last
        clock += p.wall_s or (p.server.series[-1][0] if p.server.series else 0.0)
    if len(kv) < 2:
        return []
    marks = []
    for key, what, colour in (("first_kv_wait", "KV wait", ONSET_COLOURS[0]),
                              ("first_preemption", "preemption", ONSET_COLOURS[1])):
        m = s.measured.onset(key)
        if m is not None and m.first in starts:
            marks.append((starts[m.first], f"measured {what} {onset_text(m)} begins", colour, "6 4"))
    x = "seconds into the run"
    return [chart("KV cache usage over time (%)", x, "% of the pool", [("KV usage", kv, COLOURS[0], "")], marks),
            chart("Requests over time", x, "requests", [("running", running, COLOURS[0], ""),
                                                         ("waiting", waiting, COLOURS[1], "6 3")], marks),
            chart("Preemptions over time (run total)", x, "preemptions", [("preemptions", preempted, COLOURS[0], "")],
                  marks)]


def _slo_lines(runs: list[BenchSummary], metric: str) -> list[tuple[float, str, str, str]]:
    """The runs' SLO targets on ``metric`` as horizontal lines, in ms (one per distinct target)."""
    targets = {}
    for s in runs:
        for key, seconds in (s.slo or {}).items():
            name, _, stat = key.rpartition("_")
            if name == metric and isinstance(seconds, (int, float)) and math.isfinite(seconds):
                targets[(stat, float(seconds))] = f"SLO {metric} {stat} <= {_fmt(seconds * 1000)} ms"
    return [(seconds * 1000, label, SLO_COLOUR, SLO_DASH) for (_, seconds), label in sorted(targets.items())]


def _capacity_table(s: BenchSummary) -> str:
    """The KV pool the planner predicts for the bench's engine flags beside the one the engine reports."""
    cap, planner = s.capacity, s.planner

    def cell(v) -> str:
        return "-" if v is None else escape(f"{v:,}" if isinstance(v, int) else str(v))

    rows = [("blocks", planner.num_blocks if planner else None, cap.num_blocks),
            ("block size (tokens)", planner.block_size if planner else None, cap.block_size),
            ("KV cache tokens", planner.kv_cache_tokens if planner else None, cap.kv_cache_tokens)]
    if not any(p is not None or e is not None for _, p, e in rows):
        return ""
    head = (f"planner ({escape(planner.vllm_version)} rules)" if planner and planner.vllm_version else "planner")
    out = [f'<table class="capacity"><caption>KV capacity: planner vs engine</caption><tr><th></th><th>{head}</th>'
           f"<th>engine reports ({escape(cap.source or 'nothing')})</th></tr>"]
    out += [f"<tr><td>{escape(name)}</td><td>{cell(p)}</td><td>{cell(e)}</td></tr>" for name, p, e in rows]
    if planner and planner.error:
        out.append(f'<tr><td colspan="3" class="warn">planner: {escape(planner.error)}</td></tr>')
    return "".join(out) + "</table>"


def _run_name(s: BenchSummary, i: int) -> str:
    from pathlib import PurePath

    name = PurePath(s.run_dir or f"run {i + 1}").name
    return name or f"run {i + 1}"


def _points_table(s: BenchSummary) -> str:
    rate = s.rate_mode
    slo = bool(s.slo)
    head = (["rate req/s", "peak in flight"] if rate else ["concurrency"]) + [
        "measured (predicted)", "preemptions", "KV peak", "TTFT p50 / p99 ms [p99 95% CI] (n)",
        "ITL p50 / p99 ms [p99 95% CI] (n)", "E2E p50 / p99 ms [p99 95% CI] (n)", "send lag p99 ms", "tok/s", "req/s",
        "ok"] + (["SLOs", "goodput req/s"] if slo else [])
    rows = ["<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]

    def pair(stats: LatencyStats) -> str:
        if stats.p50 is None or stats.p99 is None:
            return "-"
        n = stats.count
        warn = n < 100
        ci = ""
        if stats.p99_ci is not None:
            low, high = (("?" if v is None else f"{v * 1000:.1f}") for v in stats.p99_ci)
            ci = f" [{low}-{high}]"
        text = f"{stats.p50 * 1000:.1f} / {stats.p99 * 1000:.1f}{ci} ({n})"
        return f'<span class="warn" title="p99 from fewer than 100 samples">{text}!</span>' if warn else text

    for p in s.points:
        srv = p.server
        pred = None if p.predicted is None else p.predicted.label
        cells = ([_fmt(p.rate), str(p.concurrency)] if rate else [str(p.concurrency)]) + [
            escape(p.label + (f" ({pred})" if pred else "")), "-" if srv.preemptions is None else f"{srv.preemptions:.0f}",
            "-" if srv.peak_kv_usage is None else f"{srv.peak_kv_usage:.0%}",
            pair(p.ttft), pair(p.itl), pair(p.e2e),
            "-" if p.send_lag.p99 is None else f"{p.send_lag.p99 * 1000:.1f}",
            "-" if p.throughput_tok_s is None else f"{p.throughput_tok_s:,.0f}",
            "-" if p.request_throughput is None else f"{p.request_throughput:.2f}",
            f"{p.requests_ok}/{p.requests}"]
        if slo:
            cells += ["-" if p.slo_met is None else ("met" if p.slo_met else "missed"),
                      "-" if p.goodput_req_s is None else f"{p.goodput_req_s:.2f}"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    rows.append("</table>")
    rows.append(_warning_list(s.points))
    return "".join(rows)


def _warning_list(points: list[PointResult]) -> str:
    """One list of the points' warnings: a warning that repeats from point to point with other figures (a p99 on
    too few samples at every load) is one entry naming its points, not one line per point."""
    groups: dict[str, list[tuple[PointResult, str]]] = {}
    for p in points:
        for w in p.warnings:
            groups.setdefault(re.sub(r"\d[\d,.]*", "#", w), []).append((p, w))
    if not groups:
        return ""
    items = []
    for found in groups.values():
        first = found[0][1]
        where = ", ".join(_where(p) for p, _ in found)
        more = f" (and {len(found) - 1} more like it, with their own figures)" if len(found) > 1 else ""
        items.append(f"<li>{escape(first)}{more}: at {escape(where)}</li>")
    return '<ul class="warn">' + "".join(items) + "</ul>"


def _where(p: PointResult) -> str:
    return f"{p.rate:g} req/s" if p.mode == "rate" else f"concurrency {p.concurrency}"
