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
calibration 64 + 64 tokens at 1-3 streams, prediction 128 + 32 at 1-2 (the loads below the first KV wait, which
is what the goal judges).
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
from pathlib import Path

import pytest
from helpers.bench import (  # noqa: E402
    DUMMY_WEIGHTS,
    EngineSpec,
    bench_env,
    compute_bound_model,
    cpu_engine_fixture,
    engine_required,
    kvplan_cmd,
)

from kvplan.bench.steptime_io import load_steptime, run_inputs  # noqa: E402
from kvplan.plan.simulate import closed_loop  # noqa: E402
from kvplan.plan.steptime import predict_latency  # noqa: E402
from kvplan.units import cdiv  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.alone, engine_required]

PER_STREAM = 20
# Loads below saturation only: 4 streams of 64 + 64 and 3 of 128 + 32 wait for KV in 16 usable blocks of 32 (the goal
# leaves them out, and so does the calibration: `calibrate_bench`), and cost 2.6 minutes of CI (2026-12-07, the EPYC).
CALIBRATE = (["--prompt", "64", "--output", "64", "--dist", "lognormal"], "1,2,3")
PREDICT = (["--prompt", "128", "--output", "32", "--dist", "lognormal"], "1,2")
GOAL = {"ttft_p50": 0.20, "ttft_p99": 0.35, "tok_s": 0.20}  # issue 10
# The regime the goal is judged in: one stream's 64-token prompt takes >= 200 ms (~390 ms on the
# 2-core machine this was written on), five to ten times the tiny model's whole TTFT (20-45 ms, mostly
# the API server). A much faster CPU would need a bigger model; the test says so instead of judging noise.
MIN_PROMPT_STEP_S = 0.200


#: The compute-bound model with dummy weights on the pinned pool.
ENGINE = EngineSpec("cpu_engine", compute_bound_model, DUMMY_WEIGHTS)


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    """One real CPU engine serving ENGINE, stopped by PID after."""
    yield from cpu_engine_fixture(tmp_path_factory, ENGINE)


