"""report.html's parts a team reviews (issue 27), on a recorded run (tests/bench/data/old-run-conc): the planner vs
engine capacity table, SLO targets drawn on the latency charts, and one warning list instead of a line per point
and metric. The page as a browser renders it is tested in test_report_html_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvplan.bench.outputs.html import SLO_COLOUR, html_report
from kvplan.bench.results import BenchSummary, PlannerCapacity

RUN = Path(__file__).resolve().parent / "data" / "old-run-conc"


def _summary(**changes) -> BenchSummary:
    s = BenchSummary.model_validate(json.loads((RUN / "summary.json").read_text()))
    return s.model_copy(update=changes)


def test_the_capacity_table_sets_the_planner_beside_the_engine():
    planner = PlannerCapacity(num_blocks=17, kv_cache_tokens=544, block_size=32, vllm_version="0.32.0")
    page = html_report([_summary(planner=planner)])
    table = re.search(r'<table class="capacity">.*?</table>', page).group(0)
    assert "<caption>KV capacity: planner vs engine</caption>" in table
    assert "planner (0.32.0 rules)" in table and "engine reports (metrics)" in table
    assert "<tr><td>blocks</td><td>17</td><td>17</td></tr>" in table  # the recorded engine's 17 blocks of 32
    assert "<tr><td>KV cache tokens</td><td>544</td><td>544</td></tr>" in table
    assert "planner: no GPU" in html_report([_summary(planner=PlannerCapacity(error="no GPU"))])


def test_slo_targets_are_lines_on_the_latency_charts():
    page = html_report([_summary(slo={"ttft_p99": 0.5, "itl_p50": 0.02})])
    figures = re.findall(r"<figure>.*?</figure>", page)
    ttft = next(f for f in figures if 'aria-label="TTFT vs load (ms)"' in f)
    itl = next(f for f in figures if 'aria-label="ITL per token vs load (ms)"' in f)
    e2e = next(f for f in figures if 'aria-label="E2E vs load (ms)"' in f)
    (line,) = re.findall(r'<line class="target"[^>]*>.*?</line>', ttft)
    assert f'stroke="{SLO_COLOUR}"' in line and "SLO ttft p99 &lt;= 500 ms" in line
    assert "SLO ttft p99 &lt;= 500 ms" in ttft.split('<rect')[0]  # in the legend, above the plot
    assert "SLO itl p50 &lt;= 20 ms" in itl and 'class="target"' not in e2e
    # the 500 ms target is above every recorded TTFT (under 0.2 s): the axis reaches it, and the line is in the plot
    frame = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" class="frame"/>', ttft)
    top, height = float(frame.group(2)), float(frame.group(4))
    y = float(re.search(r'y1="([\d.]+)"', line).group(1))
    assert top <= y <= top + height


def test_one_warning_list_for_every_point():
    page = html_report([_summary()])
    (warnings,) = re.findall(r'<ul class="warn">.*?</ul>', page)
    items = re.findall(r"<li>(.*?)</li>", warnings)
    # 4 metrics x 2 points gave 8 lines; one entry per kind of warning, naming its points
    assert len(items) == 4
    ttft = next(i for i in items if i.startswith("TTFT p99"))
    assert ttft.endswith("at concurrency 1, concurrency 4") and "1 more like it" in ttft
    assert '<p class="warn">' not in page


def test_the_timeline_lays_the_points_end_to_end():
    """Two points' scraped series (seconds into the point, running, waiting, KV usage, preemptions so far): on the
    run's clock the second begins at the first's wall time, and preemptions add up over the run."""
    s = _summary()
    first, second = s.points
    first = first.model_copy(update={"wall_s": 2.0, "server": first.server.model_copy(
        update={"series": [(0.5, 1, 0, 0.25, 0), (1.5, 1, 0, 0.5, 1)]})})
    second = second.model_copy(update={"wall_s": 1.0, "server": second.server.model_copy(
        update={"series": [(0.25, 4, 2, 0.75, 2), (0.75, 4, 3, 1.0, 3)]})})
    page = html_report([s.model_copy(update={"points": [first, second]})])
    figures = {re.search(r'aria-label="([^"]+)"', f).group(1): f for f in re.findall(r"<figure>.*?</figure>", page)}
    kv = re.findall(r"<title>KV usage: ([\d.]+) -&gt; ([\d.]+)</title>", figures["KV cache usage over time (%)"])
    assert kv == [("0.5", "25"), ("1.5", "50"), ("2.2", "75"), ("2.8", "100")]  # 2.25, 2.75 s as the titles round
    pre = re.findall(r"<title>preemptions: ([\d.]+) -&gt; ([\d.]+)</title>",
                     figures["Preemptions over time (run total)"])
    assert [float(v) for _, v in pre] == [0, 1, 3, 4]  # the second point's 2 and 3 on top of the first's 1
    waiting = re.findall(r"<title>waiting: [\d.]+ -&gt; ([\d.]+)</title>", figures["Requests over time"])
    assert [float(v) for v in waiting] == [0, 0, 2, 3]
    assert "Over time" in page and len(figures) == 9
    # a comparison of runs has no timeline (each run its own clock)
    assert "Over time" not in html_report([s, s])


def test_a_comparison_of_streams_and_rates_gives_each_its_own_axis():
    """Issue 27: the compare page plotted concurrency and request rate on one axis. A concurrency run and a rate run
    (the recorded ones in tests/bench/data) now get a chart set each, under its own heading and x axis."""
    conc = _summary()
    rate = BenchSummary.model_validate(json.loads((RUN.parent / "old-run-rate" / "summary.json").read_text()))
    assert (conc.load_mode, rate.load_mode) == ("concurrency", "rate")
    page = html_report([conc, rate])
    by_conc, by_rate = page.split("<h2>Runs by concurrency</h2>")[1].split("<h2>Runs by request rate</h2>")
    assert by_conc.count("<svg") == 6 and by_conc.count(">concurrent streams</text>") == 6
    assert "request rate" not in by_conc.split("</div>")[0]
    by_rate = by_rate.split("</div>")[0]
    assert by_rate.count("<svg") == 6 and by_rate.count(">request rate (req/s)</text>") == 6
    assert "load (streams or req/s)" not in page
    # each run keeps its colour: the first run's series only above, the second's only below
    from kvplan.bench.outputs.html import COLOURS

    assert f'stroke="{COLOURS[0]}"' in by_conc and f'stroke="{COLOURS[1]}"' not in by_conc
    assert f'stroke="{COLOURS[1]}"' in by_rate and f'stroke="{COLOURS[0]}"' not in by_rate


def test_the_ttft_distribution_by_load_from_requests(tmp_path):
    """Each point's TTFTs from requests.jsonl (first token - scheduled time, completed requests only; rows kvplan did
    not write are skipped), drawn as the share of requests within x ms."""
    import shutil

    from kvplan.bench.outputs.html import ttfts_by_point
    from kvplan.bench.store import RunStore

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    rows = [{"seq": 0, "ok": True, "scheduled_s": 1.0, "first_token_s": 1.0 + t / 1000} for t in (10, 20, 30, 40, 50)]
    rows += [{"seq": 0, "ok": False, "scheduled_s": 0.0, "first_token_s": None},
             {"seq": "x", "ok": True, "scheduled_s": 0.0, "first_token_s": 0.5},
             {"seq": 1, "ok": True, "scheduled_s": 0.0, "first_token_s": float("nan")}]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ttfts = ttfts_by_point(RunStore(run))
    assert list(ttfts) == [0] and [round(v * 1000, 6) for v in ttfts[0]] == [10, 20, 30, 40, 50]
    page = html_report([_summary()], ttfts={0: ttfts[0]})
    cdf = re.search(r'<figure><svg[^>]*aria-label="TTFT distribution by load".*?</figure>', page).group(0)
    dots = re.findall(r"<title>concurrency 1: ([\d.]+) -&gt; ([\d.]+)</title>", cdf)
    # the 0th, 50th and 100th percentiles of 10..50 ms (linear): 10, 30, 50 ms at 0%, 50%, 100%
    assert ("10", "0") in dots and ("30", "50") in dots and ("50", "100") in dots


def test_plot_png_preemption_axis_starts_at_zero():
    """Issue 27: plot.png drew a -0.04..0.04 preemption axis for a run without preemptions."""
    from kvplan.bench.outputs.png import plot_png, preemption_axis_top

    assert preemption_axis_top([0, 0]) == 1.0 and preemption_axis_top([]) == 1.0
    assert preemption_axis_top([0, 20]) == 22.0
    assert plot_png(_summary())[:8] == b"\x89PNG\r\n\x1a\n"
