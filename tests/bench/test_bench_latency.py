"""Predicted latency next to measured for every bench point (kvplan.bench.latency), offline: the
recorded run folders tests/bench/data/old-run-* (prompt 8, output 6, a pool of 17 blocks of 32)
predicted with step-time models whose step times are known by hand, the simulator called directly
for the open loop, the bound on big loads, the model's source (prior, calibrated, none on a CPU
engine), and the reports showing the figures."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
from helpers.bench import TINY_MODEL

from kvplan.bench.latency import MAX_FIRST_WAVE, MAX_SIMULATED_TOKENS, predict_point, predictor_for
from kvplan.bench.outputs.csv import points_csv
from kvplan.bench.outputs.markdown import markdown
from kvplan.bench.outputs.text import latency_lines
from kvplan.bench.render import load_summary
from kvplan.bench.results import BenchSummary, LatencyModelInfo, PointResult
from kvplan.plan.simulate import Lengths, SchedulerConfig, open_loop, simulate
from kvplan.plan.steptime import StepTimeModel

DATA = Path(__file__).parent / "data"
POOL = {"num_blocks": 17, "block_size": 32, "vllm_version": None}
LENGTHS = Lengths(8, 6)
STEP_S = 0.010
#: Every step takes 10 ms whatever it holds: 1e7 weight bytes at 1e9 B/s, no other term.
TEN_MS = StepTimeModel(weight_bytes=1e7, kv_bytes_per_token=0, linear_flops_per_token=0, attn_flops_per_pair=0,
                       bandwidth_bytes_s=1e9, peak_flops=1.0, mem_efficiency=1.0, compute_efficiency=1.0,
                       overhead_s=0.0, source="calibrated")


def old_summary(name: str) -> BenchSummary:
    return load_summary(DATA / name)


def run_config(name: str, **changes) -> dict:
    cfg = json.loads((DATA / name / "run.json").read_text())["config"]
    return {**cfg, **changes}


def test_closed_loop_points_by_hand():
    """c=1, 8 requests: each alone, one prefill step (8 tokens) then 5 decode steps: TTFT = ITL = 10 ms,
    E2E = 60 ms, 48 tokens in 8 x 60 ms = 100 tok/s. c=4, 8 requests (2 a stream): 4 at once, two
    waves of 6 steps: the same latencies, 48 tokens in 120 ms = 400 tok/s."""
    c1, c4 = old_summary("old-run-conc").points
    assert (c1.concurrency, c1.requests, c4.concurrency, c4.requests) == (1, 8, 4, 8)
    for point, tok_s in ((c1, 100.0), (c4, 400.0)):
        pred = predict_point(SchedulerConfig(17, 32), TEN_MS, LENGTHS, point)
        assert pred.error is None and pred.source == "calibrated" and pred.simulated_requests == 8
        for metric in ("ttft", "itl", "tpot"):
            assert (pred.stat(metric, "p50"), pred.stat(metric, "p99")) == pytest.approx((STEP_S, STEP_S))
        assert (pred.e2e.p50, pred.e2e.p99) == pytest.approx((6 * STEP_S, 6 * STEP_S))
        assert pred.output_tokens_per_s == pytest.approx(tok_s)


def test_open_loop_point_replays_its_own_arrivals():
    """The rate point (20 requests/s, 6 requests, seq 0, seed 0) against the simulator called directly
    on the arrival times bench drew for it."""
    from kvplan.bench.loadgen import arrival_times
    from kvplan.stats import percentile

    (point,) = old_summary("old-run-rate").points
    assert (point.mode, point.rate, point.requests, point.seq) == ("rate", 20.0, 6, 0)
    pred = predict_point(SchedulerConfig(17, 32), TEN_MS, LENGTHS, point)
    arrivals = arrival_times(20.0, 6, None, 1.0, 0)
    res = simulate(SchedulerConfig(17, 32), open_loop(arrivals, LENGTHS), TEN_MS)
    ttfts = [r.ttft for r in res.requests]
    assert pred.ttft.p50 == pytest.approx(percentile(ttfts, 50), abs=1e-6)
    assert pred.ttft.p99 == pytest.approx(percentile(ttfts, 99), abs=1e-6)
    # A request waits at most for the step under way: TTFT in [10, 20) ms, E2E at least 6 steps.
    assert all(STEP_S - 1e-9 <= t < 2 * STEP_S for t in ttfts)
    assert pred.e2e.p50 >= 6 * STEP_S - 1e-9
    assert pred.output_tokens_per_s == pytest.approx(36 / res.duration, rel=1e-3)


def test_big_loads_are_simulated_bounded():
    """64 streams of 1,000-token outputs: one wave is 64,000 tokens, so 200,000 // 64,000 = 3 requests a
    stream (192) are simulated of the 6,400 sent; 2,000 streams (2,000,000 tokens in the first wave,
    above 400,000) are not simulated at all."""
    assert (MAX_SIMULATED_TOKENS, MAX_FIRST_WAVE) == (200_000, 400_000)
    base = old_summary("old-run-conc").points[0]
    big = base.model_copy(update={"concurrency": 64, "requests": 6400})
    pred = predict_point(SchedulerConfig(100_000, 16), TEN_MS, Lengths(100, 1000), big)
    assert pred.error is None and pred.simulated_requests == 192
    assert pred.ttft.p50 == pytest.approx(STEP_S)  # 64 prompts of 100 tokens: one step's budget
    # Streams sharing a budget of 10 requests: 3 a stream (ceil 10 / 4), none of the sent left out.
    shared = base.model_copy(update={"concurrency": 4, "requests": 10})
    assert predict_point(SchedulerConfig(17, 32), TEN_MS, LENGTHS, shared).simulated_requests == 12
    huge = base.model_copy(update={"concurrency": 2000, "requests": 2000})
    pred = predict_point(SchedulerConfig(100_000, 16), TEN_MS, Lengths(100, 1000), huge)
    assert pred.ttft is None and "too many to simulate" in pred.error


def test_a_cpu_engine_has_no_prior():
    """No --gpu and no --steptime (the CPU engine): the run says so and predicts nothing."""
    predictor = predictor_for(run_config("old-run-conc", planner_gpu=None), POOL, str(TINY_MODEL))
    assert predictor.info.source == "none" and "no prior for this device" in predictor.info.basis
    summary = old_summary("old-run-conc")
    assert all(predictor.predict(p) is None for p in summary.points)
    shown = summary.model_copy(update={"latency_model": predictor.info})
    assert "Latency not predicted: no prior for this device" in markdown(shown)
    assert "Latency not predicted: no prior for this device" in " ".join(latency_lines(shown))


def test_the_prior_of_the_named_gpu():
    """--gpu H100 on the tiny model (853 kB of weights): memory and compute terms are below a
    microsecond, so every step is the datacenter prior's fixed overhead, 4 ms: TTFT = ITL = 4 ms,
    E2E = 6 x 4 = 24 ms, one stream makes 1 / 4 ms = 250 tok/s, four 1,000."""
    predictor = predictor_for(run_config("old-run-conc", planner_gpu="H100"), POOL, str(TINY_MODEL))
    assert predictor.info.source == "prior" and predictor.info.basis.startswith("H100")
    c1, c4 = old_summary("old-run-conc").points
    for point, tok_s in ((c1, 250.0), (c4, 1000.0)):
        pred = predictor.predict(point)
        assert pred.source == "prior"
        assert pred.ttft.p50 == pytest.approx(0.004, rel=1e-3) and pred.itl.p99 == pytest.approx(0.004, rel=1e-3)
        assert pred.e2e.p50 == pytest.approx(0.024, rel=1e-3)
        assert pred.output_tokens_per_s == pytest.approx(tok_s, rel=1e-3)


def test_a_calibrated_model_from_a_run(tmp_path):
    """--steptime RUN: the model in RUN/steptime.json, labelled calibrated."""
    run = tmp_path / "calib"
    run.mkdir()
    (run / "steptime.json").write_text(json.dumps({"schema": 1, "steptime": asdict(TEN_MS)}))
    predictor = predictor_for(run_config("old-run-conc"), POOL, str(TINY_MODEL), run)
    assert predictor.info.source == "calibrated" and str(run) in predictor.info.basis
    pred = predictor.predict(old_summary("old-run-conc").points[1])
    assert pred.ttft.p99 == pytest.approx(STEP_S) and pred.output_tokens_per_s == pytest.approx(400.0)


def test_the_runner_predicts_each_point_and_records_the_model(tmp_path):
    from kvplan.bench import store as st
    from kvplan.bench.config import BenchConfig
    from kvplan.bench.runner import BenchRun
    from kvplan.engines.base import EngineCapacity

    (tmp_path / "steptime.json").write_text(json.dumps({"schema": 1, "steptime": asdict(TEN_MS)}))
    cfg = BenchConfig.model_validate(run_config("old-run-conc", steptime=str(tmp_path / "steptime.json")))
    (tmp_path / "run").mkdir()
    run = BenchRun(cfg, st.RunStore(tmp_path / "run"))
    run.model = str(TINY_MODEL)
    run.capacity = EngineCapacity(num_blocks=17, block_size=32)
    run._latency_model()
    point = run._predict_latency(old_summary("old-run-conc").points[0])
    assert point.predicted_latency.e2e.p50 == pytest.approx(6 * STEP_S)
    run.points = [point]
    summary = run.summary("complete", None)
    assert summary.latency_model.source == "calibrated"
    again = BenchSummary.model_validate_json(summary.model_dump_json())
    assert again.points[0].predicted_latency == point.predicted_latency


def predicted_summary() -> BenchSummary:
    s = old_summary("old-run-conc")
    points = [p.model_copy(update={"predicted_latency": predict_point(SchedulerConfig(17, 32), TEN_MS, LENGTHS, p)})
              for p in s.points]
    return s.model_copy(update={"points": points, "latency_model": LatencyModelInfo(source="calibrated", basis="x")})


def test_reports_show_predicted_next_to_measured():
    s = predicted_summary()
    c1 = s.points[0]
    measured_ttft = f"{c1.ttft.p50 * 1000:.0f}"  # 21.8 ms -> "22"
    md = markdown(s)
    section = md[md.index("## Latency: predicted / measured"):]
    assert "step times calibrated (x)" in section
    row = next(line for line in section.splitlines() if line.startswith("| 1 |"))
    assert row.split(" | ")[1] == f"10 / {measured_ttft}"  # TTFT p50: predicted / measured
    assert row.rstrip(" |").endswith(f"100 / {c1.throughput_tok_s:,.0f}")
    lines = latency_lines(s)
    assert max(len(line) for line in lines) <= 80
    pred_row = next(line for line in lines if line.split()[:2] == ["1", "pred"])
    meas_row = lines[lines.index(pred_row) + 1]
    assert pred_row.split()[2:] == ["10", "10", "10", "10", "60", "60", "100"]
    assert meas_row.split()[:2] == ["meas", measured_ttft]
    from kvplan.bench.outputs.html import html_report

    html = html_report([s])
    assert '<table class="predicted">' in html and f"<td>10 / {measured_ttft}</td>" in html
    assert "p50 predicted" in html and "throughput predicted" in html
    head, *rows = points_csv(s.points).splitlines()
    cols = head.split(",")
    assert rows[0].split(",")[cols.index("predicted_e2e_p99_ms")] == "60.0"


def test_older_runs_render_without_a_latency_section(tmp_path):
    run = tmp_path / "old"
    shutil.copytree(DATA / "old-run-conc", run)
    s = load_summary(run)
    assert s.latency_model is None and all(p.predicted_latency is None for p in s.points)
    assert "## Latency" not in markdown(s) and latency_lines(s) == []
    line = (run / "points.jsonl").read_text().splitlines()[0]
    assert "predicted_latency" not in PointResult.model_validate_json(line).model_dump_json()


def test_the_live_view_shows_the_predicted_p99(monkeypatch):
    from kvplan.bench.view import RichView

    view = RichView()
    try:
        shown = {}
        monkeypatch.setattr(view.progress, "update", lambda task, **kw: shown.update(kw))
        view._task = 0
        view.point_finished(predicted_summary().points[0])
        assert "(predicted 10 ms)" in shown["gauges"]
    finally:
        view.close()


def test_an_old_run_predicted_offline(tmp_path):
    """kvplan report's route: a finished run folder (its run.json naming the tiny model), predicted again
    with a calibrated model: the same hand figures, and the reports rewritten with them."""
    from kvplan.bench import store as st
    from kvplan.bench.latency import predict_run
    from kvplan.bench.outputs import write_reports

    run = tmp_path / "old"
    shutil.copytree(DATA / "old-run-conc", run)
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "model": str(TINY_MODEL)}))
    (tmp_path / "steptime.json").write_text(json.dumps({"schema": 1, "steptime": asdict(TEN_MS)}))
    summary = predict_run(run, tmp_path / "steptime.json")
    assert summary.latency_model.source == "calibrated"
    assert [p.predicted_latency.output_tokens_per_s for p in summary.points] == pytest.approx([100.0, 400.0])
    write_reports(st.RunStore(run), summary)
    assert "| 4 | 10 / " in (run / "report.md").read_text()
    assert load_summary(run).points[1].predicted_latency == summary.points[1].predicted_latency
    # No --gpu, no calibration: the run says why, and nothing is predicted.
    bare = predict_run(run)
    assert bare.latency_model.source == "none" and all(p.predicted_latency is None for p in bare.points)


def test_a_bounded_point_says_so_in_the_report():
    s = old_summary("old-run-conc")
    big = s.points[0].model_copy(update={"concurrency": 64, "requests": 6400})
    pred = predict_point(SchedulerConfig(100_000, 16), TEN_MS, Lengths(100, 1000), big)
    shown = s.model_copy(update={"points": [big.model_copy(update={"predicted_latency": pred})],
                                 "latency_model": LatencyModelInfo(source="calibrated", basis="x")})
    assert "64: 192 of 6400" in markdown(shown)
    assert "bounded" not in markdown(predicted_summary())  # 8 of 8 simulated


def test_a_calibration_without_the_models_config_uses_its_own_limits(tmp_path):
    """Attached to a server whose model kvplan cannot read offline ("fake"): the calibration's scheduler
    limits (steptime.json) with this run's pool, labelled so."""
    (tmp_path / "steptime.json").write_text(json.dumps({
        "schema": 1, "steptime": asdict(TEN_MS),
        "scheduler": asdict(SchedulerConfig(99, 16, max_num_seqs=2, max_num_batched_tokens=64))}))
    predictor = predictor_for(run_config("old-run-conc"), POOL, "fake", tmp_path / "steptime.json")
    assert predictor.info.source == "calibrated" and "scheduler limits of the calibration" in predictor.info.basis
    assert (predictor.scheduler.num_blocks, predictor.scheduler.block_size) == (17, 32)  # the run's pool
    assert (predictor.scheduler.max_num_seqs, predictor.scheduler.max_num_batched_tokens) == (2, 64)
    # 4 streams of 2 requests, at most 2 running, in rounds of 6 steps: the first pair's first requests
    # get a token after 10 ms; every later request queues one round behind the pair ahead of it (it
    # arrived when its stream's previous request ended): 60 + 10 = 70 ms. TTFTs 10, 10 and six of 70:
    # p50 = p99 = 70 ms; 48 tokens in 4 rounds of 60 ms = 200 tok/s.
    pred = predictor.predict(old_summary("old-run-conc").points[1])
    assert (pred.ttft.p50, pred.ttft.p99) == pytest.approx((7 * STEP_S, 7 * STEP_S))
    assert pred.output_tokens_per_s == pytest.approx(200.0)
    # Neither the model's config nor a calibration: nothing, and why.
    none = predictor_for(run_config("old-run-conc", planner_gpu="H100"), POOL, "fake")
    assert none.info.source == "none" and none.info.basis.startswith("cannot plan the deployment")


