"""report.md: capacity and onsets predicted vs measured, the prefix-cache replay table, one row per point, the
latency predicted beside the measured, notes and warnings."""

from __future__ import annotations

from kvplan.bench.outputs.fleet_text import fleet_markdown
from kvplan.bench.outputs.registry import output
from kvplan.bench.outputs.text import (
    DEFINITIONS,
    GPU_HEAD,
    PREDICTED_FIGURES,
    TIER_HEAD,
    budget_wait_text,
    gpu_rows,
    int_or_none,
    latency_model_text,
    load_text,
    num,
    onset_cell,
    p99_cell,
    predicted_cells,
    tier_rows,
)
from kvplan.bench.results import BenchSummary, PlannerCapacity, PointResult
from kvplan.bench.slo import describe_slo
from kvplan.bench.store import REPORT_FILE, RunStore
from kvplan.units import format_ms


@output("markdown", REPORT_FILE, order=10)
def write_markdown(summary: BenchSummary, store: RunStore) -> str:
    return markdown(summary)


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
    if s.tls:
        lines.append(f"- TLS: {s.tls}")
    if s.prometheus:
        lines.append(f"- server figures: {s.prometheus.describe()}")
    lines.append(f"- status: {s.status}" + (f" ({s.error})" if s.error and s.status != "complete" else ""))
    if s.prediction_note:
        lines.append(f"- {s.prediction_note}")
    lines += ["", "## KV capacity", "", "| | planner | engine reports |", "|---|---:|---:|"]
    lines.append(f"| blocks (incl. the null block) | {num(planner.num_blocks)} | {num(cap.num_blocks)} |")
    lines.append(f"| block size | {num(planner.block_size)} | {num(cap.block_size)} |")
    lines.append(f"| KV cache tokens | {num(planner.kv_cache_tokens)} | {num(cap.kv_cache_tokens)} |")
    if planner.error:
        lines += ["", f"Planner: {planner.error}"]
    lines += ["", f"Capacity read from: {cap.source or 'nothing (no log line, no cache_config_info)'}."]
    by = "hybrid simulator" if pred is not None and pred.kv_groups else "block rule"
    lines += ["", "## Onsets", "", f"| onset | predicted ({by}) | measured |", "|---|---:|---|"]
    for key, name in (("first_kv_wait", "first concurrency that waits for KV"),
                      ("first_preemption", "first concurrency with preemptions")):
        p = pred.onset(key) if pred else None
        p_text = (pred.none_text if p is None else str(p)) if pred else "-"
        lines.append(f"| {name} | {p_text} | {onset_cell(s.measured.onset(key), p, pred is not None)} |")
    budget = budget_wait_text(s)
    if budget:
        lines += ["", budget[0].upper() + budget[1:] + "."]
    if pred and pred.kv_groups:
        lines += ["", (
            f"Hybrid simulator (kvplan.plan.hybrid_sim) on the engine's pool: {pred.num_blocks} blocks of "
            f"{pred.block_size} ({pred.usable_blocks} usable) shared by the KV cache groups ({pred.kv_groups}); a "
            f"request is admitted with {pred.admit_blocks} free blocks and peaks at {pred.peak_blocks} over the groups; "
            f"closed loops of streams in lockstep simulated up to {pred.searched_up_to} streams"
            + ("" if pred.exact else " (approximate: requests are not identical)")
            + "."
        )]
    elif pred:
        lines += ["", (
            f"Block rule on the engine's pool: {pred.num_blocks} blocks of {pred.block_size} "
            f"({pred.usable_blocks} usable); a request is admitted with {pred.admit_blocks} free blocks "
            f"and peaks at {pred.peak_blocks}"
            + ("" if pred.exact else " (approximate: requests are not identical; mean lengths used)")
            + "."
        )]
    rate_mode = s.rate_mode
    slo = s.slo
    lines += fleet_markdown(s)
    lines += replay_markdown(s.points)
    lines += tier_markdown(s.points)
    lines += gpu_markdown(s.points)
    lines += chosen_percentiles_markdown(s.points)
    lines += ["", "## Points", ""]
    if s.load_description:
        lines += [f"Load: {s.load_description}.", ""]
    lines += ["A p99's [95% CI] is the interval its samples' order statistics give (exact, no resampling; '?' where "
              "they cannot bound it: an upper bound needs 368 samples); (n) is the sample count, '!' under 100.", ""]
    cols = (["rate req/s", "peak in flight"] if rate_mode else ["concurrency"]) + [
        "predicted", "measured", "preemptions", "peak waiting", "KV fill predicted", "KV peak measured",
        "TTFT p50 ms", "TTFT p99 ms [95% CI] (n)", "ITL p50 ms", "ITL p99 ms [95% CI] (n)", "TPOT p50 ms",
        "E2E p99 ms [95% CI] (n)",
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
            "-" if predicted is None else predicted.label, pt.label, num(int_or_none(srv.preemptions)),
            num(int_or_none(srv.peak_waiting)),
            "-" if kv_pred is None else f"{kv_pred:.0%}", "-" if kv_meas is None else f"{kv_meas:.0%}",
            format_ms(pt.ttft.p50), p99_cell(pt.ttft), format_ms(pt.itl.p50), p99_cell(pt.itl), format_ms(pt.tpot.p50),
            p99_cell(pt.e2e), num(pt.throughput_tok_s, ",.0f"), num(pt.request_throughput, ",.2f"),
            f"{pt.requests_ok}/{pt.requests}"]
        if slo:
            cells += ["-" if pt.slo_met is None else ("yes" if pt.slo_met else "no"),
                      num(pt.goodput_req_s, ",.2f"), num(pt.goodput_tok_s, ",.0f")]
        lines.append("| " + " | ".join(cells) + " |")
    if slo:
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
        lines.append(f"| {r.sessions} | {r.requests} | {num(r.prefix_queries)} | {pct(r.hit_rate)} | "
                     f"{pct(r.predicted_hit_rate)} | {pct(r.predicted_hit_rate_low)}-{pct(r.predicted_hit_rate_high)} | "
                     f"{'yes' if p.preempted else 'no'} ({want}) | {r.predicted_by} |")
    return lines


