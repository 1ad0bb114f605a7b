"""`kvplan report RUN [RUN ...]`: re-render and compare finished runs offline (never starts an engine)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from kvplan.cli.common import esc, make_console, print_json, user_errors

if TYPE_CHECKING:
    from kvplan.bench.results import BenchSummary

EXAMPLES = """
Examples:

  # write a run's report.md, report.html, points.csv and requests.csv again
  kvplan report runs/20250101-120000-my-model

  # compare two runs (and a folder of `vllm bench serve --save-result` files) in one HTML page
  kvplan report runs/a runs/b vllm-results/ --html compare.html

  # apply SLOs after the fact (goodput needs kvplan's requests.jsonl)
  kvplan report runs/a --slo ttft_p99=500ms,e2e_p99=10s --json
"""


@user_errors
def report(
    runs: list[Path] = typer.Argument(..., help="kvplan bench run folders, `vllm bench serve --save-result` JSON files, or folders of them."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write the comparison page here (default with several runs: ./kvplan-report.html)."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Judge the runs against these SLOs instead of their own: ttft_p99=500ms,itl_p99=50ms."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON."),
) -> None:
    """Re-render and compare bench runs offline: no engine is started, no server contacted.

    Exit code 0: done; 2: a run could not be read.
    """
    from kvplan.bench.render import load_summary
    from kvplan.bench.report import write_reports
    from kvplan.bench.slo import parse_slo
    from kvplan.bench.store import RunStore

    targets = parse_slo(slo) if slo else None
    summaries = []
    for path in runs:
        summary = load_summary(path)
        if targets is not None:
            summary = apply_slo(summary, path, targets)
        if summary.source == "kvplan":
            write_reports(RunStore(path), summary)
        summaries.append(summary)
    if html is None and len(summaries) > 1:
        html = Path("kvplan-report.html")
    if html is not None:
        from kvplan.bench.html import html_report

        html.write_text(html_report(summaries), encoding="utf-8")
    if as_json:
        print_json(summaries[0] if len(summaries) == 1 else [s.model_dump(mode="json") for s in summaries])
        return
    _print(summaries, html)


def apply_slo(summary: BenchSummary, path: Path, slo: dict[str, float]) -> BenchSummary:
    """The summary judged against ``slo``: point percentiles from the summary; goodput from requests.jsonl
    (kvplan runs only: other harnesses' files carry no per-request latencies)."""
    from kvplan.bench.runner import highest_load_meeting
    from kvplan.bench.slo import request_meets, slo_results

    per_point: dict[int, list] = {}
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
                per_point.setdefault(int(row["seq"]), []).append(rec)
            except (KeyError, TypeError, ValueError):
                continue
    points = []
    for p in summary.points:
        checks = slo_results(p.latencies(), slo)
        met = None if p.status != "ok" else all(c.met for c in checks.values())
        update = {"slo": checks, "slo_met": met}
        recs = per_point.get(p.seq)
        if recs:
            good = [r for r in recs if request_meets(r, slo)]
            update.update(goodput_share=round(len(good) / len(recs), 4),
                          goodput_req_s=round(len(good) / p.wall_s, 4) if p.wall_s else None,
                          goodput_tok_s=round(sum(r.output_tokens for r in good) / p.wall_s, 2) if p.wall_s else None)
        points.append(p.model_copy(update=update))
    # An automatic rate search aimed at the run's own SLOs: its bracket says nothing about these.
    return summary.model_copy(update={"points": points, "slo": dict(slo), "rate_search": None,
                                      "highest_load_meeting_slo": highest_load_meeting(points)})


def _print(summaries, html: Optional[Path]) -> None:
    from kvplan.bench.stats import min_samples
    from kvplan.cli.bench_cmd import _ms, points_table

    console = make_console()
    for s in summaries:
        rate = s.rate_mode
        console.print(f"[bold]{esc(s.run_dir)}[/] ({esc(s.source)}): {esc(s.model)}, {esc(s.workload)}")
        rows = []
        for p in s.points:
            n = p.ttft.count
            pre = p.server.preemptions
            rows.append([f"{p.rate:g}" if rate else str(p.concurrency), "-" if pre is None else f"{pre:.0f}",
                         f"{_ms(p.ttft.p99)} ({n}{'!' if n < min_samples(99) else ''})", _ms(p.itl.p99),
                         _ms(p.e2e.p99), "-" if p.throughput_tok_s is None else f"{p.throughput_tok_s:,.0f}",
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