def test_kvplan_report_predicts_a_finished_run_again(tmp_path):
    """`kvplan report RUN --steptime FILE` through the real entry point: no engine, the run's report.md
    rewritten with the hand figures (10 ms a step: 100 and 400 output tokens/s at 1 and 4 streams)."""
    import subprocess
    import sys

    run = tmp_path / "old"
    shutil.copytree(DATA / "old-run-conc", run)
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "model": str(TINY_MODEL)}))
    (tmp_path / "steptime.json").write_text(json.dumps({"schema": 1, "steptime": asdict(TEN_MS)}))
    done = subprocess.run([sys.executable, "-m", "kvplan", "report", str(run), "--steptime",
                           str(tmp_path / "steptime.json"), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["latency_model"]["source"] == "calibrated"
    assert [p["predicted_latency"]["output_tokens_per_s"] for p in shown["points"]] == pytest.approx([100.0, 400.0])
    assert "| 4 | 10 / " in (run / "report.md").read_text()


def test_points_are_predicted_on_the_pool_the_warm_up_and_earlier_points_left(tmp_path):
    """vLLM's prefix cache outlives a point (v1/core/block_pool.py@0.32.0), so each prediction starts on the pool the
    warm-up and the earlier points left. 17 blocks of 32; 256 + 32 tokens with 75% shared: 6 full shared blocks, 192
    tokens a request. The first point starts at request 1: bench's warm-up sent request 0 alone, which cached them.
    1 stream of 3: 3 x 192 hit of 3 x 256 (75%; 50% on an empty pool, where request 1 misses); then 2 streams of
    4 (numbers 4-7): 4 x 192 of 4 x 256."""
    from kvplan.bench.latency import CARRIED_POOL, CARRIED_POOL_URL, PointPredictor

    predictor = PointPredictor(LatencyModelInfo(source="calibrated", basis="by hand"), SchedulerConfig(17, 32), TEN_MS,
                               Lengths(256, 32), shared_prefix=0.75)
    base = old_summary("old-run-conc").points[0]
    one = base.model_copy(update={"concurrency": 1, "requests": 3, "first_index": 1})
    two = base.model_copy(update={"concurrency": 2, "requests": 4, "first_index": 4})
    first, second = predictor.predict(one), predictor.predict(two)
    assert (first.prefix_hit_rate, first.carried_pool) == (0.75, True)
    assert second.prefix_hit_rate == 0.75
    # A point numbered from 1 again (a --resume session, after its own warm-up): from the warm-up's pool again (its
    # request 0, then 1-3: 4 requests numbered on that pool; 1 + 3 + 4 + 3 = 11 had the sweep's carried on).
    assert predictor.predict(one).prefix_hit_rate == 0.75 and predictor.carried["pool"].requests == 4
    cold = predict_point(SchedulerConfig(17, 32), TEN_MS, Lengths(256, 32), one, shared_prefix=0.75)
    assert (cold.prefix_hit_rate, cold.carried_pool) == (0.5, None)
    # The run says so: attached to a server (no engine of kvplan's), the hits are a lower bound.
    (tmp_path / "steptime.json").write_text(json.dumps({"schema": 1, "steptime": asdict(TEN_MS)}))
    attached = predictor_for(run_config("old-run-conc"), POOL, str(TINY_MODEL), tmp_path / "steptime.json")
    assert attached.info.pool == CARRIED_POOL + CARRIED_POOL_URL and "lower bound" in attached.info.pool
    engine = predictor_for(run_config("old-run-conc", engine={"model": str(TINY_MODEL)}), POOL, str(TINY_MODEL),
                           tmp_path / "steptime.json")
    assert engine.info.pool == CARRIED_POOL
    summary = old_summary("old-run-conc").model_copy(update={"latency_model": attached.info})
    assert "lower bound" in " ".join(latency_lines(summary))


def hybrid_model(dest: Path) -> Path:
    """The tiny Llama with its first layer a 64-token sliding window (config.json's ``layer_types``, as
    tests/bench/test_replay_engine_hybrid.py serves it on the CPU engine): a window group beside full attention."""
    shutil.copytree(TINY_MODEL, dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def test_a_hybrid_model_is_predicted_on_its_groups(tmp_path):
    """Ten streams of 40 + 24 on 40 blocks of 32 (39 usable), every step 10 ms. By hand (vLLM 0.32's managers, as
    tests/plan/test_hybrid_rule.py works it): a request holds 2 blocks in each group at every step (its 63 tokens:
    cdiv(63, 32) = 2 in full attention; the window skips nothing before its last step), 4 in all: 39 // 4 = 9 run,
    the tenth waits until the first nine end. They prefill in step 1 (TTFT 10 ms) and sample their 24th token in
    step 24; the tenth is admitted in step 25 (TTFT 250 ms) and ends in step 48 (480 ms, 24 x 10 tokens in 480 ms:
    500 tok/s). The one-group pool would hold all ten (2 blocks each): every TTFT 10 ms, 1,000 tok/s."""
    model = hybrid_model(tmp_path / "hybrid")
    (tmp_path / "steptime.json").write_text(json.dumps({"schema": 1, "steptime": asdict(TEN_MS)}))
    cfg = run_config("old-run-conc", engine={"model": str(model)},
                     workload={**run_config("old-run-conc")["workload"], "prompt_tokens": 40, "output_tokens": 24})
    pool = {"num_blocks": 40, "block_size": 32, "vllm_version": "0.32.0"}
    predictor = predictor_for(cfg, pool, str(model), tmp_path / "steptime.json")
    assert predictor.scheduler.kv_groups is not None and "sliding 64 + full attention" in predictor.info.basis
    assert predictor.info.pool.startswith("Each point starts on the prefix cache")  # carried, as one group's is
    point = old_summary("old-run-conc").points[0].model_copy(update={"concurrency": 10, "requests": 10})
    pred = predictor.predict(point)
    assert pred.error is None and pred.simulated_requests == 10
    assert pred.ttft.p50 == pytest.approx(0.010) and pred.ttft.p99 == pytest.approx(0.010 + 0.91 * 0.240)
    assert pred.output_tokens_per_s == pytest.approx(500.0)
    one_group = predict_point(SchedulerConfig(40, 32), TEN_MS, Lengths(40, 24), point)
    assert one_group.ttft.p99 == pytest.approx(0.010) and one_group.output_tokens_per_s == pytest.approx(1000.0)


def test_a_group_kvplan_does_not_model_gets_no_latency(tmp_path):
    """A served model whose KV cache groups the hybrid simulator refuses (`served_groups` gives the reason and the
    groups' kinds) gets no latency prediction, and the reason, rather than a count of one group's blocks."""
    from kvplan.bench.replay import ServedGroups

    refused = ServedGroups(None, refused="the prefix cache of short_conv KV groups is not modelled",
                           kinds=("full_attention", "short_conv"))
    (tmp_path / "steptime.json").write_text(json.dumps({"schema": 1, "steptime": asdict(TEN_MS)}))
    predictor = predictor_for(run_config("old-run-conc"), POOL, str(TINY_MODEL), tmp_path / "steptime.json", refused)
    assert predictor.info.source == "none" and predictor.scheduler is None
    assert predictor.info.basis == ("latency not simulated: the model's KV cache is 2 groups (full_attention, "
                                    "short_conv) taking blocks from one pool, and the prefix cache of short_conv KV "
                                    "groups is not modelled")


def _run_of(tmp_path: Path, model: str, engine: bool = True, **capacity) -> Path:
    """tests/bench/data/old-run-conc copied, serving ``model`` (launched by kvplan when ``engine``) on ``capacity``."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "old-run-conc", run)
    data = json.loads((run / "run.json").read_text())
    data["config"]["engine"] = {"model": model} if engine else None
    data["model"] = model
    data["capacity"].update(capacity)
    (run / "run.json").write_text(json.dumps(data))
    return run


def test_a_hybrid_run_is_calibrated_on_its_groups(tmp_path):
    """`kvplan calibrate --bench` replays a run's points on the served model's KV cache groups, as bench predicts
    them (the test above): the sliding-window tiny Llama's run gets the window group beside full attention. One
    group's pool would let each request hold one group's blocks, where vLLM takes blocks in both."""
    from kvplan.bench.steptime_io import run_inputs

    run = _run_of(tmp_path, str(hybrid_model(tmp_path / "hybrid")), num_blocks=40, vllm_version="0.32.0")
    scheduler = run_inputs(run)[3]
    assert scheduler.kv_groups is not None and scheduler.kv_groups.describe() == "sliding 64 + full attention"
    plain = run_inputs(_run_of(tmp_path / "plain", str(TINY_MODEL), num_blocks=40, vllm_version="0.32.0"))[3]
    assert plain.kv_groups is None


def test_a_run_whose_groups_kvplan_does_not_model_is_not_calibrated(tmp_path):
    """Gemma 4 E2B's KV cache groups (full attention and a window of another page size: mixed block sizes, which the
    hybrid simulator does not model) refuse the calibration with the reason, rather than replay one group."""
    from kvplan.bench.steptime_io import run_inputs
    from kvplan.errors import KvplanError

    run = _run_of(tmp_path, "google/gemma-4-E2B-it", engine=False, num_blocks=400, vllm_version="0.33.0")
    with pytest.raises(KvplanError, match=r"cannot calibrate on .*google/gemma-4-E2B-it's KV cache is \d+ groups"):
        run_inputs(run)


def test_the_budget_of_an_attached_run_is_the_one_bench_was_told():
    """run.json's config states the engine's token budget by its flags (launched) or by ``max_num_batched_tokens``
    (attached: `kvplan bench --url ... --max-num-batched-tokens N`); the latency prediction's scheduler takes it before
    a calibration's limits, which are another run's."""
    from kvplan.bench.latency import _scheduler_from

    pool, calibration = {"num_blocks": 10, "block_size": 16}, {"max_num_batched_tokens": 8192}
    assert _scheduler_from({"max_num_batched_tokens": 64}, pool, calibration).max_num_batched_tokens == 64
    launched = {"engine": {"model": "m", "max_num_batched_tokens": 128}}
    assert _scheduler_from(launched, pool, calibration).max_num_batched_tokens == 128
    assert _scheduler_from({}, pool, calibration).max_num_batched_tokens == 8192
    assert _scheduler_from({}, pool, {}).max_num_batched_tokens == 1 << 30
