"""Samples, open-loop load, SLOs, CSV/HTML reports, `kvplan report` and other harnesses' results,
against the fake streaming server (no engine)."""

from __future__ import annotations

import asyncio
import csv
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import typer
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer
from typer.testing import CliRunner

from kvplan.bench.loadgen import RequestRecord, arrival_times, run_open_loop
from kvplan.bench.results import LatencyStats
from kvplan.bench.slo import parse_slo
from kvplan.bench.stats import describe, min_samples, sample_warnings
from kvplan.bench.workload import Workload
from kvplan.errors import KvplanError

DATA = Path(__file__).parent / "data"


def test_itl_is_per_token_when_a_delivery_carries_several():
    rec = RequestRecord(0, 0, 0.0, output_tokens=4, ok=True, chunk_times_s=[0.1, 0.2, 0.22], chunk_tokens=[1, 2, 1])
    assert rec.itl_s == pytest.approx([0.05, 0.05, 0.02]) and rec.multi_token_chunks
    # usage counts more tokens than events (speculative decoding): spread evenly over the gaps
    spec = RequestRecord(0, 0, 0.0, output_tokens=7, ok=True, chunk_times_s=[0.1, 0.2, 0.3])
    assert spec.itl_s == pytest.approx([1 / 30] * 6) and spec.multi_token_chunks
    assert 0.0 not in spec.itl_s


def test_percentile_sample_warnings():
    assert [min_samples(q) for q in (50, 90, 95, 99)] == [2, 10, 20, 100]
    assert sample_warnings("TTFT", LatencyStats.of([0.1] * 99))[0].startswith("TTFT p99 rests on 99 samples")
    assert sample_warnings("TTFT", LatencyStats.of([0.1] * 100)) == []
    assert LatencyStats.of([0.1] * 3).model_dump() == dict(describe([0.1] * 3), n=3)


def test_slo_parsing():
    assert parse_slo("ttft_p99=500ms,itl_p99=50,e2e_p99=10s,tpot_mean=20ms") == {
        "ttft_p99": 0.5, "itl_p99": 0.05, "e2e_p99": 10.0, "tpot_mean": 0.02}
    for bad in ("ttft_p99", "foo_p99=1s", "ttft_p99=-1s", "ttft_p98=1s", "ttft_p99=fast"):
        with pytest.raises(KvplanError):
            parse_slo(bad)


def test_arrivals_poisson_and_gamma():
    poisson = arrival_times(10.0, 2000, None, 1.0, seed=1)
    gaps = [b - a for a, b in zip(poisson, poisson[1:])]
    assert len(poisson) == 2000 and poisson[0] == 0.0
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)
    bursty = [b - a for a, b in zip(*(lambda t: (t, t[1:]))(arrival_times(10.0, 2000, None, 0.25, seed=1)))]
    var = lambda xs: sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / len(xs)  # noqa: E731
    assert var(bursty) > 2 * var(gaps)  # burstiness < 1: more variable gaps, same mean rate
    assert arrival_times(10.0, None, 1.0, seed=1) == [t for t in arrival_times(10.0, 100, None, seed=1) if t < 1.0]


def test_open_loop_counts_from_the_scheduled_time_and_respects_the_cap():
    w = Workload(prompt_tokens=8, output_tokens=4, nonce="t")
    with FakeServer(FakeBehaviour(first_token_delay_s=0.1, token_gap_s=0.01)) as srv:
        load = asyncio.run(run_open_loop(srv.url, "fake", "completions", 200.0, w.request, total_requests=20,
                                         max_concurrency=2))
        assert srv.behaviour.max_in_flight <= 2
    recs = load.records
    assert len(recs) == 20 and all(r.ok for r in recs)
    # At 200 req/s against a cap of 2 slots of ~0.14 s, requests wait for a slot: the wait is in their TTFT.
    assert max(r.sent_s - r.scheduled_s for r in recs) > 0.5
    assert all(r.ttft_s >= r.first_token_s - r.sent_s for r in recs)