@functools.cache
def benchmark():
    """benchmarks/bench_latency_prediction.py, whose engine speed probe (`speed_probe`, `speed_drift`) the test shares:
    loaded when a test first probes, not at collection (the script's top level puts the repository on sys.path)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_latency_prediction.py"
    spec = importlib.util.spec_from_file_location("bench_latency_prediction", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The speed probe run before each bench (the two workloads' prompt lengths; 33 output tokens, so that its decode step,
#: a difference of two requests, spans 32 steps) and the drift between two probes past which a missed goal is measured
#: again: the shared 2-core machines have run this engine 20-35% faster minutes after a calibration (2026-12-06, in
#: `.ci/run`: 1-stream decode steps of 22.4 ms in the calibration, 14.5 ms in the prediction run 4 minutes later, at a
#: longer context), which is the machine, not the model.
PROBE = {"lengths": (64, 128), "output": 33}
MAX_DRIFT = 0.10


def bench(engine, out: Path, flags: list[str], sweep: str) -> dict:
    """`kvplan bench` of one workload; the engine's speed just before it (`speed_probe`) stored in its run folder."""
    probe = benchmark().speed_probe(engine.cfg.base_url, **PROBE)
    proc = subprocess.run(
        kvplan_cmd("--url", engine.cfg.base_url, "--out", str(out), "--json", "--sweep", sweep,
                   "--requests-per-stream", str(PER_STREAM), *flags),
        capture_output=True, text=True, timeout=900, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    (Path(summary["run_dir"]) / benchmark().SPEED_PROBE_FILE).write_text(json.dumps(probe))
    return summary


def calibrated(engine, out: Path) -> Path:
    """The calibration run (CALIBRATE's workload), calibrated: `kvplan calibrate --bench RUN` wrote RUN/steptime.json."""
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    calib = bench(engine, out, *CALIBRATE)
    r = CliRunner().invoke(app, ["calibrate", "--bench", calib["run_dir"], "--json"])
    assert r.exit_code == 0, r.output
    return Path(calib["run_dir"])


@pytest.fixture(scope="module")
def calibration(cpu_engine, tmp_path_factory) -> Path:
    return calibrated(cpu_engine, tmp_path_factory.mktemp("calibrate"))


def compare(engine, calibration: Path, out: Path) -> dict:
    """The predicted workload benched on ``engine`` and predicted with ``calibration``'s model: its rows, per load below
    saturation (c, predicted, measured), and the drift of the engine's speed probe from the calibration's (`speed_drift`)."""
    model = load_steptime(calibration)
    assert model.source == "calibrated"
    run = Path(bench(engine, out, *PREDICT)["run_dir"])
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
    return {"rows": rows, "drift": benchmark().speed_drift(calibration, run)}


def missed(rows: list[dict]) -> list[str]:
    """The goal's cells ``rows`` miss, as 'metric at c=N'."""
    return [f"{metric} at c={r['c']}" for r in rows for metric, bound in GOAL.items()
            if abs(r[metric][0] / r[metric][1] - 1) > bound]


@pytest.fixture(scope="module")
def comparison(cpu_engine, calibration, tmp_path_factory):
    """The comparison (`compare`) of the predicted workload with the calibration; where it misses the goal while the
    engine's speed probe moved more than MAX_DRIFT between the two runs, the calibration and the comparison once again,
    whose figures are then the ones judged (both are printed)."""
    tmp = tmp_path_factory.mktemp("latency")
    one_stream = next(p for p in run_inputs(calibration)[1] if p["concurrency"] == 1)
    if one_stream["ttft"]["p50"] < MIN_PROMPT_STEP_S:
        pytest.skip(f"this CPU computes a 64-token prompt in {one_stream['ttft']['p50'] * 1000:.0f} ms: the API "
                    "server's jitter, not the engine's steps, would decide the latency compared")
    result = compare(cpu_engine, calibration, tmp / "predict")
    print("\nlatency comparison (predicted, measured; the probe's drift):", json.dumps(result), flush=True)
    if missed(result["rows"]) and result["drift"] and max(map(abs, result["drift"])) > MAX_DRIFT:
        result = {**compare(cpu_engine, calibrated(cpu_engine, tmp / "calibrate-again"), tmp / "predict-again"),
                  "first": result}
        print("measured again:", json.dumps(result), flush=True)
    (tmp / "comparison.json").write_text(json.dumps(result))
    return result


def describe(result: dict) -> str:
    rows = "; ".join(f"c={r['c']}: TTFT p50 {r['ttft_p50'][0] * 1000:.1f}/{r['ttft_p50'][1] * 1000:.1f} ms, "
                     f"p99 {r['ttft_p99'][0] * 1000:.1f}/{r['ttft_p99'][1] * 1000:.1f} ms, "
                     f"{r['tok_s'][0]:.1f}/{r['tok_s'][1]:.1f} tok/s (predicted/measured)" for r in result["rows"])
    drift = result["drift"]
    shown = "no probe" if drift is None else f"1-token request {drift[0]:+.0%}, decode step {drift[1]:+.0%}"
    again = f"; measured again after {describe(result['first'])}" if "first" in result else ""
    return f"{rows} (the engine's speed against the calibration's: {shown}){again}"


def test_the_predicted_workload_has_loads_below_saturation(comparison):
    assert [r["c"] for r in comparison["rows"]] == [1, 2], describe(comparison)


def test_calibrated_latency_meets_issue_10s_goal(comparison):
    """Calibrated on one workload, the prediction of another is within 20% of the engine's TTFT p50
    and output tokens/s, and within 35% of its TTFT p99, at every load below saturation."""
    assert comparison["rows"], "no load below saturation to compare"
    assert not missed(comparison["rows"]), f"{missed(comparison['rows'])}: {describe(comparison)}"


# --------------------------------------------------------------------------- issue 26: `fit --rate` on this engine
# The fleet goal: the replica count `kvplan fit --rate R --steptime RUN` proposes for this engine (its pool, its limits,
# the step-time model calibrated above) is the count whose measured SLO verdict flips, 1 replica missing and 2 meeting.
#
# The rate and the SLO follow this machine's speed: the shared 2-core machines have run this engine at 49 to 92 output
# tokens/s for one stream within an hour (2026-12-05), and from 0.95 (2026-12-06, an AMD EPYC with AVX2, no AVX-512 or
# AMX) to ~5.3 requests/s at 3 streams. Where batching pays (a fast CPU), the engine's open-loop capacity, running up to 7
# requests at once in 16 blocks and preempting, was 1.6 to 2x what 3 closed-loop streams drew; where it does not (the
# EPYC: one stream drew 0.77 requests/s, four 0.98), 0.95x (0.90 requests/s served, 47 sent at 2/s over 20 s). So R is set from
# the replica's capacity as the calibrated simulator sees it (its requests/s far past saturation; 0.87-0.95 in four
# calibrations on the EPYC, whose engine served 0.90): one replica gets 1.5x it, each of two 0.75x it.
#
# The SLO is TTFT p90 <= T, T the geometric middle of the simulator's TTFT p90 on the very arrivals `kvplan bench
# --rate R --duration D` sends (kvplan.bench.loadgen.arrival_times, seed 0): all of them on one replica, and every
# other one, the engine's half of the round robin, on one of two. Both are of the point the engine runs: an overloaded
# replica's TTFT grows for as long as requests keep coming, so a prediction of 500 requests (what `fit` simulates) can
# be far above anything a 20 s point can measure (the EPYC: 268 s predicted for one replica against 33 s measured, so a
# T between the 500-request predictions, 113 s, was one no 20 s point could miss).
#
# Each verdict must hold with the engine off its calibration: this file's probes have seen it run 20-35% faster minutes
# later, and an overloaded replica's queue magnifies that. In a `.ci/run` of 2026-12-07 (the EPYC) 29 requests drawn in
# 30 s at 1.14/s put one replica just past its capacity: it served 50.2 output tokens/s where the calibrated simulator
# said 46.2, and measured TTFT p90 3.71 s where the simulator said 6.70 (T 4.14: the check failed); the same simulator
# with every step 15% shorter says 3.41. So one replica's p90 is predicted with every step ENGINE_SPEED_SPAN shorter,
# the engine's half of two replicas with every step that much longer, and D is the shortest of 20, 30, ... 90 s at which
# the first is FLEET_VERDICT_GAP times the larger of the second and two replicas' steady state (`fit`'s own verdict,
# on the calibrated model as it is): one replica's p90 grows with D, and 20 s of arrivals drawn at one rate can
# overload it too little. p90, not p99: a point holds ~25-130 requests, too few to read a p99 (the engine's p99 at 3
# requests/s ranged 0.08-1.4 s between runs); not p50: vLLM gives a queued request its first token as soon as its
# prompt's blocks are free, preempting it later, so an overloaded engine's median TTFT stays low (0.67 s at 6.5
# requests/s, p90 5.0 s) while its tail grows.
FLEET_LOAD_AT_TWO = 0.75  # each of two replicas' share of the simulated replica's capacity (one replica: twice it)
# The point's duration: the first whose predicted verdicts stand apart. Up to 90 s: in a `.ci/run` of 2026-12-07 (the
# EPYC, 1.32 requests/s) one replica 20% faster stayed at 1.3-2.6 s up to 60 s, under 1.5x two replicas' steady state
# (2.33 s), and 2.11x at 70 s.
FLEET_POINTS_S = (20, 30, 40, 50, 60, 70, 80, 90)
ENGINE_SPEED_SPAN = 0.2  # how much faster or slower than its calibration the engine may run, each verdict still right
FLEET_VERDICT_GAP = 1.5  # one replica's predicted p90 (faster engine) over two's (slower engine, or steady state)
FLEET_WORK = ("--prompt", "64", "--output", "64")


def fleet_load(calibration: Path) -> tuple[float, int, float, dict[str, float]]:
    """(R in requests/s, the point's duration D in s, the TTFT p90 target T in s, the simulator's TTFT p90s: of the
    engine's share of the point at 1 and 2 replicas as calibrated, at 1 replica with the engine ENGINE_SPEED_SPAN
    faster and at 2 with it that much slower, and of two replicas' steady state) from the calibrated model (see above)."""
    from kvplan.bench.loadgen import arrival_times
    from kvplan.bench.steptime_io import calibrated_engine
    from kvplan.plan.fleet import replica_at
    from kvplan.plan.simulate import Lengths
    from kvplan.plan.simulate import open_loop as simulated_open_loop

    engine = calibrated_engine(calibration)
    three_streams_per_s = {p["concurrency"]: p for p in run_inputs(calibration)[1]}[3]["throughput_tok_s"] / 64
    saturated = replica_at(engine.scheduler, engine.model, 4 * three_streams_per_s, 1, 64, 64)
    rate_per_s = round(2 * FLEET_LOAD_AT_TWO * saturated.output_tokens_per_s / 64, 2)
    # Two replicas' steady state (`fit`'s 500 requests) waits longer than a point's first seconds (EPYC: 2.23 s against
    # 0.54 s in 20 s): T goes above both, or `fit` proposes 3.
    steady = replica_at(engine.scheduler, engine.model, rate_per_s, 2, 64, 64).ttft["p90"]
    faster, slower = (engine.model.steps_scaled(1 + sign * ENGINE_SPEED_SPAN) for sign in (-1, 1))

    def p90(arrivals: list[float], model) -> float:
        return predict_latency(engine.scheduler, simulated_open_loop(arrivals, Lengths(64, 64)), model,
                               (90,)).ttft["p90"]

    for duration_s in FLEET_POINTS_S:
        sent = arrival_times(rate_per_s, None, duration_s)
        predicted = {"1": p90(sent, engine.model), "2": p90(sent[::2], engine.model), "1, faster": p90(sent, faster),
                     "2, slower": p90(sent[::2], slower), "2, steady": steady}
        two = max(predicted["2, slower"], steady)
        if predicted["1, faster"] >= FLEET_VERDICT_GAP * two:
            break
    return rate_per_s, duration_s, round(math.sqrt(predicted["1, faster"] * two), 3), predicted


def open_loop(urls: list[str], out: Path, rate_per_s: float, duration_s: int, slo: str) -> tuple[dict, Path]:
    """One open-loop point of ``rate_per_s`` for ``duration_s`` over ``urls`` (round robin) at ``slo``: (the point, its
    run)."""
    proc = subprocess.run(
        kvplan_cmd(*(arg for url in urls for arg in ("--url", url)), "--rate", str(rate_per_s),
                   "--duration", f"{duration_s}s", *FLEET_WORK, "--slo", slo, "--no-warmup", "--out", str(out), "--json"),
        capture_output=True, text=True, timeout=300, env=bench_env())
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    (point,) = summary["points"]
    assert point["status"] == "ok", point
    return point, Path(summary["run_dir"])


def engine_ttfts(run: Path, replica: int) -> list[float]:
    """TTFT (first token less the time the client scheduled it) of each request the client sent to ``replica``,
    read from RUN/requests.jsonl apart from bench's own percentiles."""
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines() if line.strip()]
    return [r["first_token_s"] - r["scheduled_s"] for r in rows if r.get("replica") == replica and r["ok"]]


