"""Issue 10's latency goal on the real vLLM CPU engine: calibrate the step-time model on one
workload (`kvplan calibrate --bench RUN`), predict ANOTHER workload (other prompt and output
lengths) with the simulator, and compare with what the engine measures at every load below
saturation (no KV wait, no preemption).

The pool is the bench tests' pinned one (17 blocks of 32, context 512): the calibration workload
(64 + 64 tokens, 4 blocks a request) is measured at 1-4 streams; the predicted one (128 + 32,
5 blocks a request: 3 streams fit) at 1-3.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench_helpers import (  # noqa: E402
    bench_env,
    cpu_engine_fixture,
    engine_required,
    kvplan_cmd,
)

from kvplan.plan.simulate import closed_loop  # noqa: E402
from kvplan.plan.steptime import predict_latency  # noqa: E402
from kvplan.plan.steptime_io import load_steptime, run_inputs  # noqa: E402

pytestmark = [pytest.mark.engine, engine_required]

PER_STREAM = 20
CALIBRATE = (["--prompt", "64", "--output", "64"], "1,2,3,4")
PREDICT = (["--prompt", "128", "--output", "32"], "1,2,3")


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    """tests/bench's engine: one real CPU engine pinned to POOL_BLOCKS x BLOCK_SIZE."""
    yield from cpu_engine_fixture(tmp_path_factory)


def bench(engine, out: Path, flags: list[str], sweep: str) -> dict:
    proc = subprocess.run(
        kvplan_cmd("--url", engine.cfg.base_url, "--out", str(out), "--json", "--sweep", sweep,
                   "--requests-per-stream", str(PER_STREAM), *flags),
        capture_output=True, text=True, timeout=300, env=bench_env())
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


def err(pair) -> float:
    predicted, measured = pair
    return abs(predicted - measured) / measured


def describe(rows) -> str:
    return "; ".join(f"c={r['c']}: TTFT p50 {r['ttft_p50'][0] * 1000:.1f}/{r['ttft_p50'][1] * 1000:.1f} ms, "
                     f"p99 {r['ttft_p99'][0] * 1000:.1f}/{r['ttft_p99'][1] * 1000:.1f} ms, "
                     f"{r['tok_s'][0]:.0f}/{r['tok_s'][1]:.0f} tok/s" for r in rows)


def test_the_predicted_workload_has_loads_below_saturation(comparison):
    assert [r["c"] for r in comparison][:2] == [1, 2], describe(comparison)


def test_calibration_on_the_engine_gives_a_usable_model(comparison):
    """`kvplan calibrate --bench` on a real CPU-engine run gives a step-time model that predicts
    another workload's TTFT p50 within a factor of 3 and its output tokens/s within a factor of 2,
    at every load below saturation: bounds that catch a wrong unit, a lost term or a broken replay.

    Issue 10's 20% goal is NOT asserted: on 2 cores the engine does not repeat itself that closely.
    benchmarks/bench_latency_prediction.py runs the same workload several times: on a quiet machine
    three runs differed from each other by 2-23% in TTFT p50 and 4-34% in tokens/s at one load (the
    API server, starved by the engine's spinning loop, at times delivers a whole stream in one burst,
    so the client's first token comes with its last), and by up to 312% in TTFT p99; while other
    jobs loaded the machine, by up to 25% and 53%. The calibrated model was within 20% of TTFT p50
    and tokens/s at every load in one run of this test here and in one benchmark run of three repeats, and
    up to 29% / 34% off in another, whose calibration run came out faster than its repeats."""
    assert comparison, "no load below saturation to compare"
    for r in comparison:
        (ttft_pred, ttft_meas), (tok_pred, tok_meas) = r["ttft_p50"], r["tok_s"]
        assert 1 / 3 <= ttft_pred / ttft_meas <= 3, describe(comparison)
        assert 0.5 <= tok_pred / tok_meas <= 2, describe(comparison)
