"""llm-d-benchmark's benchmark report v0.2 written from stored kvplan runs (tests/bench/data/old-run-*), checked
against llm-d-benchmark's own JSON Schema and its model's unit rules (tests/helpers/llmd.py). The engine test
tests/bench/test_bench_engine.py checks the same on a real CPU-engine run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers.llmd import SCHEMA, assert_valid_llmd_reports, schema_errors

from kvplan.bench.outputs.llmd import FILE_PREFIX, llmd_reports
from kvplan.bench.render import rerender
from kvplan.bench.results import BenchSummary

OLD_RUNS = Path(__file__).parent / "data"


@pytest.fixture
def old_runs(tmp_path):
    """The stored concurrency and rate runs, copied: writing the reports adds files to the folder."""
    for name in ("old-run-conc", "old-run-rate"):
        shutil.copytree(OLD_RUNS / name, tmp_path / name)
    return tmp_path / "old-run-conc", tmp_path / "old-run-rate"


def test_the_vendored_schema_is_llm_d_benchmarks_v0_2():
    assert SCHEMA["title"] == "Benchmark Report v0.2" and SCHEMA["required"] == ["run", "results"]
    assert SCHEMA["properties"]["version"]["default"] == "0.2"


def test_a_concurrency_run_writes_one_valid_report_a_point(old_runs):
    conc, _ = old_runs
    rerender(conc)  # what `kvplan report RUN` does
    reports = assert_valid_llmd_reports(conc)
    assert sorted(reports) == [0, 1]
    r = reports[1]
    assert r["version"] == "0.2" and r["run"]["description"] == "fake [kvplan old-run-conc]"
    assert reports[0]["run"]["eid"] == r["run"]["eid"] and reports[0]["run"]["uid"] != r["run"]["uid"]
    # the stored run (old-run-conc/summary.json, run.json): concurrency 4, 8 requests of prompt 8 + output 6
    load = r["scenario"]["load"]["standardized"]
    assert (load["tool"], load["concurrency"], load["source"]) == ("kvplan", 4, "random") and "rate_qps" not in load
    assert load["input_seq_len"] == {"distribution": "fixed", "value": 8}
    assert load["output_seq_len"] == {"distribution": "fixed", "value": 6}
    agg = r["results"]["request_performance"]["aggregate"]
    assert agg["requests"]["total"] == 8 and agg["requests"]["failures"] == 0
    assert agg["requests"]["input_length"] == {"units": "count", "mean": 8.0, "min": 8, "max": 8}
    assert agg["requests"]["output_length"] == {"units": "count", "mean": 6.0, "min": 6, "max": 6}
    ttft = agg["latency"]["time_to_first_token"]
    assert ttft["units"] == "s" and ttft["p99"] == 0.03181907104968559  # summary.json's point 1, seconds
    assert agg["latency"]["inter_token_latency"]["units"] == "s/token"
    assert agg["throughput"]["output_token_rate"] == {"units": "tokens/s", "mean": 421.49}
    assert agg["throughput"]["request_rate"] == {"units": "queries/s", "mean": 70.2487}
    # 8 requests x 8 prompt tokens over the point's 0.1139 s wall
    assert agg["throughput"]["input_token_rate"]["mean"] == round(64 / 0.1139, 2)
    assert r["run"]["time"] == {"start": "2026-12-01T08:16:31+00:00", "end": "2026-12-01T08:16:31.113900+00:00",
                                "duration": "PT0.1139S"}
    own = r["results"]["observability"]["kvplan"]
    assert own["kv_pool"] == {"num_blocks": 17, "block_size": 32, "kv_cache_tokens": 544, "source": "metrics"}
    assert own["preemptions"] == 0 and own["preempted"] is False
    engine = r["scenario"]["stack"][0]["standardized"]
    assert engine["model"] == {"name": "fake"} and engine["accelerator"]["count"] == 0  # no GPU figures taken


def test_a_rate_point_says_its_rate_and_cap(old_runs):
    _, rate = old_runs
    rerender(rate)
    (r,) = assert_valid_llmd_reports(rate).values()
    load = r["scenario"]["load"]["standardized"]
    assert load["rate_qps"] == 20.0 and load["concurrency"] == 4  # --sweep-rate 20 --max-concurrency 4
    assert r["results"]["request_performance"]["aggregate"]["requests"]["total"] == 6


def test_the_check_fails_on_a_report_that_breaks_the_schema(old_runs):
    """The validation above can fail: the schema's required fields, its closed objects and the unit rules."""
    conc, _ = old_runs
    rerender(conc)
    good = yaml.safe_load((conc / f"{FILE_PREFIX}1.yaml").read_text())
    no_uid = json.loads(json.dumps(good))
    del no_uid["run"]["uid"]
    assert any("'uid' is a required property" in e for e in schema_errors(no_uid))
    extra = json.loads(json.dumps(good))
    extra["results"]["request_performance"]["aggregate"]["latency"]["ttft"] = {"units": "s", "mean": 1.0}
    assert any("Additional properties" in e for e in schema_errors(extra))
    ms_rate = json.loads(json.dumps(good))
    ms_rate["results"]["request_performance"]["aggregate"]["throughput"]["request_rate"]["units"] = "ms"
    assert schema_errors(ms_rate) == ["throughput.request_rate: units 'ms'"]
    zero = json.loads(json.dumps(good))
    zero["scenario"]["load"]["standardized"]["concurrency"] = 0  # LoadStandardized.concurrency >= 1
    assert schema_errors(zero) == ["scenario.load.standardized.concurrency: 0"]