def chosen_percentiles_markdown(points: list[PointResult]) -> list[str]:
    """--percentiles: every latency's chosen percentiles per point, in ms."""
    names = sorted({k for p in points for m in (p.ttft, p.itl, p.e2e) for k in (m.chosen or {})},
                   key=lambda k: float(k[1:]))
    if not names:
        return []
    head = ["load"] + [f"{metric} {k} ms" for metric in ("TTFT", "ITL", "E2E") for k in names]
    rows = []
    for p in points:
        where = f"{p.rate:g} requests/s" if p.mode == "rate" else f"concurrency {p.concurrency}"
        rows.append([where] + [format_ms((m.chosen or {}).get(k)) for m in (p.ttft, p.itl, p.e2e) for k in names])
    return ["", "## Chosen percentiles (--percentiles)", "", "| " + " | ".join(head) + " |",
            "|---|" + "---:|" * (len(head) - 1), *("| " + " | ".join(r) + " |" for r in rows)]


def gpu_markdown(points: list[PointResult]) -> list[str]:
    """The GPUs during each point (--gpu-metrics: a DCGM exporter or NVML)."""
    rows = gpu_rows(points)
    if not rows:
        return []
    return ["", "## GPUs (--gpu-metrics)", "", "| " + " | ".join(GPU_HEAD) + " |", "|---|---|---:|---:|---:|---:|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def tier_markdown(points: list[PointResult]) -> list[str]:
    """The KV tier's counters per point (a KV connector: vLLM's native CPU offloading, LMCache...), where the server
    declares them."""
    rows = tier_rows(points)
    if not rows:
        return []
    return ["", "## KV tier (the engine's connector counters)", "", "| " + " | ".join(TIER_HEAD) + " |",
            "|---|---:|---:|---:|---:|", *("| " + " | ".join(r) + " |" for r in rows)]


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
    lines += ["| " + " | ".join([load_text(p)] + cells) + " |" for p, cells in rows]
    bounded = [p for p, _ in rows if (p.predicted_latency.simulated_requests or p.requests) < p.requests]
    if bounded:
        lines += ["", "Simulated on fewer requests than sent (bounded to keep the simulation short): " + ", ".join(
            f"{load_text(p)}: {p.predicted_latency.simulated_requests} of {p.requests}" for p in bounded) + "."]
    return lines
