"""`kvplan report RUN [RUN ...]`: re-render and compare finished runs offline (never starts an engine)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from kvplan.cli.common import print_json, user_errors
from kvplan.cli.tables import Column, OutputFormat, chosen_format, emit_rows, format_option
from kvplan.term import esc, make_console

if TYPE_CHECKING:
    from kvplan.bench.results import BenchSummary

EXAMPLES = """
Examples:

  # write a run's report.md, report.html, points.csv and requests.csv again
  kvplan report runs/20250101-120000-my-model

  # compare two runs (and a folder of `vllm bench serve --save-result` files) in one HTML page
  kvplan report runs/a runs/b vllm-results/ --html compare.html

  # a GuideLLM report, saved as JSON or YAML (guidellm benchmark --output-path benchmarks.yaml)
  kvplan report benchmarks.yaml

  # apply SLOs after the fact (goodput needs kvplan's requests.jsonl)
  kvplan report runs/a --slo ttft_p99=500ms,e2e_p99=10s --json

  # every run's points in one CSV (a row per run and load) or one Markdown table
  kvplan report runs/a runs/b --format csv > points.csv
  kvplan report runs/a runs/b --format markdown
"""


@user_errors
def report(
    runs: list[Path] = typer.Argument(..., help="kvplan bench run folders, `vllm bench serve --save-result` JSON files, GuideLLM reports (benchmarks.json, or benchmarks.yaml / .yml), or folders of them."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write the comparison page here (default with several runs: ./kvplan-report.html)."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Judge the runs against these SLOs instead of their own: ttft_p99=500ms,itl_p99=50ms."),
    steptime: Optional[Path] = typer.Option(None, "--steptime", metavar="RUN", help="Predict every point's latency again with this calibration (a run folder holding steptime.json, or the file; see kvplan calibrate --bench)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", metavar="GPU", help="Predict every point's latency again with this GPU's prior step-time model (when no --steptime is given)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON (same as --format json).", rich_help_panel="Output"),
    fmt: OutputFormat = format_option(),
) -> None:
    """Re-render and compare bench runs offline: no engine is started, no server contacted.

    --format csv or markdown prints the runs' points as one table (a row per run and load: p99
    latencies in ms, throughput, SLOs met); json (as --json) the whole summaries.

    Exit code 0: done; 2: a run could not be read.
    """
    from kvplan.bench.outputs import write_reports
    from kvplan.bench.render import load_summary
    from kvplan.bench.slo import parse_slo
    from kvplan.bench.store import RunStore

    fmt = chosen_format(fmt, as_json)
    if steptime is not None:
        from kvplan.bench.steptime_io import load_steptime

        load_steptime(steptime)  # one clear error up front, not a run reported without its prediction
    targets = parse_slo(slo) if slo else None
    summaries = []
    for path in runs:
        summary = load_summary(path)
        if (steptime is not None or gpu) and summary.source == "kvplan":
            from kvplan.bench.latency import predict_run

            summary = predict_run(path, steptime, gpu)
        if targets is not None:
            summary = apply_slo(summary, path, targets)
        if summary.source == "kvplan":
            write_reports(RunStore(path), summary)
        summaries.append(summary)
    if html is None and len(summaries) > 1:
        html = Path("kvplan-report.html")
    if html is not None:
        from kvplan.bench.outputs.html import html_report, ttfts_by_point
        from kvplan.paths import write_file_safely

        ttfts = ttfts_by_point(RunStore(runs[0])) if len(summaries) == 1 and summaries[0].source == "kvplan" else None
        write_file_safely(html, html_report(summaries, ttfts=ttfts), "the report")
    if fmt is OutputFormat.json:
        print_json(summaries[0] if len(summaries) == 1 else [s.model_dump(mode="json") for s in summaries])
    elif fmt is OutputFormat.table:
        _print(summaries, html)
    else:
        emit_rows(point_rows(summaries), POINT_COLUMNS, fmt)


def _ms_or_none(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)  # as the runs' points.csv


def point_rows(summaries: list[BenchSummary]) -> list[dict]:
    """One flat record per run and load point: what the comparison table shows, latencies in ms."""
    return [{"run": s.run_dir, "source": s.source, "model": s.model, "load_mode": "rate" if s.rate_mode else "concurrency",
             "load": p.rate if s.rate_mode else p.concurrency, "status": p.status, "preemptions": p.server.preemptions,
             "ttft_p99_ms": _ms_or_none(p.ttft.p99), "ttft_n": p.ttft.count, "itl_p99_ms": _ms_or_none(p.itl.p99),
             "e2e_p99_ms": _ms_or_none(p.e2e.p99), "output_tok_s": p.throughput_tok_s, "slo_met": p.slo_met}
            for s in summaries for p in s.points]


def _figure(value: float | None) -> str:
    """As the terminal table: whole units from 10 up, a tenth below (a 0.4 ms ITL is not "0")."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


