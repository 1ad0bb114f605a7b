"""The run's results, written offline: summary.json, report.md, points.csv, requests.csv, report.html
(self-contained: inline SVG charts, no network) and plot.png (matplotlib Agg, when installed)."""

from __future__ import annotations

import json
from typing import Any

from kvplan.bench import store as st
from kvplan.bench.results import BenchSummary, LatencyStats, PlannerCapacity, PointResult
from kvplan.bench.sweep import Onset
from kvplan.units import format_ms


def write_reports(store: st.RunStore, summary: BenchSummary) -> None:
    """Write the summary JSON, the Markdown report and the plot (the plot only with matplotlib)."""
    from kvplan.bench.html import html_report

    store.write_text(st.SUMMARY_FILE, summary.model_dump_json(indent=2) + "\n")
    store.write_text(st.REPORT_FILE, markdown(summary))
    store.write_text(POINTS_CSV, points_csv(summary.points))
    store.write_text(REQUESTS_CSV, requests_csv(store.read_requests()))
    store.write_text(HTML_FILE, html_report([summary]))
    try:
        png = plot_png(summary)
    except ImportError:
        png = None
    if png is not None:
        from kvplan.paths import write_file_safely

        write_file_safely(store.path / st.PLOT_FILE, png)


POINTS_CSV = "points.csv"
REQUESTS_CSV = "requests.csv"
HTML_FILE = "report.html"

_STAT_KEYS = ("n", "mean", "p50", "p90", "p95", "p99")


def points_csv(points: list[PointResult]) -> str:
    """One row per point; latencies in ms, with the sample count of each metric."""
    import io

    from kvplan.cli.common import csv_writer

    head = ["seq", "mode", "concurrency", "rate", "burstiness", "max_concurrency", "status", "label", "latency_from",
            "wall_s", "requests", "requests_ok", "requests_failed", "output_tokens", "output_tok_s", "request_s",
            "preemptions", "peak_waiting", "peak_running", "peak_kv_usage", "predicted_label", "predicted_kv_fill",
            "slo_met", "goodput_share", "goodput_req_s", "goodput_tok_s", "retries"]
    for metric in ("ttft", "itl", "tpot", "e2e", "send_lag"):
        head += [f"{metric}_n"] + [f"{metric}_{k}_ms" for k in _STAT_KEYS[1:]]
    head += ["warnings", "error", "predicted_source"]
    head += [f"predicted_{m}_{k}_ms" for m in ("ttft", "itl", "tpot", "e2e") for k in ("p50", "p99")]
    head += ["predicted_output_tok_s"]
    head += [f"replay_{k}" for k in REPLAY_CSV_KEYS]  # --traffic points (kvplan.bench.replay); empty otherwise
    buf = io.StringIO()
    w = csv_writer(buf)
    w.writerow(head)
    for p in points:
        srv, pred = p.server, p.predicted
        row = [p.seq, p.mode, p.concurrency, p.rate, p.burstiness, p.max_concurrency, p.status, p.label, p.latency_from,
               p.wall_s, p.requests, p.requests_ok, p.requests_failed, p.output_tokens, p.throughput_tok_s,
               p.request_throughput, srv.preemptions, srv.peak_waiting, srv.peak_running, srv.peak_kv_usage,
               None if pred is None else pred.label, None if pred is None else pred.kv_fill, p.slo_met, p.goodput_share,
               p.goodput_req_s, p.goodput_tok_s, p.retries]
        for metric in ("ttft", "itl", "tpot", "e2e", "send_lag"):
            stats: LatencyStats = getattr(p, metric)
            row.append(stats.n)
            row += [None if stats.stat(k) is None else round(stats.stat(k) * 1000, 3) for k in _STAT_KEYS[1:]]
        row += ["; ".join(p.warnings), p.error]
        lat = p.predicted_latency
        row.append(None if lat is None else lat.source)
        for m in ("ttft", "itl", "tpot", "e2e"):
            for k in ("p50", "p99"):
                v = None if lat is None else lat.stat(m, k)
                row.append(None if v is None else round(v * 1000, 3))
        row.append(None if lat is None else lat.output_tokens_per_s)
        row += [None if p.replay is None else getattr(p.replay, k) for k in REPLAY_CSV_KEYS]
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


