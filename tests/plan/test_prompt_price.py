"""How well a calibration pins the price of a prompt token: the Theil-Sen slope of 1-stream TTFT against prompt
tokens with Sen's interval (kvplan.stats), the price as a calibration reports it, the note a prediction outside
the calibrated prompt lengths gives, and a prompt sweep's requests fitted by calibrate_bench. Every expected
number is hand arithmetic on hand-built points."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvplan.plan.simulate import Lengths, SchedulerConfig, closed_loop
from kvplan.plan.steptime import (
    StepTimeModel,
    calibrate_bench,
    predict_latency,
    prompt_range_note,
    prompt_token_price,
    single_request_groups,
    single_request_row,
)
from kvplan.stats import theil_sen, theil_sen_interval

#: A hand-made scatter (ms): what a request's TTFT strays from the line (mean 0.25 ms, at most 3 ms).
NOISE_MS = (2.0, -1.5, 0.5, -2.5, 1.0, -0.5, 3.0, -1.0, 0.0, 1.5)
SLOPE_MS, INTERCEPT_MS = 0.12, 18.0  # the CPU engine's regime: 18 ms outside the prefill, 0.12 ms a prompt token


def line(xs) -> list[tuple[float, float]]:
    return [(x, INTERCEPT_MS + SLOPE_MS * x + NOISE_MS[k % len(NOISE_MS)]) for k, x in enumerate(xs)]


def test_sen_interval_holds_the_slope_and_widens_as_the_lengths_narrow():
    """20 requests of 23-403 tokens (every 20) and 20 of 54-73 (every one), the same scatter: both intervals hold
    the true 0.12 ms; over the narrow span the same 3 ms of scatter is worth far more per token, so the interval is
    more than five times as wide (a 64-token lognormal workload spans about this much between its halves)."""
    wide, narrow = line(range(23, 404, 20)), line(range(54, 74))
    (lo_w, hi_w), (lo_n, hi_n) = theil_sen_interval(wide), theil_sen_interval(narrow)
    assert lo_w <= SLOPE_MS <= hi_w and lo_n <= SLOPE_MS <= hi_n
    assert hi_n - lo_n > 5 * (hi_w - lo_w)
    assert theil_sen(wide)[1] == pytest.approx(SLOPE_MS, abs=0.01)
    # No scatter: every pairwise slope is the line's, and so is the interval.
    exact = [(x, 5 + 0.12 * x) for x in range(10, 200, 10)]
    assert theil_sen_interval(exact) == (pytest.approx(0.12), pytest.approx(0.12))
    assert theil_sen(exact) == (pytest.approx(5.0), pytest.approx(0.12))
    with pytest.raises(ValueError):
        theil_sen_interval([(64, 20.0), (64, 21.0)])  # one length: no slope


def test_prompt_token_price_against_the_models():
    """The price a calibration reports: the data's slope and interval (ms a token) over the requests' lengths, and
    what a model charges over the same lengths: 1.2e5 FLOPs a token at 1e9 FLOP/s is 0.12 ms a token (one step each,
    its overhead cancels), inside the data's range; the same at efficiency 0.4 (0.3 ms a token) is not."""
    model = StepTimeModel(0, 0, 1.2e5, 0, 1e9, 1e9, mem_efficiency=1.0, compute_efficiency=1.0, overhead_s=0.01)
    requests = [(int(x), y / 1000) for x, y in line(range(23, 404, 20))]
    price = prompt_token_price(requests, model, chunk_tokens=2048)
    assert (price.requests, price.prompt_min, price.prompt_max, price.distinct_lengths) == (20, 23, 403, 20)
    assert price.data_low_ms <= SLOPE_MS <= price.data_high_ms
    assert price.model_ms == pytest.approx(0.12) and price.model_in_range
    dear = prompt_token_price(requests, replace(model, compute_efficiency=0.4), 2048)
    assert dear.model_ms == pytest.approx(0.3) and not dear.model_in_range
    assert prompt_token_price([(64, 0.02), (64, 0.021), (64, 0.019)], model, 2048) is None  # one length
    assert prompt_token_price([(32, 0.02), (64, 0.03)], model, 2048) is None  # two requests


