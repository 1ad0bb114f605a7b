"""Fleet sizing (kvplan.plan.fleet, `kvplan fit --rate [--pd]`), on a step-time model every step of which takes 10 ms
whatever it computes (overhead 10 ms, no other term): a request alone gets its first token after one step and
its last after ``output`` steps, and a replica's throughput is set by its slots alone, max_num_seqs / E2E."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.fleet import decode_replica, missed_targets, pd_replicas_for_rate, replicas_for_rate
from kvplan.plan.simulate import SchedulerConfig
from kvplan.plan.steptime import StepTimeModel

TEN_MS = StepTimeModel(weight_bytes=0, kv_bytes_per_token=0, linear_flops_per_token=0, attn_flops_per_pair=0,
                       bandwidth_bytes_s=1.0, peak_flops=1.0, overhead_s=0.010)


def test_the_count_is_the_first_below_the_replicas_throughput():
    """4 slots, 10 output tokens: a request holds a slot 10 steps = 100 ms, so a replica serves at most
    4 / 0.1 = 40 requests/s. 100 requests/s: 2 replicas get 50/s each, more than they serve (over 500 requests
    the queue grows by ~10/s for ~10 s: its last requests wait seconds), 3 get 33.3/s (83% of their slots): the
    SLO of TTFT p99 <= 1 s is met at 3, and what held 2 back is the batch (max_num_seqs), not the pool."""
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048)
    r = replicas_for_rate(config, TEN_MS, 100.0, prompt=100, output=10, slo={"ttft_p99": 1.0})
    assert r.replicas == 3 and r.per_replica_rate_per_s == pytest.approx(100 / 3)
    assert r.binding == "batch"
    assert r.prediction.ttft["p99"] <= 1.0 and r.prediction.e2e["p50"] >= 0.1  # a request alone: 10 steps
    assert not r.reason


def test_a_pool_smaller_than_the_batch_binds_first():
    """The same, but a pool of 20 usable blocks of 16: a request peaks at cdiv(100 + 10 - 1, 16) = 7 blocks, so
    2 run at once (14 blocks; a third waits for KV) though 4 slots are free: 2 / 0.1 s = 20 requests/s a replica,
    and 100 requests/s need 6 (16.7/s each, 83%) where 5 (20/s: at their throughput) leave the queue growing."""
    config = SchedulerConfig(num_blocks=21, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048)
    r = replicas_for_rate(config, TEN_MS, 100.0, prompt=100, output=10, slo={"ttft_p99": 1.0})
    assert r.replicas == 6 and r.binding == "kv"


def test_one_replica_that_meets_it_has_nothing_binding():
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048)
    r = replicas_for_rate(config, TEN_MS, 5.0, prompt=100, output=10, slo={"e2e_p99": 1.0})
    assert (r.replicas, r.binding, r.simulations) == (1, "none", 1)


def test_a_target_one_request_cannot_meet_is_out_of_reach_without_simulating():
    """A request alone takes 10 steps = 100 ms: an E2E target of 50 ms is met by no fleet."""
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=4)
    r = replicas_for_rate(config, TEN_MS, 10.0, prompt=100, output=10, slo={"e2e_p99": 0.05},
                          floor={"e2e": 0.1, "ttft": 0.01})
    assert r.replicas is None and r.simulations == 0 and "e2e_p99 out of reach" in r.reason


def test_the_largest_fleet_searched_and_the_simulation_limit():
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048)
    capped = replicas_for_rate(config, TEN_MS, 100.0, prompt=100, output=10, slo={"ttft_p99": 1.0}, max_replicas=2)
    assert capped.replicas is None and "2 replicas do not meet it" in capped.reason
    limited = replicas_for_rate(config, TEN_MS, 100.0, prompt=100, output=10, slo={"ttft_p99": 1.0}, max_simulations=1)
    assert limited.replicas is None and "simulation limit" in limited.reason


def test_missed_targets_ignores_what_the_simulation_has_no_value_for():
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=4)
    r = replicas_for_rate(config, TEN_MS, 1.0, prompt=100, output=1, slo={"ttft_p99": 1.0})
    assert missed_targets(r.prediction, {"tpot_p99": 0.001}) == []  # one output token: no TPOT
    assert missed_targets(r.prediction, {"ttft_p50": 0.001}) == ["ttft_p50"]


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf")])
def test_refusals(rate):
    config = SchedulerConfig(num_blocks=100, block_size=16)
    with pytest.raises(KvplanError):
        replicas_for_rate(config, TEN_MS, rate, prompt=10, output=10, slo={"ttft_p99": 1.0})
    with pytest.raises(KvplanError):
        replicas_for_rate(config, TEN_MS, 1.0, prompt=10, output=10, slo={})


# --------------------------------------------------------------------------- P/D pairs (fit --rate --pd)
#: Steps of 10 ms plus 1 us per context token read (1 B a token at 1 MB/s, no compute term): a decode step of n
#: requests at a mean context of c tokens takes 0.010 + n x c / 1e6 s.
KV_MS = StepTimeModel(weight_bytes=0, kv_bytes_per_token=1, linear_flops_per_token=0, attn_flops_per_pair=0,
                      bandwidth_bytes_s=1e6, peak_flops=1.0, mem_efficiency=1.0, overhead_s=0.010)


def test_a_decode_replica_runs_as_many_as_its_slots_pool_or_target_allow():
    """TEN_MS, 10 output tokens: every step 10 ms, a request holds its slot 10 steps (0.1 s). 4 slots and a large
    pool: 4 at once, 4 / 0.1 = 40 requests/s (batch). A pool of 20 blocks and 7 a request: 2 at once, 20/s (kv)."""
    r = decode_replica(TEN_MS, usable_blocks=10_000, blocks_per_request=7, max_num_seqs=4, prompt=100, output=10)
    assert (r.concurrency, r.binding, r.step_s) == (4, "batch", pytest.approx(0.010))
    assert r.rate_per_s == pytest.approx(40.0)
    r = decode_replica(TEN_MS, usable_blocks=20, blocks_per_request=7, max_num_seqs=4, prompt=100, output=10)
    assert (r.concurrency, r.binding, r.rate_per_s) == (2, "kv", pytest.approx(20.0))
    assert decode_replica(TEN_MS, usable_blocks=6, blocks_per_request=7, max_num_seqs=4, prompt=100, output=10) is None


def test_the_tpot_target_caps_a_decode_replica():
    """KV_MS, prompt 1,000 + output 10: mean context 1,000 + 5 + 1 = 1,006, a step of n takes 0.010 + 0.001006 n.
    A 20 ms target: n <= 0.010 / 0.001006 = 9.94, so 9 at once, steps of 19.054 ms, 9 / (10 x 0.019054) = 47.23/s."""
    r = decode_replica(KV_MS, usable_blocks=10_000, blocks_per_request=1, max_num_seqs=64, prompt=1000, output=10,
                       step_target_s=0.020)
    assert (r.concurrency, r.binding) == (9, "tpot")
    assert r.step_s == pytest.approx(0.019054) and r.rate_per_s == pytest.approx(9 / (10 * 0.019054))
    assert decode_replica(KV_MS, usable_blocks=10_000, blocks_per_request=1, max_num_seqs=64, prompt=1000, output=10,
                          step_target_s=0.011) is None  # one request alone: 11.006 ms


def test_a_pd_pair_for_a_rate():
    """TEN_MS, 4 slots, prompt 100 + output 10, 100 requests/s. Decode: 40/s a replica (above), ceil(100 / 40) = 3.
    Prefill: a request is one 10 ms step and a step takes 4, so a replica serves up to 400/s: at 100/s one replica
    keeps TTFT p99 far below 1 s - 50 ms of transfer - 10 ms of the decode's first step. 1 + 3 = 4 replicas."""
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048)
    pair = pd_replicas_for_rate(config, TEN_MS, 100.0, prompt=100, output=10, slo={"ttft_p99": 1.0},
                                transfer_s=0.05, blocks_per_request=7)
    assert (pair.decode_replicas, pair.prefill.replicas, pair.replicas) == (3, 1, 4) and not pair.reason
    assert pair.prefill.prediction.ttft["p99"] <= 1.0 - 0.05 - 0.010


def test_a_pd_pair_out_of_reach_or_asked_for_what_it_does_not_model():
    config = SchedulerConfig(num_blocks=10_000, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048)
    pair = pd_replicas_for_rate(config, TEN_MS, 10.0, prompt=100, output=10, slo={"ttft_p99": 0.06},
                                transfer_s=0.05, blocks_per_request=7)  # 50 ms + 10 ms leave nothing
    assert pair.replicas is None and "alone take the TTFT target" in pair.reason
    with pytest.raises(KvplanError, match="e2e_p99 is not modelled"):
        pd_replicas_for_rate(config, TEN_MS, 10.0, 100, 10, {"ttft_p99": 1.0, "e2e_p99": 2.0}, 0.05, 7)
    with pytest.raises(KvplanError, match="needs a TTFT target"):
        pd_replicas_for_rate(config, TEN_MS, 10.0, 100, 10, {"tpot_p99": 0.05}, 0.05, 7)