REPLAY_CSV_KEYS = ("sessions", "prefix_queries", "prefix_hits", "hit_rate", "predicted_hit_rate",
                   "predicted_hit_rate_low", "predicted_hit_rate_high", "predicted_preemption", "predicted_by")


def replay_markdown(points: list[PointResult]) -> list[str]:
    """The prefix-cache table of a --traffic run (measured by the engine's counters, predicted beside)."""
    rows = [p for p in points if p.replay is not None]
    if not rows:
        return []

    def pct(x):
        return "-" if x is None else f"{x:.1%}"

    lines = ["", "## Prefix cache (traffic replay)", "",
             "| sessions | requests | queried tokens | hits measured | predicted | predicted range | preempts "
             "(predicted) | predicted by |", "|---:|---:|---:|---:|---:|---:|---|---|"]
    for p in rows:
        r = p.replay
        want = {True: "yes", False: "no", None: "timing-dependent"}[r.predicted_preemption]
        lines.append(f"| {r.sessions} | {r.requests} | {_num(r.prefix_queries)} | {pct(r.hit_rate)} | "
                     f"{pct(r.predicted_hit_rate)} | {pct(r.predicted_hit_rate_low)}-{pct(r.predicted_hit_rate_high)} | "
                     f"{'yes' if p.preempted else 'no'} ({want}) | {r.predicted_by} |")
    return lines


def requests_csv(rows: list[dict]) -> str:
    """One row per request (requests.jsonl): scheduled and actual send times, TTFT/E2E from the scheduled
    time, mean ITL per token, tokens."""
    import io

    from kvplan.bench.loadgen import RequestRecord
    from kvplan.cli.common import csv_writer

    head = ["seq", "concurrency", "rate", "index", "stream", "ok", "scheduled_s", "sent_s", "send_lag_ms",
            "first_token_s", "end_s", "ttft_ms", "e2e_ms", "tpot_ms", "itl_mean_ms", "deliveries", "prompt_tokens",
            "output_tokens", "retries", "error"]
    buf = io.StringIO()
    w = csv_writer(buf)
    w.writerow(head)
    for row in rows:
        try:
            rec = RequestRecord(int(row["index"]), int(row["stream"]), float(row["scheduled_s"]),
                                float(row.get("sent_s") or 0.0), row.get("first_token_s"), row.get("end_s"),
                                [float(t) for t in row.get("chunk_times_s") or []],
                                [int(k) for k in row.get("chunk_tokens") or []], row.get("prompt_tokens"),
                                int(row.get("output_tokens") or 0), int(row.get("max_tokens") or 0), bool(row.get("ok")),
                                row.get("error"))
        except (KeyError, TypeError, ValueError):
            continue  # not a line kvplan wrote
        itl = rec.itl_s

        def ms(v):
            return "" if v is None else round(v * 1000, 3)

        w.writerow([row.get("seq", ""), row.get("concurrency", ""), row.get("rate", ""), rec.index, rec.stream, rec.ok,
                    round(rec.scheduled_s, 6), round(rec.sent_s, 6), ms(rec.sent_s - rec.scheduled_s if rec.sent_s else None),
                    "" if rec.first_token_s is None else rec.first_token_s, "" if rec.end_s is None else rec.end_s,
                    ms(rec.ttft_s), ms(rec.e2e_s), ms(rec.tpot_s), ms(sum(itl) / len(itl) if itl else None),
                    len(rec.chunk_times_s), "" if rec.prompt_tokens is None else rec.prompt_tokens, rec.output_tokens,
                    row.get("retries", 0), rec.error or ""])
    return buf.getvalue()




