"""Predicted next to measured latency on the real vLLM CPU engine: calibrate on one bench run
(`kvplan calibrate --bench`), bench another workload with that calibration (BenchConfig.steptime,
`kvplan bench --steptime RUN`), and check every point carries the prediction the simulator gives
when called directly on the point's own load, and that the reports show it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.bench import bench_env, engine_required, kvplan_cmd

from kvplan.bench.steptime_io import load_steptime, run_inputs
from kvplan.plan.simulate import closed_loop
from kvplan.plan.steptime import predict_latency

pytestmark = [pytest.mark.engine, engine_required]

PER_STREAM = 6


def test_bench_predicts_every_point_with_a_calibration(cpu_engine, tmp_path):
    from typer.testing import CliRunner

    from kvplan.bench import store as st
    from kvplan.bench.config import BenchConfig
    from kvplan.bench.runner import BenchRun
    from kvplan.cli.app import app

    proc = subprocess.run(
        kvplan_cmd("--url", cpu_engine.cfg.base_url, "--out", str(tmp_path / "calib"), "--json", "--sweep", "1,2,4",
                   "--requests-per-stream", str(PER_STREAM), "--prompt", "64", "--output", "64"),
        capture_output=True, text=True, timeout=300, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    calib = Path(json.loads(proc.stdout)["run_dir"])
    r = CliRunner().invoke(app, ["calibrate", "--bench", str(calib), "--json"])
    assert r.exit_code == 0, r.output

    cfg = BenchConfig(url=cpu_engine.cfg.base_url, workload={"prompt_tokens": 128, "output_tokens": 32},
                      sweep=[1, 2, 3], requests_per_stream=PER_STREAM, warmup=False, steptime=str(calib))
    run_dir = tmp_path / "predicted"
    run_dir.mkdir()
    summary = BenchRun(cfg, st.RunStore(run_dir)).execute()
    assert summary.latency_model.source == "calibrated" and str(calib) in summary.latency_model.basis

    model = load_steptime(calib)
    _, _, lengths, sched, _, _, _ = run_inputs(run_dir)
    for p in summary.points:
        assert p.status == "ok" and p.predicted_latency is not None and p.predicted_latency.error is None
        direct = predict_latency(sched, closed_loop(p.concurrency, lengths, PER_STREAM, p.first_index), model, (50, 99))
        assert p.predicted_latency.ttft.p50 == pytest.approx(direct.ttft["p50"], abs=1e-6)
        assert p.predicted_latency.e2e.p99 == pytest.approx(direct.e2e["p99"], abs=1e-6)
        assert p.predicted_latency.output_tokens_per_s == pytest.approx(direct.output_tokens_per_s, abs=0.01)
        print(f"c={p.concurrency}: TTFT p50 predicted {p.predicted_latency.ttft.p50 * 1000:.1f} ms, measured "
              f"{p.ttft.p50 * 1000:.1f} ms; tok/s {p.predicted_latency.output_tokens_per_s:.0f} / "
              f"{p.throughput_tok_s:.0f}", flush=True)
    report = (run_dir / "report.md").read_text()
    assert "## Latency: predicted / measured" in report and "step times calibrated" in report
    assert '<table class="predicted">' in (run_dir / "report.html").read_text()
