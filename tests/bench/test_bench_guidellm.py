"""GuideLLM benchmark reports read by `kvplan report` (and, in tests/gate, by `kvplan check --bench`).

No example report file exists in GuideLLM's repository (its tests build reports in code), so the two
reports in tests/bench/data were built field by field to GuideLLM's own pydantic schema by
tests/bench/data/make_guidellm_reports.py:
GenerativeBenchmarksReport (args, benchmarks) and GenerativeBenchmark (config with the SchedulingStrategy,
scheduler_state, scheduler_metrics, metrics, requests) from
https://github.com/vllm-project/guidellm/blob/main/src/guidellm/benchmark/schemas/generative/report.py and
.../generative/benchmark.py; GenerativeMetrics (request_latency in s; time_to_first_token_ms,
inter_token_latency_ms, time_per_output_token_ms in ms, each a StatusDistributionSummary) from
.../generative/metrics.py; DistributionSummary and Percentiles (p001 ... p999) from
https://github.com/vllm-project/guidellm/blob/main/src/guidellm/schemas/statistics.py; the strategies
(``synchronous``, ``concurrent`` with ``streams``, ``throughput``, ``constant``/``poisson`` with ``rate``)
from src/guidellm/scheduler/strategies.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.bench.external import is_guidellm_report, is_vllm_result, read_external, read_guidellm_report
from kvplan.errors import KvplanError

DATA = Path(__file__).parent / "data"


def test_concurrent_report_becomes_typed_points_per_load():
    s = read_guidellm_report(DATA / "guidellm-concurrent.json")
    assert s.source == "GuideLLM" and s.model == "meta-llama/Llama-3.1-8B-Instruct" and s.load_mode == "concurrency"
    assert [p.concurrency for p in s.points] == [4, 16, 64]
    p = s.points[1]
    assert p.mode == "concurrency" and p.status == "ok" and p.requests_ok == 240
    assert p.ttft.p99 == pytest.approx(0.3343933) and p.ttft.n == 240  # ms in the report, seconds here
    assert p.e2e.p99 == pytest.approx(3.52587)  # request_latency is already in seconds
    assert p.itl.n == 240 * 127  # GuideLLM weights ITL by the token gaps of each request
    assert p.tpot.n == 240  # one TPOT per request
    assert p.throughput_tok_s == pytest.approx(1024.0) and p.request_throughput == pytest.approx(8.0)
    # what the source cannot show
    assert p.server.empty and p.server.model_dump() == {} and not p.preempted and p.label == "not measured"
    assert any("no preemption, KV wait or KV fill" in n for n in p.notes)
    assert s.measured_first_preemption is None and s.measured.first_preemption is None
    assert s.model_dump()["measured"] == {} and s.prediction is None  # nothing claimed that the report does not hold


def test_sweep_report_keeps_the_rate_benchmarks_and_says_what_it_left_out():
    s = read_external(DATA / "guidellm-sweep.json")
    assert s.load_mode == "rate" and [p.rate for p in s.points] == [2.5, 5.0]
    assert s.points[1].burstiness == 1.0  # poisson
    assert "left out" in s.load_description and "throughput" in s.load_description
    assert any("TTFT p99 rests on 75 samples" in w for w in s.points[0].warnings)


def test_detection_and_bad_files(tmp_path):
    data = json.loads((DATA / "guidellm-concurrent.json").read_text())
    assert is_guidellm_report(data) and not is_vllm_result(data)
    assert not is_guidellm_report(json.loads((DATA / "vllm-bench-serve-c16.json").read_text()))
    only_throughput = dict(data, benchmarks=[dict(data["benchmarks"][0], config=dict(
        data["benchmarks"][0]["config"], strategy={"type_": "throughput", "max_concurrency": None}))])
    bad = tmp_path / "throughput.json"
    bad.write_text(json.dumps(only_throughput))
    with pytest.raises(KvplanError, match="no GuideLLM benchmark at a fixed concurrency or request rate"):
        read_external(bad)
    other = tmp_path / "other.json"
    other.write_text('{"benchmarks": []}')
    with pytest.raises(KvplanError, match="neither"):
        read_external(other)


def test_kvplan_report_renders_and_compares_guidellm_offline(tmp_path):
    html = tmp_path / "cmp.html"
    proc = subprocess.run([sys.executable, "-m", "kvplan", "report", str(DATA / "guidellm-concurrent.json"),
                           str(DATA / "vllm-bench-serve-c16.json"), "--html", str(html), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [s["source"] for s in out] == ["GuideLLM", "vllm bench serve"]
    assert html.is_file() and "GuideLLM" in html.read_text()
    table = subprocess.run([sys.executable, "-m", "kvplan", "report", str(DATA / "guidellm-sweep.json")],
                           capture_output=True, text=True, timeout=120, env={"COLUMNS": "100", "PATH": ""})
    assert table.returncode == 0, table.stderr
    assert "(GuideLLM)" in table.stdout and "2.5" in table.stdout
