"""What several outputs (and the terminal) share: number cells, onset texts, the latency model's sentence, the
predicted-vs-measured cells and the definitions every report ends with."""

from __future__ import annotations

import textwrap
from typing import Any

from kvplan.bench.results import BenchSummary, LatencyStats, PointResult
from kvplan.bench.stats import min_samples
from kvplan.bench.sweep import Onset


def num(value: Any, fmt: str = ",") -> str:
    if value is None:
        return "-"
    return format(value, fmt)


def onset_text(onset: Onset) -> str:
    """A measured onset: its level ("<= level" when the level below it was not measured), or how far none was seen."""
    if onset.first is None:
        return f"none up to {onset.searched_up_to}"
    return str(onset.first) if onset.exact else f"<= {onset.first}"


def onset_cell(measured: Onset | None, predicted: int | None, has_prediction: bool) -> str:
    if measured is None:
        return "not searched"
    first = measured.first
    text = onset_text(measured)
    if has_prediction:
        text += " (agrees)" if first == predicted else " (differs)"
    return text


def budget_wait_text(s: BenchSummary) -> str | None:
    """The waits for the token budget, beside the onsets: the hybrid simulator's first concurrency with one
    (OnsetPrediction.first_budget_wait) and the points whose waiting gauge was put down to the budget
    (PointResult.waited_for_budget); None when the run has neither."""
    pred = s.prediction
    first = None if pred is None else pred.first_budget_wait
    seen = [p.concurrency for p in s.points if p.waited_for_budget]
    if first is None and not seen:
        return None
    predicted = "-" if pred is None or pred.kv_groups is None else pred.none_text if first is None else str(first)
    measured = ", ".join(map(str, seen)) if seen else "none"
    return (f"first concurrency that waits for the token budget (not KV): predicted {predicted}; points measured "
            f"budget-limited: {measured}")


TIER_HEAD = ("load", "tokens asked of the tier", "found there", "loaded (tier -> GPU)", "stored (GPU -> tier)")


GPU_HEAD = ("load", "source (GPUs, samples)", "utilization mean / peak %", "memory used peak MiB", "power peak W",
            "SM clock min MHz")


def gpu_rows(points: list[PointResult]) -> list[tuple[str, ...]]:
    """The GPUs during each point (--gpu-metrics; GPU_HEAD's cells), for the points that have samples."""

    def f(v, fmt: str = ",.0f") -> str:
        return "-" if v is None else format(v, fmt)

    rows = []
    for p in points:
        g = p.gpu
        if g is None:
            continue
        where = f"{p.rate:g} requests/s" if p.mode == "rate" else f"concurrency {p.concurrency}"
        rows.append((where, f"{g.source} ({g.gpus}, {g.samples})", f"{f(g.util_mean_pct, '.1f')} / {f(g.util_peak_pct)}",
                     f(g.memory_used_peak_mib), f(g.power_peak_w), f(g.sm_clock_min_mhz)))
    return rows


def tier_rows(points: list[PointResult]) -> list[tuple[str, ...]]:
    """The KV tier's counters per point (TIER_HEAD's cells), for the points whose KV connector was asked anything or
    moved anything; none where the server declares no tier."""

    def share(hits, queries) -> str:
        return "-" if not queries or hits is None else f"{hits / queries:.1%}"

    def moved(nbytes, seconds) -> str:
        return "-" if nbytes is None else f"{nbytes / 2**30:.3f} GiB" + (f" in {seconds:.3f} s" if seconds else "")

    rows = []
    for p in points:
        srv = p.server
        if not (srv.external_queries or srv.offload_load_bytes or srv.offload_store_bytes):
            continue
        where = f"{p.rate:g} requests/s" if p.mode == "rate" else f"concurrency {p.concurrency}"
        rows.append((where, num(srv.external_queries), share(srv.external_hits, srv.external_queries),
                     moved(srv.offload_load_bytes, srv.offload_load_s), moved(srv.offload_store_bytes, srv.offload_store_s)))
    return rows


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
            f"step times {info.source} ({info.basis}).") + (f" {info.pool}." if info.pool else "") \
        + (f" Note: {info.note}." if info.note else "")


def predicted_cells(p: PointResult) -> list[str] | None:
    """'predicted / measured' per PREDICTED_FIGURES (ms), then output tok/s; None: no prediction."""
    pred = p.predicted_latency
    if pred is None:
        return None
    if pred.error:
        return [f"- ({pred.error})"] + ["-"] * len(PREDICTED_FIGURES)
    cells = [f"{short_ms(pred.stat(m, k))} / {short_ms(getattr(p, m).stat(k))}" for m, k, _ in PREDICTED_FIGURES]
    return cells + [f"{num(pred.output_tokens_per_s, ',.0f')} / {num(p.throughput_tok_s, ',.0f')}"]


def short_ms(seconds: float | None) -> str:
    """Milliseconds to the unit from 10 ms up, to a tenth below (a 0.4 ms ITL is not "0")."""
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:,.0f}" if ms >= 10 else f"{ms:.1f}"


def load_text(p: PointResult) -> str:
    return f"{p.rate:g}" if p.mode == "rate" else str(p.concurrency)


def latency_lines(summary: BenchSummary) -> list[str]:
    """The terminal's predicted-vs-measured table, plain text within 80 columns: two rows per point
    (pred, meas), milliseconds and output tok/s; with the model's source above. [] for older runs."""
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
            out.append(f"{load_text(p):>6}  pred  not simulated: {pred.error}"[:80])
            continue
        out.append(f"{load_text(p):>6}  pred" + "".join(f"{short_ms(pred.stat(m, k)):>9}" for m, k, _ in
                                                       PREDICTED_FIGURES) + f"{num(pred.output_tokens_per_s, ',.0f'):>9}")
        out.append(f"{'':>6}  meas" + "".join(f"{short_ms(getattr(p, m).stat(k)):>9}" for m, k, _ in
                                             PREDICTED_FIGURES) + f"{num(p.throughput_tok_s, ',.0f'):>9}")
    return out


def p99_cell(stats: LatencyStats) -> str:
    """'812.3 [790.1-840.5] (1,000)': the p99, its 95% confidence interval and its sample count ('?' for a bound the
    sample cannot give; '!' when too few samples carry the p99)."""
    value = stats.p99
    if value is None:
        return "-"
    n = stats.count
    ci = ""
    if stats.p99_ci is not None:
        low, high = (("?" if v is None else f"{v * 1000:.1f}") for v in stats.p99_ci)
        ci = f" [{low}-{high}]"
    return f"{value * 1000:.1f}{ci} ({n:,}{'!' if n < min_samples(99) else ''})"


def _int(value: Any) -> int | None:
    return None if value is None else int(round(value))




def int_or_none(value: Any) -> int | None:
    return None if value is None else int(round(value))
