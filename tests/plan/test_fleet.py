"""Fleet sizing (kvplan.plan.fleet, `kvplan fit --rate`), on a step-time model every step of which takes 10 ms
whatever it computes (overhead 10 ms, no other term): a request alone gets its first token after one step and
its last after ``output`` steps, and a replica's throughput is set by its slots alone, max_num_seqs / E2E."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.fleet import missed_targets, replicas_for_rate
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
