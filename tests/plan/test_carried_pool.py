"""A load that starts on the pool an earlier one left (`simulate`'s ``start``, `CarriedPool`), counted by hand.

vLLM's prefix cache lives as long as the engine (`BlockPool`, v1/core/block_pool.py@0.32.0), so a bench point finds
what the warm-up and the earlier points cached. The pool here: 17 blocks of 32 (16 usable); requests of 256 prompt +
32 output tokens with 75% of the prompt shared: 192 tokens, 6 full blocks every request has (`_key`'s
``("shared", k)``); a request holds cdiv(256 + 32 - 1, 32) = 9 blocks at its end, its prompt's 8 full blocks cached
(6 shared, 2 its own) and its last (31 tokens) not.
"""

from __future__ import annotations

import pytest

from kvplan.plan.block_pool import LinkedBlockPool
from kvplan.plan.hybrid_cache import CHUNKED, SLIDING
from kvplan.plan.simulate import EMPTY_POOL, Lengths, SchedulerConfig, closed_loop, simulate

CONFIG = SchedulerConfig(17, 32)
LENGTHS = Lengths(256, 32)
SHARED = LinkedBlockPool.PRIVATE


def test_the_warm_up_leaves_its_blocks_in_vllms_free_queue_order():
    """One request alone (the warm-up: request 0) on a fresh pool takes blocks 1-9. Freed last block first: block 9
    (uncached) to the queue's head, then 8, 7 (its own full blocks) and 6 .. 1 (the shared prefix) to the tail.
    The queue, head first: 9, then 10 .. 16 (never taken), then 8, 7, 6, 5, 4, 3, 2, 1."""
    warm = simulate(CONFIG, closed_loop(1, LENGTHS, 1, 0, shared_prefix=0.75), start=EMPTY_POOL)
    assert (warm.prefix_queries, warm.prefix_hits) == (256, 0)
    state = warm.pool_after.state
    assert state.free == (9, 10, 11, 12, 13, 14, 15, 16, 8, 7, 6, 5, 4, 3, 2, 1)
    assert state.keys == (None,) * 8 + (SHARED, SHARED) + tuple(("shared", k) for k in (5, 4, 3, 2, 1, 0))
    assert warm.pool_after.requests == 1


def test_a_point_after_the_warm_up_hits_from_its_first_request():
    """1 stream of 3 requests (numbers 1-3) after the warm-up: each finds the 6 shared blocks, 192 of its 256
    tokens: 576 of 768 (75%). On an empty pool the first misses: 384 (50%). The schedule is the same."""
    warm = simulate(CONFIG, closed_loop(1, LENGTHS, 1, 0, shared_prefix=0.75), start=EMPTY_POOL)
    carried = simulate(CONFIG, closed_loop(1, LENGTHS, 3, 1, shared_prefix=0.75), start=warm.pool_after)
    cold = simulate(CONFIG, closed_loop(1, LENGTHS, 3, 1, shared_prefix=0.75))
    assert (carried.prefix_queries, carried.prefix_hits) == (768, 576)
    assert (cold.prefix_queries, cold.prefix_hits) == (768, 384)
    assert [r.cached_tokens for r in carried.requests] == [192, 192, 192]
    assert carried.steps == cold.steps and carried.preemptions == cold.preemptions == 0
    assert cold.pool_after is None  # (not kept on a cold start)
    # The next point (2 streams, numbers 4-7) after both: 4 x 192 = 768 of 1024, its requests numbered on from 4.
    after = simulate(CONFIG, closed_loop(2, LENGTHS, 2, 4, shared_prefix=0.75), start=carried.pool_after)
    assert (after.prefix_queries, after.prefix_hits) == (1024, 768)
    assert after.pool_after.requests == 1 + 3 + 4


def test_requests_of_a_later_load_never_take_an_earlier_ones_own_blocks():
    """No shared prefix: every block is a request's own. 2 streams of one request need 2 x 9 blocks of 16: one is
    preempted, and its full blocks go into the map under its own hashes (`promote`, as vLLM has them all along), where
    they stay when it ends. The next load on that pool numbers its requests on from 2, so none finds them (numbered
    from 1 again, the same two would)."""
    first = simulate(CONFIG, closed_loop(2, LENGTHS, 1, 0), start=EMPTY_POOL)
    assert first.preemptions >= 1 and first.prefix_hits == 0
    second = simulate(CONFIG, closed_loop(2, LENGTHS, 1, 0), start=first.pool_after)
    assert second.prefix_hits == 0 and second.pool_after.requests == 4


def test_a_state_is_taken_between_loads_only():
    pool = LinkedBlockPool(4)
    pool.take(1)
    with pytest.raises(ValueError, match="every block free"):
        pool.state()


@pytest.mark.parametrize("groups", [(SLIDING, 64), (CHUNKED, 64)], ids=["window", "chunked"])
def test_a_hybrid_pool_carried_over_is_the_pool_one_load_would_have_kept(groups):
    """A hybrid pool (a 64-token window or chunk group beside full attention, 40 blocks of 32) carried from one load
    to the next is the pool one load spanning both would hold between them: three requests at t = 0, then three at
    t = 10^6 (long after the first three end), 160 + 16 tokens each with 96 shared. The later three, simulated on the
    earlier load's `pool_after`, hit the same blocks and get the same block tables, event for event, as in the one
    load (whose hybrid scheduler is vLLM's KVCacheManager block for block: tests/vllm_facing/test_hybrid_pool_parity.py);
    on an empty pool their first request would miss the shared prefix the earlier load cached."""
    from kvplan.plan.hybrid_cache import FULL, CacheGroup, HybridGroups
    from kvplan.plan.hybrid_sim import simulate_groups
    from kvplan.plan.simulate import open_loop

    kind, span = groups
    hg = HybridGroups((CacheGroup(kind, span), CacheGroup(FULL)), 32, 512, 2048)
    config, lengths = SchedulerConfig(40, 32), Lengths(160, 16)
    late = [1e6] * 3
    whole: list[tuple] = []
    one = simulate_groups(config, open_loop([0.0] * 3 + late, lengths, shared_prefix_tokens=96), hg, trace=whole)
    first = simulate_groups(config, open_loop([0.0] * 3, lengths, shared_prefix_tokens=96), hg, start=EMPTY_POOL)
    carried_trace: list[tuple] = []
    carried = simulate_groups(config, open_loop(late, lengths, 3, shared_prefix_tokens=96), hg, trace=carried_trace,
                              start=first.pool_after)
    cold = simulate_groups(config, open_loop(late, lengths, 3, shared_prefix_tokens=96), hg)
    later = [e for e in whole if e[0] != "step" and e[1] >= 3]
    assert carried_trace == later and carried_trace
    assert [r.cached_tokens for r in carried.requests] == [r.cached_tokens for r in one.requests[3:]]
    assert carried.prefix_hits == one.prefix_hits - first.prefix_hits > cold.prefix_hits
    assert carried.pool_after.requests == 6