def test_a_prediction_outside_the_calibrated_prompts_says_so():
    note = prompt_range_note((35, 101), (18, 60))
    assert note is not None and "18-60" in note and "35-101" in note and "\n" not in note
    assert "256 tokens" in prompt_range_note((35, 101), (256, 256), " on RUN")
    assert prompt_range_note((35, 101), (40, 101)) is None  # inside
    assert prompt_range_note(None, (1, 10_000)) is None  # a calibration that does not say


def test_single_requests_group_as_a_point_does():
    """Eight requests of 10-80 tokens with TTFTs of 10-80 ms: halves 10-40 and 50-80 tokens; each half's middle
    prompt (the upper of its two middle ones, as ttft_groups takes a point's median request) and median TTFT."""
    requests = [(10 * k, 0.01 * k) for k in range(8, 0, -1)]
    assert single_request_groups(requests) == [(30, pytest.approx(0.025)), (70, pytest.approx(0.065))]
    assert single_request_groups([(64, 0.02), (64, 0.03), (64, 0.04)]) == [(64, pytest.approx(0.03))]
    assert single_request_groups([(0, 0.02), (64, -1.0)]) == []


def test_single_request_row_by_hand():
    """A 300-token prompt in chunks of 128: steps of 128, 128 and 44 tokens; compute 300 x 1e5 FLOPs at 1e9 FLOP/s
    = 30 ms; memory: the weights (1e6 B at 1e9 B/s = 1 ms) each step, and 128 + 256 + 300 KV tokens of 1000 B."""
    model = StepTimeModel(1e6, 1000, 1e5, 0, 1e9, 1e9)
    steps, mem, compute, one = single_request_row(model, 300, 128)
    assert (steps, one) == (3.0, 1.0)
    assert compute == pytest.approx(0.030)
    assert mem == pytest.approx(3 * 0.001 + (128 + 256 + 300) * 1000 / 1e9)


def test_a_prompt_sweep_is_fitted_as_single_requests():
    """The CPU engine's regime (10 ms a step, 0.1 ms of compute a prompt token, 18 ms a request outside the steps)
    benched with 64-token prompts only, each point's TTFT p50 off by a few percent (-4%, +4%, -3%, +3%), and a
    sweep of 16 prompts of 32-512 tokens sent alone, each TTFT = 10 ms + n x 0.1 ms + 18 ms exactly. The fit
    charges 0.1 ms a token (within 10%) and predicts a 256-token prompt alone at 10 + 25.6 + 18 = 53.6 ms (within
    5%); the sweep's own line says 0.1 ms exactly."""
    truth = StepTimeModel(weight_bytes=0, kv_bytes_per_token=0, linear_flops_per_token=1e5, attn_flops_per_pair=0,
                          bandwidth_bytes_s=1e9, peak_flops=1e9, mem_efficiency=1.0, compute_efficiency=1.0,
                          overhead_s=0.010, request_overhead_s=0.018)
    cfg, lengths, per_stream = SchedulerConfig(num_blocks=1000, block_size=16), Lengths(64, 16), 5
    points, first = [], 0
    for seq, (c, jitter) in enumerate(zip((1, 2, 3, 4), (0.96, 1.04, 0.97, 1.03))):
        lat = predict_latency(cfg, closed_loop(c, lengths, per_stream, first), truth)
        points.append({"seq": seq, "concurrency": c, "first_index": first,
                       "ttft": {k: v * jitter for k, v in lat.ttft.items()}, "itl": lat.itl,
                       "throughput_tok_s": lat.output_tokens_per_s,
                       "request_throughput": lat.output_tokens_per_s / lengths.output})
        first += c * per_stream
    sweep = [(n, 0.010 + n * 1e-4 + 0.018) for n in range(32, 513, 32)]
    base = replace(truth, compute_efficiency=0.3, overhead_s=0.0, request_overhead_s=0.0)
    with_sweep = calibrate_bench(points, lengths, cfg, base, per_stream, single_requests=sweep)
    alone = predict_latency(cfg, closed_loop(1, Lengths(256, 8), 1), with_sweep).ttft["p50"]
    assert alone == pytest.approx(0.0536, rel=0.05)
    price = prompt_token_price(sweep, with_sweep, cfg.max_num_batched_tokens)
    assert price.data_ms == pytest.approx(0.1) and price.model_ms == pytest.approx(0.1, rel=0.10)