def _cli(args, timeout=120):
    return subprocess.run(kvplan_cmd(*args), capture_output=True, text=True, timeout=timeout, env=bench_env())


class _Html(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.urls = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.urls += [v for _, v in attrs if v and ("http:" in v or "https:" in v or v.startswith("//"))]


def _check_html(text: str, charts: int) -> _Html:
    parser = _Html()
    parser.feed(text)
    assert parser.tags.count("svg") == charts, parser.tags.count("svg")
    assert not parser.urls and "http://" not in text and "https://" not in text
    assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
    return parser


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A rate sweep and a concurrency sweep, both with SLOs, against the fake server."""
    out = tmp_path_factory.mktemp("runs")
    slo = "ttft_p99=80ms,e2e_p99=10s"
    with FakeServer(FakeBehaviour(tokens=6, first_token_delay_s=0.02, token_gap_s=0.005)) as srv:
        rate = _cli(["--url", srv.url, "--sweep-rate", "20,40", "--requests", "30", "--max-concurrency", "4",
                     "--prompt", "8", "--output", "6", "--slo", slo, "--no-warmup", "--out", str(out / "rate"), "--json"])
        conc = _cli(["--url", srv.url, "--sweep", "1,8", "--requests", "24", "--prompt", "8", "--output", "6",
                     "--slo", slo, "--no-warmup", "--out", str(out / "conc"), "--json"])
    assert rate.returncode == 0, rate.stderr
    assert conc.returncode == 0, conc.stderr
    return (next((out / "rate").iterdir()), json.loads(rate.stdout)), (next((out / "conc").iterdir()), json.loads(conc.stdout))


def test_rate_sweep_with_slos(runs):
    (run, s), _ = runs
    assert s["load_mode"] == "rate" and "open loop" in s["load_description"] and s["latency_from"] == "scheduled"
    assert [p["rate"] for p in s["points"]] == [20.0, 40.0]
    for p in s["points"]:
        assert p["mode"] == "rate" and p["requests_ok"] == 30 and p["ttft"]["n"] == 30
        assert p["concurrency"] <= 4 and p["max_concurrency"] == 4
        assert set(p["slo"]) == {"ttft_p99", "e2e_p99"} and p["goodput_share"] is not None
        assert any("TTFT p99 rests on 30 samples" in w for w in p["warnings"])
        assert p["send_lag"]["n"] == 30
    assert s["highest_load_meeting_slo"] in (None, 20.0, 40.0)
    report = (run / "report.md").read_text()
    assert "| rate req/s | peak in flight |" in report and "(30!)" in report and "**Warning**" in report
    assert "SLOs: ttft_p99 <= 80 ms, e2e_p99 <= 10 s" in report


def test_concurrency_sweep_csv_and_html(runs):
    _, (run, s) = runs
    assert s["load_mode"] == "concurrency" and [p["requests"] for p in s["points"]] == [24, 24]
    rows = list(csv.DictReader((run / "points.csv").open()))
    assert [r["concurrency"] for r in rows] == ["1", "8"] and rows[0]["ttft_n"] == "24"
    assert float(rows[0]["ttft_p99_ms"]) == pytest.approx(s["points"][0]["ttft"]["p99"] * 1000, abs=1e-3)
    reqs = list(csv.DictReader((run / "requests.csv").open()))
    assert len(reqs) == 48 and all(float(r["sent_s"]) >= float(r["scheduled_s"]) for r in reqs)
    assert {"scheduled_s", "sent_s", "send_lag_ms", "ttft_ms", "itl_mean_ms"} <= set(reqs[0])
    # six charts against the load, three over the run's time (its scrapes), one TTFT distribution (its requests)
    _check_html((run / "report.html").read_text(), charts=10)


def _report_app():
    from kvplan.cli.report_cmd import report

    app = typer.Typer()
    app.command()(report)
    app.command("x")(lambda: None)  # two commands: typer keeps `report` as a sub-command
    return app


def test_report_compares_runs_and_vllm_results_offline(runs, tmp_path):
    (rate_run, _), (conc_run, _) = runs
    vllm = tmp_path / "vllm"
    vllm.mkdir()
    for f in DATA.glob("vllm-bench-serve-*.json"):
        shutil.copy(f, vllm)
    html = tmp_path / "compare.html"
    result = CliRunner().invoke(_report_app(), ["report", str(conc_run), str(vllm), str(rate_run), "--html", str(html),
                                                 "--json"])
    assert result.exit_code == 0, result.output
    summaries = json.loads(result.stdout)
    assert [s["source"] for s in summaries] == ["kvplan", "vllm bench serve", "kvplan"]
    v = summaries[1]
    assert [p["concurrency"] for p in v["points"]] == [16, 32]
    assert v["points"][0]["ttft"]["p99"] == pytest.approx(0.70255) and v["points"][0]["ttft"]["n"] == 200
    assert v["points"][0]["server"] == {} and "no preemption" in v["points"][0]["notes"][0]
    text = html.read_text()
    _check_html(text, charts=12)  # streams (this run, vllm bench's) and request rates: six charts each
    assert text.count("<h2>") == 5  # "Runs by concurrency", "Runs by request rate", then each run's points
    assert text.index("<h2>Runs by concurrency</h2>") < text.index("<h2>Runs by request rate</h2>")


def test_report_applies_new_slos_from_requests(runs):
    _, (conc_run, _) = runs
    result = CliRunner().invoke(_report_app(), ["report", str(conc_run), "--slo", "ttft_p99=1us", "--json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["highest_load_meeting_slo"] is None
    assert all(p["slo_met"] is False and p["goodput_share"] == 0.0 for p in s["points"])


def test_resume_of_a_finished_run_starts_nothing(runs):
    _, (conc_run, _) = runs
    before = (conc_run / "points.jsonl").read_text()
    (conc_run / "report.html").unlink()
    proc = _cli(["--resume", str(conc_run), "--json"])  # the fake server is gone: nothing may be contacted
    assert proc.returncode == 0, proc.stderr
    assert (conc_run / "points.jsonl").read_text() == before and (conc_run / "report.html").is_file()
    assert json.loads(proc.stdout)["status"] == "complete"


def test_duration_sizes_points():
    w = Workload(prompt_tokens=8, output_tokens=2, nonce="t")
    from kvplan.bench.loadgen import run_closed_loop

    with FakeServer(FakeBehaviour(first_token_delay_s=0.02)) as srv:
        load = asyncio.run(run_closed_loop(srv.url, "fake", "completions", 2, None, w.request, duration_s=0.3))
    assert 4 <= len(load.records) <= 40 and all(r.scheduled_s < 0.3 for r in load.records)


def test_cli_refuses_mixed_loads(tmp_path):
    proc = _cli(["--url", "http://127.0.0.1:9", "--sweep", "1,2", "--rate", "3", "--out", str(tmp_path)])
    assert proc.returncode == 2 and "different loads" in proc.stderr


@pytest.mark.parametrize("flag, connections", [(None, 1), ("--no-keep-alive", 6)])
def test_bench_reuses_connections_unless_told_not_to(tmp_path, flag, connections):
    """One stream sending 6 requests: one connection kept alive (the fake server sees one client port),
    or 6 with --no-keep-alive; the choice is kept in run.json, and each point counts its retries."""
    behaviour = FakeBehaviour(tokens=3, first_token_delay_s=0.0, token_gap_s=0.001)
    with FakeServer(behaviour) as srv:
        done = _cli(["--url", srv.url, "--sweep", "1", "--requests", "6", "--prompt", "8", "--output", "3",
                     "--no-warmup", "--scrape-interval", "30", "--out", str(tmp_path), "--json"] + ([flag] if flag else []))
    assert done.returncode == 0, done.stderr
    run = next(tmp_path.iterdir())
    assert json.loads((run / "run.json").read_text())["config"]["keep_alive"] is (flag is None)
    assert len(behaviour.load_peers) == connections
    point = json.loads(done.stdout)["points"][0]
    assert point["requests_ok"] == 6 and point["retries"] == 0
    assert next(csv.DictReader((run / "points.csv").open()))["retries"] == "0"