def test_a_run_json_kvplan_cannot_read_leaves_the_load_to_the_prediction(old_runs):
    conc, _ = old_runs
    run = json.loads((conc / "run.json").read_text())
    run["config"]["workload"] = {"prompt_tokens": "8", "distribution": "zipf", "trace": [[1]]}
    (conc / "run.json").write_text(json.dumps(run))
    rerender(conc)
    reports = assert_valid_llmd_reports(conc)
    # the summary's prediction: prompt 8, output 6, exact (identical requests)
    assert reports[1]["scenario"]["load"]["standardized"]["input_seq_len"] == {"distribution": "fixed", "value": 8}
    (conc / "run.json").write_text("{")
    rerender(conc)
    assert_valid_llmd_reports(conc)


def test_distributions_prefix_and_a_failed_point():
    summary = BenchSummary.model_validate(json.loads((OLD_RUNS / "old-run-conc" / "summary.json").read_text()))
    failed = summary.points[0].model_copy(update={"status": "failed", "requests_ok": 0, "requests_failed": 8,
                                                  "error": "8 requests failed"})
    summary = summary.model_copy(update={"points": [failed, summary.points[1]]})
    workload = {"prompt_tokens": 100, "output_tokens": 20, "distribution": "uniform", "spread": 0.25,
                "shared_prefix": 0.5}
    reports = {name: yaml.safe_load(text) for name, text in llmd_reports(summary, {"workload": workload}).items()}
    for report in reports.values():
        assert schema_errors(report) == []
    first = reports[f"{FILE_PREFIX}0.yaml"]
    load = first["scenario"]["load"]["standardized"]
    # uniform in [100 x 0.75, 100 x 1.25] (kvplan.bench.workload); half of the prompt shared by every request
    assert load["input_seq_len"] == {"distribution": "uniform", "value": 100, "min": 75, "max": 125}
    assert load["prefix"]["prefix_len"] == {"distribution": "fixed", "value": 50}
    assert first["results"]["request_performance"]["aggregate"]["requests"] == {"total": 8, "failures": 8}
    assert first["results"]["observability"]["kvplan"]["error"] == "8 requests failed"
    normal = llmd_reports(summary, {"workload": dict(workload, distribution="normal", shared_prefix=0.0)})
    load = yaml.safe_load(normal[f"{FILE_PREFIX}1.yaml"])["scenario"]["load"]["standardized"]
    assert load["input_seq_len"] == {"distribution": "gaussian", "value": 100, "std_dev": 25.0} and "prefix" not in load