POINT_COLUMNS = [Column("run", "run", right=False), Column("source", "source", right=False),
                 Column("load_mode", "mode", right=False), Column("load", "load", "{:g}".format),
                 Column("preemptions", "preempt", lambda v: "-" if v is None else f"{v:.0f}"),
                 Column("ttft_p99_ms", "TTFT ms p99", _figure), Column("ttft_n", "n"),
                 Column("itl_p99_ms", "ITL ms p99", _figure), Column("e2e_p99_ms", "E2E ms p99", _figure),
                 Column("output_tok_s", "tok/s", lambda v: "-" if v is None else f"{v:,.0f}"),
                 Column("slo_met", "SLOs", lambda met: "-" if met is None else ("met" if met else "missed"), right=False)]


def apply_slo(summary: BenchSummary, path: Path, slo: dict[str, float]) -> BenchSummary:
    """The summary judged against ``slo``: point percentiles from the summary; goodput from requests.jsonl
    (kvplan runs only: other harnesses' files carry no per-request latencies)."""
    from kvplan.bench.results import highest_load_meeting
    from kvplan.bench.slo import request_meets, slo_results

    # point seq -> [requests, requests meeting every target, their output tokens]: tallied one request at a time,
    # since requests.jsonl holds every request of the run (a crafted one need not fit in memory)
    per_point: dict[int, list[int]] = {}
    if summary.source == "kvplan":
        from kvplan.bench.loadgen import RequestRecord
        from kvplan.bench.store import RunStore

        for row in RunStore(path).read_requests():
            try:
                rec = RequestRecord(int(row["index"]), int(row["stream"]), float(row["scheduled_s"]),
                                    float(row.get("sent_s") or 0), row.get("first_token_s"), row.get("end_s"),
                                    [float(t) for t in row.get("chunk_times_s") or []],
                                    [int(k) for k in row.get("chunk_tokens") or []], row.get("prompt_tokens"),
                                    int(row.get("output_tokens") or 0), int(row.get("max_tokens") or 0),
                                    bool(row.get("ok")), row.get("error"))
                tally = per_point.setdefault(int(row["seq"]), [0, 0, 0])
            except (KeyError, TypeError, ValueError):
                continue
            tally[0] += 1
            if request_meets(rec, slo):
                tally[1] += 1
                tally[2] += rec.output_tokens
    points = []
    for p in summary.points:
        checks = slo_results(p.latencies(), slo)
        met = None if p.status != "ok" else all(c.met for c in checks.values())
        update = {"slo": checks, "slo_met": met}
        requests, good, good_tokens = per_point.get(p.seq) or (0, 0, 0)
        if requests:
            update.update(goodput_share=round(good / requests, 4),
                          goodput_req_s=round(good / p.wall_s, 4) if p.wall_s else None,
                          goodput_tok_s=round(good_tokens / p.wall_s, 2) if p.wall_s else None)
        points.append(p.model_copy(update=update))
    # An automatic rate search aimed at the run's own SLOs: its bracket says nothing about these.
    return summary.model_copy(update={"points": points, "slo": dict(slo), "rate_search": None,
                                      "highest_load_meeting_slo": highest_load_meeting(points)})


def _print(summaries, html: Optional[Path]) -> None:
    from kvplan.bench.stats import min_samples
    from kvplan.cli.bench_cmd import points_table
    from kvplan.units import format_ms

    console = make_console()
    for s in summaries:
        rate = s.rate_mode
        console.print(f"[bold]{esc(s.run_dir)}[/] ({esc(s.source)}): {esc(s.model)}, {esc(s.workload)}")
        rows = []
        for p in s.points:
            n = p.ttft.count
            pre = p.server.preemptions
            rows.append([f"{p.rate:g}" if rate else str(p.concurrency), "-" if pre is None else f"{pre:.0f}",
                         f"{format_ms(p.ttft.p99)} ({n}{'!' if n < min_samples(99) else ''})", format_ms(p.itl.p99),
                         format_ms(p.e2e.p99), "-" if p.throughput_tok_s is None else f"{p.throughput_tok_s:,.0f}",
                         "-" if p.slo_met is None else ("met" if p.slo_met else "[red]missed[/]")])
        console.print(points_table(("req/s" if rate else "c", "preempt", "TTFT ms\np99 (n)", "ITL ms\np99",
                                    "E2E ms\np99", "tok/s", "SLOs"), rows))
        if s.slo:
            best = s.highest_load_meeting_slo
            console.print(f"highest load meeting the SLOs: {'none' if best is None else f'{best:g}'}")
            if s.rate_search is not None:
                console.print(f"rate search: {esc(s.rate_search.describe())}")
        if any(p.warnings for p in s.points):
            console.print("[yellow]! p99 from fewer than 100 samples: see the warnings in report.md[/]")
    if html is not None:
        console.print(f"[dim]HTML: {esc(str(html))}[/]")