def test_fit_rate_proposes_the_count_the_engine_measures(cpu_engine, calibration, tmp_path):
    """`kvplan fit --rate R --slo ttft_p90=T --steptime RUN` on this engine proposes 2 replicas; `kvplan bench
    --rate R` with that SLO measures 1 replica missing it and 2 meeting it (R and T: fleet_load).

    Two replicas are this engine and a stand-in (tests/helpers/fleet.py's PoolReplica, a loopback server with 32
    usable blocks that never queues), whose first token takes the calibrated model's 64-token prefill and each next
    token its one-request decode step: the suite's CPU time holds one compute-bound engine, not two. The stand-in
    takes every other request and is fast, so it cannot decide the verdict alone: the engine's own half (its
    requests in requests.jsonl) must meet the SLO too, which is what each of two such engines would see."""
    from statistics import quantiles

    from helpers.fleet import PoolReplica
    from typer.testing import CliRunner

    from kvplan.bench.steptime_io import calibrated_engine
    from kvplan.cli.app import app
    from kvplan.plan.fleet import missed_targets, replica_at
    from kvplan.plan.simulate import StepBatch

    model_dir = cpu_engine.cfg.model
    rate_per_s, duration_s, target_s, predicted = fleet_load(calibration)
    engine = calibrated_engine(calibration)
    assert predicted["1, faster"] >= FLEET_VERDICT_GAP * max(predicted["2, slower"], predicted["2, steady"]), \
        predicted  # (verdicts set apart, by 90 s)
    slo = f"ttft_p90={target_s * 1000:.0f}ms"
    fit = CliRunner().invoke(app, ["fit", model_dir, "--ctx", "512", "--rate", str(rate_per_s), *FLEET_WORK,
                                   "--slo", slo, "--steptime", str(calibration), "--json"],
                             env={"HF_HUB_OFFLINE": "1"})
    assert fit.exit_code == 0, fit.output
    (fleet,) = json.loads(fit.output)["fleets"]

    one, _ = open_loop([cpu_engine.cfg.base_url], tmp_path / "one", rate_per_s, duration_s, slo)
    prefill_s = engine.model(StepBatch(64, 0, 64, 1, 64 * 65 // 2))
    decode_s = engine.model(StepBatch(0, 1, 96, 1, 96))
    with PoolReplica(33, model_id=model_dir, token_gap_s=decode_s, first_token_delay_s=prefill_s) as stand_in:
        two, run = open_loop([cpu_engine.cfg.base_url, stand_in.url], tmp_path / "two", rate_per_s, duration_s, slo)
    engine_half = quantiles(engine_ttfts(run, 0), n=10)[-1]  # its p90
    figures = {"rate_per_s": rate_per_s, "duration_s": duration_s, "ttft_p90_target_s": target_s,
               "predicted_replicas": fleet["replicas"],
               "binding": fleet["binding"],
               "predicted_ttft_p90_s": predicted, "measured_ttft_p90_s": {1: one["ttft"]["p90"], 2: two["ttft"]["p90"]},
               "measured_ttft_p99_s": {1: one["ttft"]["p99"], 2: two["ttft"]["p99"]},
               "engine_half_ttft_p90_s": engine_half, "requests": {1: one["requests"], 2: two["requests"]}}
    print("\nfit --rate against the engine:", json.dumps(figures), flush=True)
    assert fleet["replicas"] == 2, figures  # the simulator: 1 misses, 2 meet
    assert missed_targets(replica_at(engine.scheduler, engine.model, rate_per_s, 1, 64, 64),
                          {"ttft_p90": target_s}) == ["ttft_p90"]
    assert one["slo"]["ttft_p90"]["met"] is False, figures  # measured: one replica misses ...
    assert two["slo"]["ttft_p90"]["met"] is True and engine_half <= target_s, figures  # ... two meet it
    assert [r["requests"] for r in two["replicas"]] == [cdiv(two["requests"], 2), two["requests"] // 2]