def test_a_prompt_sweep_prices_a_token_not_the_time_outside_the_steps():
    """The sweep's requests each follow a 2-token one, the points' a whole workload's, and on the CPU engine the sweep
    spent less outside the steps (Theil-Sen lines of two runs: 9.0 and 7.7 ms at no prompt for the sweep, 13.5 and
    11.0 ms for the same runs' 1-stream requests, one price of a token). The test's sweep is 9 ms faster than the
    points: its own time outside the steps is fitted apart, so the fit still charges 0.1 ms a token (within 10%)
    and a 256-token prompt alone, as the points send it, 10 + 25.6 + 18 = 53.6 ms (within 5%). With one time
    outside the steps for both, the fit priced a token at 0.073 ms and that prompt at 50.1 ms (-6.6%)."""
    truth = StepTimeModel(weight_bytes=0, kv_bytes_per_token=0, linear_flops_per_token=1e5, attn_flops_per_pair=0,
                          bandwidth_bytes_s=1e9, peak_flops=1e9, mem_efficiency=1.0, compute_efficiency=1.0,
                          overhead_s=0.010, request_overhead_s=0.018)
    cfg, lengths, per_stream = SchedulerConfig(num_blocks=1000, block_size=16), Lengths(64, 16), 5
    points, first = [], 0
    for seq, c in enumerate((1, 2, 3, 4)):
        lat = predict_latency(cfg, closed_loop(c, lengths, per_stream, first), truth)
        points.append({"seq": seq, "concurrency": c, "first_index": first, "ttft": lat.ttft, "itl": lat.itl,
                       "throughput_tok_s": lat.output_tokens_per_s,
                       "request_throughput": lat.output_tokens_per_s / lengths.output})
        first += c * per_stream
    sweep = [(n, 0.010 + n * 1e-4 + 0.018 - 0.009) for n in range(32, 513, 32)]
    base = replace(truth, compute_efficiency=0.3, overhead_s=0.0, request_overhead_s=0.0)
    fitted = calibrate_bench(points, lengths, cfg, base, per_stream, single_requests=sweep)
    alone = predict_latency(cfg, closed_loop(1, Lengths(256, 8), 1), fitted).ttft["p50"]
    assert alone == pytest.approx(0.0536, rel=0.05)
    assert prompt_token_price(sweep, fitted, cfg.max_num_batched_tokens).model_ms == pytest.approx(0.1, rel=0.10)


def test_sen_interval_of_many_points_is_that_of_the_points_it_keeps():
    """Past `MAX_THEIL_SEN_POINTS` (1,500) the slopes are of an evenly spaced subsample: 3,000 points keep every
    other one, and the interval's variance counts those 1,500, not 3,000 (which would widen it to the slopes'
    extremes)."""
    pts = [(float(i % 500 + 1), 0.3 * (i % 500 + 1) + 5.0 * ((i * 7919) % 13 - 6)) for i in range(3000)]
    assert theil_sen_interval(pts) == theil_sen_interval(pts[::2])
    assert theil_sen(pts)[1] == theil_sen(pts[::2])[1]