def _num(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    return format(value, fmt)


def onset_text(onset: Onset) -> str:
    """A measured onset: its level ("<= level" when the level below it was not measured), or how far none was seen."""
    if onset.first is None:
        return f"none up to {onset.searched_up_to}"
    return str(onset.first) if onset.exact else f"<= {onset.first}"


def _onset_cell(measured: Onset | None, predicted: int | None, has_prediction: bool) -> str:
    if measured is None:
        return "not searched"
    first = measured.first
    text = onset_text(measured)
    if has_prediction:
        text += " (agrees)" if first == predicted else " (differs)"
    return text


def markdown(summary: BenchSummary) -> str:
    """The report: capacity and onsets predicted vs measured, then one row per point."""
    s = summary
    pred = s.prediction
    cap = s.capacity
    planner = s.planner or PlannerCapacity()
    lines = [f"# kvplan bench: {s.model}", ""]
    lines.append(f"- workload: {s.workload}")
    if s.engine_command:
        lines.append(f"- engine: `{s.engine_command}`")
    else:
        lines.append(f"- server: {s.base_url} (attached)")
    if s.headers:
        lines.append(f"- request headers: {', '.join(s.headers)} (values never stored)")
    if s.proxy:
        lines.append(f"- proxy: {s.proxy} (from the environment; every request, probe and scrape went through it)")
    lines.append(f"- status: {s.status}" + (f" ({s.error})" if s.error and s.status != "complete" else ""))
    lines += ["", "## KV capacity", "", "| | planner | engine reports |", "|---|---:|---:|"]
    lines.append(f"| blocks (incl. the null block) | {_num(planner.num_blocks)} | {_num(cap.num_blocks)} |")
    lines.append(f"| block size | {_num(planner.block_size)} | {_num(cap.block_size)} |")
    lines.append(f"| KV cache tokens | {_num(planner.kv_cache_tokens)} | {_num(cap.kv_cache_tokens)} |")
    if planner.error:
        lines += ["", f"Planner: {planner.error}"]
    lines += ["", f"Capacity read from: {cap.source or 'nothing (no log line, no cache_config_info)'}."]
    lines += ["", "## Onsets", "", "| onset | predicted (block rule) | measured |", "|---|---:|---|"]
    for key, name in (("first_kv_wait", "first concurrency that waits for KV"),
                      ("first_preemption", "first concurrency with preemptions")):
        p = pred.onset(key) if pred else None
        p_text = ("never" if p is None else str(p)) if pred else "-"
        lines.append(f"| {name} | {p_text} | {_onset_cell(s.measured.onset(key), p, pred is not None)} |")
    if pred:
        lines += ["", (
            f"Block rule on the engine's pool: {pred.num_blocks} blocks of {pred.block_size} "
            f"({pred.usable_blocks} usable); a request is admitted with {pred.admit_blocks} free blocks "
            f"and peaks at {pred.peak_blocks}"
            + ("" if pred.exact else " (approximate: requests are not identical; mean lengths used)")
            + "."
        )]
    rate_mode = s.rate_mode
    slo = s.slo
    lines += replay_markdown(s.points)
    lines += ["", "## Points", ""]
    if s.load_description:
        lines += [f"Load: {s.load_description}.", ""]
    cols = (["rate req/s", "peak in flight"] if rate_mode else ["concurrency"]) + [
        "predicted", "measured", "preemptions", "peak waiting", "KV fill predicted", "KV peak measured",
        "TTFT p50 ms", "TTFT p99 ms (n)", "ITL p50 ms", "ITL p99 ms (n)", "TPOT p50 ms", "E2E p99 ms (n)",
        "output tok/s", "req/s", "requests ok"]
    if slo:
        cols += ["meets SLOs", "goodput req/s", "goodput tok/s"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    for pt in s.points:
        srv, predicted = pt.server, pt.predicted
        kv_pred = None if predicted is None else predicted.kv_fill
        kv_meas = srv.peak_kv_usage
        load = [f"{pt.rate:g}", str(pt.concurrency)] if rate_mode else [str(pt.concurrency)]
        cells = load + [
            "-" if predicted is None else predicted.label, pt.label, _num(_int(srv.preemptions)),
            _num(_int(srv.peak_waiting)),
            "-" if kv_pred is None else f"{kv_pred:.0%}", "-" if kv_meas is None else f"{kv_meas:.0%}",
            format_ms(pt.ttft.p50), _pn(pt.ttft), format_ms(pt.itl.p50), _pn(pt.itl), format_ms(pt.tpot.p50),
            _pn(pt.e2e), _num(pt.throughput_tok_s, ",.0f"), _num(pt.request_throughput, ",.2f"),
            f"{pt.requests_ok}/{pt.requests}"]
        if slo:
            cells += ["-" if pt.slo_met is None else ("yes" if pt.slo_met else "no"),
                      _num(pt.goodput_req_s, ",.2f"), _num(pt.goodput_tok_s, ",.0f")]
        lines.append("| " + " | ".join(cells) + " |")
    if slo:
        from kvplan.bench.slo import describe_slo

        best = s.highest_load_meeting_slo
        unit = "requests/s" if rate_mode else "concurrent streams"
        lines += ["", f"SLOs: {describe_slo(slo)}. Highest load meeting them: "
                  + (f"{best:g} {unit}." if best is not None else "none of the measured loads.")
                  + " Goodput counts requests meeting every SLO on their own (TTFT, TPOT, E2E, and the request's own "
                  "ITL percentile)."]
        search = s.rate_search
        if search is not None:
            lines += ["", f"Automatic rate search: {search.describe()}."]
    lines += latency_markdown(s)
    for pt in s.points:
        where = f"{pt.rate:g} requests/s" if pt.mode == "rate" else f"concurrency {pt.concurrency}"
        for note in pt.notes:
            lines.append(f"\n{where[0].upper() + where[1:]}: {note}.")
        for warning in pt.warnings:
            lines.append(f"\n**Warning** ({where}): {warning}.")
    failed = [pt for pt in s.points if pt.status != "ok"]
    for pt in failed:
        where = f"{pt.rate:g} requests/s" if pt.mode == "rate" else f"concurrency {pt.concurrency}"
        lines.append(f"\nPoint at {where} "
                     f"failed: {pt.error}")
    lines += ["", DEFINITIONS, ""]
    return "\n".join(lines)


DEFINITIONS = (
    "Latencies count from each request's scheduled time (closed loop: the point's start, then the end of the "
    "stream's previous request; open loop: its drawn arrival time), not from when it was actually sent; the "
    "actual send time is recorded too (requests.csv, send_lag in points.csv). TTFT = first output delivery; "
    "ITL = per output token (the gap between deliveries divided by the tokens the later one carried); "
    "TPOT = (E2E - TTFT) / (output tokens - 1); output tok/s and req/s count completed requests over the "
    "point's wall time. (n) = samples behind the percentile; a p99 needs >= 100.")


#: The predicted figures shown next to the measured ones: (metric, statistic, heading).
PREDICTED_FIGURES = (("ttft", "p50", "TTFT p50"), ("ttft", "p99", "TTFT p99"), ("itl", "p50", "ITL p50"),
                     ("itl", "p99", "ITL p99"), ("e2e", "p50", "E2E p50"), ("e2e", "p99", "E2E p99"))


def latency_model_text(summary: BenchSummary) -> str | None:
    """Which step-time model predicted the points' latency, or why none did (None: an older run)."""
    info = summary.latency_model
    if info is None:
        return None
    if info.source == "none":
        return f"Latency not predicted: {info.basis}."
    return (f"Latency predicted by the scheduler simulator on the engine's pool, each point's own load, "
            f"step times {info.source} ({info.basis}).")


def predicted_cells(p: PointResult) -> list[str] | None:
    """'predicted / measured' per PREDICTED_FIGURES (ms), then output tok/s; None: no prediction."""
    pred = p.predicted_latency
    if pred is None:
        return None
    if pred.error:
        return [f"- ({pred.error})"] + ["-"] * len(PREDICTED_FIGURES)
    cells = [f"{_short_ms(pred.stat(m, k))} / {_short_ms(getattr(p, m).stat(k))}" for m, k, _ in PREDICTED_FIGURES]
    return cells + [f"{_num(pred.output_tokens_per_s, ',.0f')} / {_num(p.throughput_tok_s, ',.0f')}"]


def _short_ms(seconds: float | None) -> str:
    """Milliseconds to the unit from 10 ms up, to a tenth below (a 0.4 ms ITL is not "0")."""
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:,.0f}" if ms >= 10 else f"{ms:.1f}"


def _load_text(p: PointResult) -> str:
    return f"{p.rate:g}" if p.mode == "rate" else str(p.concurrency)


def latency_markdown(summary: BenchSummary) -> list[str]:
    """report.md's "Latency: predicted / measured" section (nothing for a run that predicted none)."""
    text = latency_model_text(summary)
    if text is None:
        return []
    lines = ["", "## Latency: predicted / measured", "", text]
    rows = [(p, predicted_cells(p)) for p in summary.points]
    rows = [(p, c) for p, c in rows if c is not None]
    if not rows:
        return lines
    load = "rate req/s" if summary.rate_mode else "concurrency"
    cols = [load] + [f"{h} ms" for _, _, h in PREDICTED_FIGURES] + ["output tok/s"]
    lines += ["", "Each cell: predicted / measured.", "", "| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join([_load_text(p)] + cells) + " |" for p, cells in rows]
    bounded = [p for p, _ in rows if (p.predicted_latency.simulated_requests or p.requests) < p.requests]
    if bounded:
        lines += ["", "Simulated on fewer requests than sent (bounded to keep the simulation short): " + ", ".join(
            f"{_load_text(p)}: {p.predicted_latency.simulated_requests} of {p.requests}" for p in bounded) + "."]
    return lines


def latency_lines(summary: BenchSummary) -> list[str]:
    """The terminal's predicted-vs-measured table, plain text within 80 columns: two rows per point
    (pred, meas), milliseconds and output tok/s; with the model's source above. [] for older runs."""
    import textwrap

    text = latency_model_text(summary)
    if text is None:
        return []
    out = textwrap.wrap(text, 80, break_on_hyphens=False)
    points = [p for p in summary.points if p.predicted_latency is not None]
    if not points:
        return out
    load = "req/s" if summary.rate_mode else "c"
    out.append(f"{load:>6}      " + "".join(f"{h:>9}" for _, _, h in PREDICTED_FIGURES) + f"{'tok/s':>9}")
    for p in points:
        pred = p.predicted_latency
        if pred.error:
            out.append(f"{_load_text(p):>6}  pred  not simulated: {pred.error}"[:80])
            continue
        out.append(f"{_load_text(p):>6}  pred" + "".join(f"{_short_ms(pred.stat(m, k)):>9}" for m, k, _ in
                                                       PREDICTED_FIGURES) + f"{_num(pred.output_tokens_per_s, ',.0f'):>9}")
        out.append(f"{'':>6}  meas" + "".join(f"{_short_ms(getattr(p, m).stat(k)):>9}" for m, k, _ in
                                             PREDICTED_FIGURES) + f"{_num(p.throughput_tok_s, ',.0f'):>9}")
    return out


def _pn(stats: LatencyStats) -> str:
    """'812.3 (97)': the p99 and its sample count, '!' when too few samples carry it."""
    from kvplan.bench.stats import min_samples

    value = stats.p99
    if value is None:
        return "-"
    n = stats.count
    return f"{value * 1000:.1f} ({n}{'!' if n < min_samples(99) else ''})"


def _int(value: Any) -> int | None:
    return None if value is None else int(round(value))


def plot_png(summary: BenchSummary) -> bytes | None:
    """TTFT p50/p99 and preemptions vs concurrency, the predicted onsets drawn in."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in summary.points if p.status == "ok" and p.ttft.p50 is not None and p.ttft.p99 is not None]
    if not points:
        return None
    xs = [p.concurrency for p in points]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    log_x = max(xs) / max(1, min(xs)) >= 16
    ax2 = ax.twinx()
    ax.set_zorder(ax2.get_zorder() + 1)  # the lines over the bars
    ax.patch.set_visible(False)
    pre = [p.server.preemptions or 0 for p in points]
    widths = [0.08 * x for x in xs] if log_x else [0.4] * len(xs)
    ax2.bar(xs, pre, width=widths, alpha=0.3, color="tab:red", label="preemptions")
    ax2.set_ylabel("preemptions in the point")
    ax.plot(xs, [p.ttft.p50 * 1000 for p in points], "o-", label="TTFT p50")
    ax.plot(xs, [p.ttft.p99 * 1000 for p in points], "s-", label="TTFT p99")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("TTFT (ms)")
    if log_x:
        from matplotlib.ticker import ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xticks(xs)
        ax.tick_params(axis="x", labelsize=8)
    pred = summary.prediction
    if pred is not None and pred.first_kv_wait:
        ax.axvline(pred.first_kv_wait, color="tab:orange", linestyle="--",
                   label=f"predicted first KV wait ({pred.first_kv_wait})")
    if pred is not None and pred.first_preemption:
        ax.axvline(pred.first_preemption, color="tab:red", linestyle=":", linewidth=2,
                   label=f"predicted first preemption ({pred.first_preemption})")
    handles = ax.get_legend_handles_labels()
    h2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + h2[0], handles[1] + h2[1], loc="upper left", fontsize=8)
    from kvplan.cli.common import printable

    # A title is one short line: a 1 MB model name from a server took matplotlib over a minute to lay out.
    ax.set_title(printable(f"{summary.model}: {summary.workload}", 160), fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def summary_json(summary: BenchSummary) -> dict[str, Any]:
    return json.loads(summary.model_dump_json())
