"""Typed results (kvplan.bench.results): run folders written before the models existed load and keep
their JSON; the human tables stay whole at 80 columns (no "…", every load and p99 shown)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer

from kvplan.bench.render import load_summary
from kvplan.bench.results import (
    BenchSummary,
    LatencyStats,
    OnsetPrediction,
    PlannerCapacity,
    PointResult,
    PredictedPoint,
    ServerFigures,
    SloResult,
)
from kvplan.bench.sweep import Onset
from kvplan.engines.base import EngineCapacity

DATA = Path(__file__).parent / "data"
#: Written by kvplan 0.1.0 before the typed results (dicts between runner, reports and gate), against
#: the fake server with a cache_config_info: a concurrency sweep (prediction, SLOs) and a rate sweep.
OLD_RUNS = ("old-run-conc", "old-run-rate")


@pytest.fixture(params=OLD_RUNS)
def old_run(request, tmp_path) -> Path:
    run = tmp_path / request.param
    shutil.copytree(DATA / request.param, run)
    return run


def test_an_old_run_folder_loads_typed_and_writes_the_same_json(old_run):
    raw = json.loads((old_run / "summary.json").read_text())
    summary = load_summary(old_run)
    assert isinstance(summary.capacity, EngineCapacity) and summary.capacity.num_blocks == 17
    assert isinstance(summary.prediction, OnsetPrediction) and summary.prediction.first_kv_wait == 17
    assert summary.planner is None
    for p in summary.points:
        assert isinstance(p.ttft, LatencyStats) and p.ttft.n == p.requests_ok and p.ttft.p99 is not None
        assert isinstance(p.server, ServerFigures) and p.server.preemptions == 0 and p.server.scrapes >= 0
        assert all(isinstance(r, SloResult) and r.met for r in (p.slo or {}).values())
        assert p.send_lag.n == p.requests
    if summary.load_mode == "concurrency":
        onset = summary.measured.first_kv_wait
        assert isinstance(onset, Onset) and (onset.first, onset.searched_up_to) == (None, 4)
        assert summary.measured.agrees_with_prediction.first_kv_wait is False
        assert all(isinstance(p.predicted, PredictedPoint) for p in summary.points)
    else:
        assert summary.measured.first_kv_wait is None and summary.points[0].predicted is None
    # The same JSON back (run_dir is where the folder is now; a sample count is written as an int).
    again = json.loads(summary.model_dump_json())
    assert again.pop("run_dir") == str(old_run) and raw.pop("run_dir")
    assert again == raw
    for line in (old_run / "points.jsonl").read_text().splitlines():
        assert PointResult.model_validate_json(line).model_dump(mode="json") == json.loads(line)
    run_json = json.loads((old_run / "run.json").read_text())
    assert EngineCapacity(**run_json["capacity"]) == summary.capacity
    assert OnsetPrediction.model_validate(run_json["prediction"]) == summary.prediction


def test_an_old_run_folder_is_reported_resumed_and_gated(old_run):
    from typer.testing import CliRunner

    from kvplan.cli.app import app
    from kvplan.gate.check import read_bench_runs

    raw = json.loads((old_run / "summary.json").read_text())
    result = CliRunner().invoke(app, ["report", str(old_run), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {k: v for k, v in out.items() if k != "run_dir"} == {k: v for k, v in raw.items() if k != "run_dir"}
    assert "| first concurrency that waits for KV |" in (old_run / "report.md").read_text()
    # the six charts against the load, then what the folder's data also allow: the run over time (three charts: the
    # concurrency run's two points have a scrape each; the rate run's one point one scrape, too few for a line) and
    # the TTFT distribution (both runs' requests.jsonl)
    assert (old_run / "report.html").read_text().count("<svg") == {"old-run-conc": 10, "old-run-rate": 7}[old_run.name]
    # A finished run: --resume re-renders it, never starts an engine nor contacts the server.
    resumed = subprocess.run(kvplan_cmd("--resume", str(old_run)), capture_output=True, text=True, timeout=120,
                             env=bench_env())
    assert resumed.returncode == 0, resumed.stderr
    assert "run folder:" in resumed.stdout
    [evidence] = read_bench_runs([str(old_run)])
    assert evidence.model == "fake" and evidence.measured_first_preemption is None
    assert [p.ttft.p99 for p in evidence.points] == [p["ttft"]["p99"] for p in raw["points"]]


def test_sparse_figures_keep_the_keys_they_were_given():
    assert ServerFigures().model_dump() == {} and ServerFigures.model_validate({}).empty
    assert ServerFigures(preemptions=2.0).model_dump() == {"preemptions": 2.0}
    full = ServerFigures(**{k: None for k in ServerFigures.model_fields if k not in ("scrapes", "series", "incomplete")},
                         scrapes=0, series=[])
    assert "incomplete" not in full.model_dump()
    assert full.model_copy(update={"incomplete": True}).model_dump()["incomplete"] is True
    assert PlannerCapacity(error="no GPU").model_dump() == {"error": "no GPU"}
    assert set(PlannerCapacity(num_blocks=1, kv_cache_tokens=16, block_size=16, vllm_version="0.11.0").model_dump()) == {
        "num_blocks", "kv_cache_tokens", "block_size", "vllm_version"}
    assert LatencyStats().model_dump() == {} and set(LatencyStats.of([]).model_dump()) == {
        "n", "mean", "p50", "p90", "p95", "p99"}
    with pytest.raises(ValueError):
        LatencyStats.model_validate({"n": 1, "p42": 0.1})  # a figure kvplan never writes


def test_kvplan_schema_bench_describes_the_typed_summary():
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    result = CliRunner().invoke(app, ["schema", "bench"])
    assert result.exit_code == 0, result.output
    defs = json.loads(result.stdout)["$defs"]
    assert {"PointResult", "LatencyStats", "ServerFigures", "OnsetPrediction", "MeasuredOnsets", "Onset",
            "EngineCapacity", "PlannerCapacity", "PredictedPoint", "SloResult"} <= set(defs)
    assert set(defs["LatencyStats"]["properties"]) == {"n", "mean", "p50", "p90", "p95", "p99", "p50_ci", "p99_ci",
                                                      "chosen"}


# ------------------------------------------------------------------------------------------ 80 columns


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _assert_whole(text: str, points: list[PointResult], width: int = 80) -> None:
    from kvplan.units import format_ms as _ms

    assert "…" not in text, text
    assert all(len(line) <= width for line in text.splitlines()), text
    lines = _table_lines(text)
    for p in points:
        load = str(p.concurrency)
        rows = [line for line in lines if line.split()[0] == load]
        assert rows, (load, text)
        for p99 in (f"/{_ms(p.ttft.p99)} (", f"/{_ms(p.itl.p99)}", f" {_ms(p.e2e.p99)} "):
            assert any(p99 in row + " " for row in rows), (load, p99, text)


def test_a_live_run_prints_a_whole_table_at_80_columns(tmp_path):
    env = dict(bench_env(), COLUMNS="80")
    with FakeServer(FakeBehaviour(tokens=6, first_token_delay_s=0.01, token_gap_s=0.002,
                                  cache_info='num_gpu_blocks="17",block_size="32"')) as srv:
        proc = subprocess.run(kvplan_cmd("--url", srv.url, "--sweep", "1,8,64", "--requests", "64", "--prompt", "8",
                                         "--output", "6", "--no-warmup", "--out", str(tmp_path), "--slo",
                                         "ttft_p99=1s"),
                              capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    summary = BenchSummary.model_validate_json(next(tmp_path.iterdir()).joinpath("summary.json").read_text())
    assert [p.concurrency for p in summary.points] == [1, 8, 64]
    _assert_whole(proc.stdout, summary.points)
    assert "\x1b[" not in proc.stdout  # a CI log gets no escape codes
    assert all(len(line) <= 80 for line in proc.stderr.splitlines())  # the progress display too


def test_the_table_splits_rather_than_cuts_at_80_columns(capsys, monkeypatch):
    from kvplan.cli.bench_cmd import render

    summary = load_summary(DATA / "old-run-conc")
    big = []
    for i, p in enumerate(summary.points):
        lat = p.ttft.model_copy(update={"p50": 12.3456, "p99": 98.765 + i, "n": 4096})
        big.append(p.model_copy(update={
            "concurrency": 1024 * (i + 1), "label": "admission-limited", "ttft": lat,
            "e2e": p.e2e.model_copy(update={"p99": 123.4}), "throughput_tok_s": 123456.7,
            "server": p.server.model_copy(update={"preemptions": 12345.0, "peak_waiting": 999.0, "peak_kv_usage": 1.0})}))
    long_model = "meta-llama/Llama-3.1-405B-Instruct-FP8-" + "x" * 60
    monkeypatch.setenv("COLUMNS", "80")
    for s in (summary, summary.model_copy(update={"points": big, "model": long_model})):
        render(s)
        out = capsys.readouterr().out
        _assert_whole(out, s.points)
        assert "".join(out.split()).count("".join(s.model.split())) == 1  # the model id whole (wrapped, not cut)
    monkeypatch.setenv("COLUMNS", "200")
    render(summary.model_copy(update={"points": big}))
    wide = capsys.readouterr().out
    assert sum("TTFT ms" in line for line in wide.splitlines()) == 1  # one table when it fits


def test_kvplan_report_tables_at_80_columns(tmp_path):
    runs = []
    for name in OLD_RUNS:
        shutil.copytree(DATA / name, tmp_path / name)
        runs.append(str(tmp_path / name))
    env = dict(os.environ, COLUMNS="80", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "kvplan", "report", *runs, "--html", str(tmp_path / "c.html")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout and all(len(line) <= 80 for line in proc.stdout.splitlines()), proc.stdout
    conc = load_summary(tmp_path / "old-run-conc")
    for p in conc.points:
        assert any(line.split()[0] == str(p.concurrency) for line in _table_lines(proc.stdout))
