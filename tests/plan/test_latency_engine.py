"""Issue 10's latency goal on the real vLLM CPU engine: calibrate the step-time model on one
workload (`kvplan calibrate --bench RUN`), predict ANOTHER workload (other prompt and output
lengths) with the simulator, and compare with what the engine measures at every load below
saturation (no KV wait, no preemption): TTFT p50 and output tokens/s within 20%, TTFT p99 within 35%.

The engine serves a compute-bound model, as a GPU serves a real one: a 26M-parameter Llama (8
layers, hidden 512) with vLLM's dummy weights (`--load-format dummy`: a config-only folder, nothing
downloaded). On this CPU its steps take tens of ms (a prompt token ~6 ms, a decode step 15-40 ms), so
they, not the API server's scheduling jitter, make the latency. The tests' tiny model decodes a step
in 3-5 ms and answers in 20-45 ms (TTFT p50), mostly the engine's loop and the API server: there the
server, starved by the engine's loop on 2 cores, decides TTFT, and repeated runs of one workload
differed by up to 34% at p50 and 312% at p99 (benchmarks/bench_latency_prediction.py).

Both workloads draw lognormal lengths: with fixed lengths, closed-loop streams either prefill
together every round or stay staggered, decided by how the first wave happens to reach the engine,
and TTFT p50 differed by up to 49% between identical runs. Drawn lengths desynchronise the streams
whatever the first wave did. The pool is the bench tests' pinned one (17 blocks of 32, context 512):
calibration 64 + 64 tokens at 1-4 streams, prediction 128 + 32 at 1-3 (loads that wait for KV are
left out, as the goal says).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.bench import (  # noqa: E402
    DUMMY_WEIGHTS,
    bench_env,
    compute_bound_model,
    cpu_engine_fixture,
    engine_required,
    kvplan_cmd,
)

from kvplan.bench.steptime_io import load_steptime, run_inputs  # noqa: E402
from kvplan.plan.simulate import closed_loop  # noqa: E402
from kvplan.plan.steptime import predict_latency  # noqa: E402

pytestmark = [pytest.mark.engine, engine_required]

PER_STREAM = 20
CALIBRATE = (["--prompt", "64", "--output", "64", "--dist", "lognormal"], "1,2,3,4")
PREDICT = (["--prompt", "128", "--output", "32", "--dist", "lognormal"], "1,2,3")
GOAL = {"ttft_p50": 0.20, "ttft_p99": 0.35, "tok_s": 0.20}  # issue 10
# The regime the goal is judged in: one stream's 64-token prompt takes >= 200 ms (~390 ms on the
# 2-core machine this was written on), five to ten times the tiny model's whole TTFT (20-45 ms, mostly
# the API server). A much faster CPU would need a bigger model; the test says so instead of judging noise.
MIN_PROMPT_STEP_S = 0.200


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    """One real CPU engine serving the compute-bound model with dummy weights, stopped by PID after."""
    model = compute_bound_model(tmp_path_factory.mktemp("compute-bound-llama"))
    yield from cpu_engine_fixture(tmp_path_factory, model, DUMMY_WEIGHTS)


def bench(engine, out: Path, flags: list[str], sweep: str) -> dict:
    proc = subprocess.run(
        kvplan_cmd("--url", engine.cfg.base_url, "--out", str(out), "--json", "--sweep", sweep,
                   "--requests-per-stream", str(PER_STREAM), *flags),
        capture_output=True, text=True, timeout=900, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def comparison(cpu_engine, tmp_path_factory):
    """Per load of the predicted workload below saturation: (c, predicted, measured) figures."""
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    tmp = tmp_path_factory.mktemp("latency")
    calib = bench(cpu_engine, tmp / "calibrate", *CALIBRATE)
    r = CliRunner().invoke(app, ["calibrate", "--bench", calib["run_dir"], "--json"])
    assert r.exit_code == 0, r.output
    model = load_steptime(Path(calib["run_dir"]))
    assert model.source == "calibrated"
    one_stream = next(p for p in run_inputs(Path(calib["run_dir"]))[1] if p["concurrency"] == 1)
    if one_stream["ttft"]["p50"] < MIN_PROMPT_STEP_S:
        pytest.skip(f"this CPU computes a 64-token prompt in {one_stream['ttft']['p50'] * 1000:.0f} ms: the API "
                    "server's jitter, not the engine's steps, would decide the latency compared")
    target = bench(cpu_engine, tmp / "predict", *PREDICT)
    run = Path(target["run_dir"])
    _, points, lengths, sched, _, _, _ = run_inputs(run)
    rows = []
    for p in points:
        if p["status"] != "ok" or p["waited_for_kv"] or p["preempted"]:
            continue
        pred = predict_latency(sched, closed_loop(p["concurrency"], lengths, PER_STREAM, p["first_index"]), model)
        rows.append({"c": p["concurrency"],
                     "ttft_p50": (pred.ttft["p50"], p["ttft"]["p50"]),
                     "ttft_p99": (pred.ttft["p99"], p["ttft"]["p99"]),
                     "tok_s": (pred.output_tokens_per_s, p["throughput_tok_s"])})
    print("\nlatency comparison (predicted, measured):", json.dumps(rows), flush=True)
    (tmp / "comparison.json").write_text(json.dumps(rows))
    return rows


def describe(rows) -> str:
    return "; ".join(f"c={r['c']}: TTFT p50 {r['ttft_p50'][0] * 1000:.1f}/{r['ttft_p50'][1] * 1000:.1f} ms, "
                     f"p99 {r['ttft_p99'][0] * 1000:.1f}/{r['ttft_p99'][1] * 1000:.1f} ms, "
                     f"{r['tok_s'][0]:.1f}/{r['tok_s'][1]:.1f} tok/s (predicted/measured)" for r in rows)


def test_the_predicted_workload_has_loads_below_saturation(comparison):
    assert [r["c"] for r in comparison][:2] == [1, 2], describe(comparison)


def test_calibrated_latency_meets_issue_10s_goal(comparison):
    """Calibrated on one workload, the prediction of another is within 20% of the engine's TTFT p50
    and output tokens/s, and within 35% of its TTFT p99, at every load below saturation."""
    assert comparison, "no load below saturation to compare"
    for r in comparison:
        for metric, bound in GOAL.items():
            predicted, measured = r[metric]
            assert abs(predicted / measured - 1) <= bound, f"{metric} at c={r['c']}: {describe(comparison)}"
