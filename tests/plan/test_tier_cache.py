"""The two-tier model (kvplan.plan.tier_cache) on tiny hand-built workloads, the expected values worked by
hand from vLLM 0.32's rules (the module docstring's steps 1-5).

Notation: B tokens a block; a request is its full prompt blocks as ids, P prompt tokens, M output tokens.
GPU: after a request its blocks are the most recent (its first block the newest); a partial last block
((P + M - 1) % B != 0) holds one slot, so G - 1 blocks stay cached. Orders are least recent first.
"""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.prefix_cache import traffic_working_set
from kvplan.plan.tier_cache import TierRequest, simulate_tiers, tier_curve, traffic_tier_requests
from kvplan.traffic.model import Segment, Traffic, Turn


def R(keys, P, M=3):
    return TierRequest(P, M, tuple(keys))


def run(requests, B, G, T, bpc=1):
    tier: list[int] = []
    res = simulate_tiers(requests, B, G, T, bpc, keep_per_request=True, tier_out=tier)
    return res, tier


def test_a_loaded_chunk_can_be_evicted_by_its_own_requests_store():
    # B = 4, G = 3 (2 cached after each request: P + M - 1 = 11 or 15 leaves a partial block), T = 3.
    reqs = [R((1, 2), 9), R((3, 4), 9), R((1, 2), 9), R((1, 2, 5), 13)]
    res, tier = run(reqs, 4, 3, 3)
    # r0: GPU and tier empty; stores 1, 2 -> tier [2, 1]; GPU [2, 1]
    # r1: misses; stores 3, 4: 1 free, evicts the LRU 2 -> [1, 4, 3]; GPU keeps [4, 3]
    # r2 (1, 2): GPU miss; tier lookup from block 0: 1 there, 2 not -> 1 tier block (4 tokens). It offers
    #    block 2 (stores start after the load): no room, protected {2}, the LRU is 1, the block it just
    #    loaded -> evicted; stores 2; touches what it loaded/offered that is still there -> [4, 3, 2].
    #    GPU [2, 1]
    # r3 (1, 2, 5): GPU hits 1, 2 (g = 2); tier lookup from block 2: 5 missing -> 0. No tier hit, so it
    #    offers every chunk 1, 2, 5: 2 is there (protected), 1 and 5 new, no room -> evicts 4, 3;
    #    re-ranks 1, 2, 5, the first the newest -> [5, 2, 1]
    assert res.per_request == ((0, 0), (0, 0), (0, 1), (2, 0))
    assert tier == [5, 2, 1]
    assert (res.queried_tokens, res.gpu_hit_tokens, res.tier_hit_tokens, res.missed_tokens) == (40, 8, 4, 28)
    assert (res.stored_chunks, res.evicted_chunks, res.failed_stores, res.distinct_chunks) == (7, 4, 0, 5)
    assert res.rate(res.tier_hit_tokens) == 4 / 40


def test_the_tier_serves_the_last_block_of_a_whole_block_prompt():
    # B = 4, P = 8: two full blocks. The GPU looks up at most (P - 1) // B = 1; the tier's keys cover
    # P // B = 2 blocks, so a repeat loads block 1 from the tier (vLLM then recomputes the last token).
    reqs = [R((1, 2), 8, 1), R((1, 2), 8, 1)]
    res, tier = run(reqs, 4, 100, 10)
    assert res.per_request == ((0, 0), (1, 1))
    assert (res.gpu_hit_tokens, res.tier_hit_tokens, res.queried_tokens) == (4, 4, 16)
    # r0 leaves [2, 1]; r1 touches only what it loaded (block 1's chunk 2), not its GPU hit 1 -> [1, 2]
    assert tier == [1, 2]


def test_chunks_of_two_blocks():
    # B = 4, 2 blocks a chunk (8 tokens); chunk i's key is its last block's id: keys[1::2].
    # r0 (1..4), P = 17: chunks 2, 4 stored -> [4, 2]; GPU (G = 3) keeps [2, 1]
    # r1 (5, 6, 7), P = 13: 1 chunk (6) stored, 2 free -> [4, 2, 6]; GPU [6, 5]
    # r2 (1, 2, 3, 4, 8), P = 21: GPU miss; tier chunks 2, 4 there -> 2 chunks = 4 blocks (16 tokens);
    #    the 5th block is half a chunk: not offered; touches 2, 4 -> [6, 4, 2]; GPU [2, 1]
    # r3 (1, 2, 3, 9), P = 17: GPU hits 1, 2 (g = 2); lookup from chunk 2 // 2 = 1 (key 9): missing -> 0;
    #    offers chunks 2 (there) and 9 (new, 2 free) -> [6, 4, 2, 9], re-ranked 2 newest -> [6, 4, 9, 2]
    reqs = [R((1, 2, 3, 4), 17), R((5, 6, 7), 13), R((1, 2, 3, 4, 8), 21), R((1, 2, 3, 9), 17)]
    res, tier = run(reqs, 4, 3, 5, bpc=2)
    assert res.per_request == ((0, 0), (0, 0), (0, 4), (2, 0))
    assert tier == [6, 4, 9, 2]
    assert (res.tier_hit_tokens, res.stored_chunks, res.evicted_chunks) == (16, 4, 0)


def test_a_chunk_straddling_the_gpu_hit_is_loaded_and_the_gpu_hit_chunks_are_not_touched():
    # B = 4, 2 blocks a chunk, G = 4 (3 cached), T = 10. r0 (1..6), P = 25: stores chunks 2, 4, 6 ->
    # [6, 4, 2]; the GPU keeps its top 3: [3, 2, 1].
    # r1 = r0: GPU hits 1, 2, 3 (g = 3); lookup from chunk 3 // 2 = 1: chunks 4, 6 there -> loads up to
    # chunk 3's end: 2 x 3 - 3 = 3 blocks (12 tokens, at least one chunk: loaded). Nothing left to offer.
    # It touches what it loaded, 4 and 6, not chunk 2 (its GPU hit): [2, 6, 4].
    reqs = [R((1, 2, 3, 4, 5, 6), 25), R((1, 2, 3, 4, 5, 6), 25)]
    res, tier = run(reqs, 4, 4, 10, bpc=2)
    assert res.per_request == ((0, 0), (3, 3))
    assert tier == [2, 6, 4]


def test_less_than_a_chunk_past_the_gpu_hit_loads_nothing():
    # B = 4, 2 blocks a chunk, G = 10. r0 (1, 2, 3), P = 13: one chunk (key 2; block 3 is half a chunk)
    # r1 (1, 2, 3, 4), P = 17: GPU hits 1, 2, 3 (g = 3); 2 chunks x 2 - 3 = 1 block left < a chunk -> 0.
    # No tier hit, so it offers both chunks: 2 (there), 4 (new) -> [4, 2]
    reqs = [R((1, 2, 3), 13), R((1, 2, 3, 4), 17)]
    res, tier = run(reqs, 4, 10, 5, bpc=2)
    assert res.per_request == ((0, 0), (3, 0))
    assert tier == [4, 2]


def test_an_offer_larger_than_the_tier_stores_nothing():
    # T = 2, no GPU cache (G = 0). r0 offers 3 new chunks: no 3 evictable -> prepare_store returns None.
    # r1 (4, 5) stores both -> [5, 4]; r2 = r0 misses (1 is not there) and fails again.
    reqs = [R((1, 2, 3), 13), R((4, 5), 9), R((1, 2, 3), 13)]
    res, tier = run(reqs, 4, 0, 2)
    assert res.per_request == ((0, 0),) * 3
    assert (res.failed_stores, res.stored_chunks, res.tier_hit_tokens) == (2, 2, 0)
    assert tier == [5, 4]


def test_the_tier_size_for_a_share_of_the_hits():
    # B = 4, no GPU cache, A = (1, 2), C = (3, 4), served A C A C.
    # T >= 4: nothing evicted; the repeats hit 2 + 2 blocks = 16 tokens (the unbounded tier).
    # T = 3: A [2, 1]; C evicts 2 -> [1, 4, 3]; A hits 1 (4 tokens), its store of 2 evicts the loaded 1
    #        -> [4, 3, 2]; C hits 3, 4 (8 tokens): 12 tokens, 75%.
    # T = 2: each request evicts the other's chunks: 0.  T = 1: every offer of 2 fails: 0.
    reqs = [R((1, 2), 9), R((3, 4), 9), R((1, 2), 9), R((3, 4), 9)]
    assert [simulate_tiers(reqs, 4, 0, t).tier_hit_tokens for t in (1, 2, 3, 4, 8)] == [0, 0, 12, 16, 16]
    curve = tier_curve(reqs, 4, 0, 3)
    assert curve.at_size.tier_hit_tokens == 12 and curve.unbounded.tier_hit_tokens == 16
    # 50% = 8 tokens: T = 3 is the first size reaching it; 90% / 99% (14.4 / 15.84): T = 4
    assert curve.tier_for_share == {"50%": 3, "90%": 4, "99%": 4}
    assert curve.points[1] == 0 and curve.points[2] == 0


def _turns():
    # sessions extending a shared 40-token prefix: B = 16 leaves partial blocks, replies make tails
    rows = []
    for t in range(3):
        for s in range(3):
            segs = [Segment("sys", 40)] + [Segment(f"s{s}:{u}", 30) for u in range(t + 1)]
            rows.append(Turn(f"s{s}", t, tuple(segs), 20, arrival_s=float(s) if t == 0 else None, think_s=5.0))
    return Traffic(tuple(sorted(rows, key=lambda r: (r.turn, r.session))), "sessions")


@pytest.mark.parametrize("pool", [3, 6, 10, 1000])
def test_the_gpu_side_is_the_working_set_curve(pool):
    # A cross-check between two implementations (prefix_cache.working_set's reuse distances, and this
    # module's block-level LRU), not a value from the code under test: the GPU hits at every pool agree.
    traffic = _turns()
    ws = traffic_working_set(traffic, 16)
    res = simulate_tiers(traffic_tier_requests(traffic, 16), 16, pool, 0)
    assert res.gpu_hit_tokens == ws.hit_blocks(pool) * 16
    assert res.queried_tokens == ws.queried_tokens


def test_a_store_threshold_stores_a_chunk_on_its_offer_number_threshold():
    # B = 4, G = 3 (2 cached), T = 10, store_threshold 2 (CPUOffloadingManager.counts).
    # r0 (1, 2): misses; offers 1, 2: offered once -> skipped (2). r1 (1, 2): GPU hits both (g = 2 = (9 - 1) // 4),
    # no tier lookup; no tier hit, so it offers 1, 2 again: offered twice -> stored, [2, 1]. r2 (3, 4): offered
    # once, skipped (2). r3 (1, 2): GPU miss (it holds r2's), tier hit 2 blocks; nothing left to offer.
    reqs = [R((1, 2), 9), R((1, 2), 9), R((3, 4), 9), R((1, 2), 9)]
    state: dict = {}
    res = simulate_tiers(reqs, 4, 3, 10, keep_per_request=True, store_threshold=2, state_out=state)
    assert res.per_request == ((0, 0), (2, 0), (0, 0), (0, 2))
    assert (res.stored_chunks, res.skipped_chunks, res.store_threshold) == (2, 4, 2)
    assert state == {"tier": [2, 1], "counts": [(1, 2), (2, 2), (3, 1), (4, 1)]}
    # 0 and 1 both store every offered chunk
    for threshold in (0, 1):
        plain = simulate_tiers(reqs, 4, 3, 10, keep_per_request=True, store_threshold=threshold)
        assert (plain.per_request, plain.stored_chunks, plain.skipped_chunks) == (res.per_request, 4, 0)


def test_a_failed_store_is_offered_again_by_each_later_step_of_its_request():
    # T = 2, G = 0, threshold 2. r0 (1, 2, 3): offered once, skipped. r1: offered twice -> 3 chunks admitted, no
    # room for 3 -> prepare_store fails; vLLM retries it on each of the request's M = 3 later steps (2 decode
    # steps, the step that sees it finished): each counts the offer again and fails again -> 5 offers each.
    reqs = [R((1, 2, 3), 13), R((1, 2, 3), 13)]
    state: dict = {}
    res = simulate_tiers(reqs, 4, 0, 2, store_threshold=2, state_out=state)
    assert (res.failed_stores, res.stored_chunks, res.skipped_chunks) == (1, 0, 3)
    assert state["counts"] == [(1, 5), (2, 5), (3, 5)]
    # the tracker holds at most max_tracker_size keys (_record_accesses): with 2, r0 tracks 1 and 2, and its 3
    # finds no key tracked before the call to age out (the call's own new keys never age each other out): not
    # tracked. A later offer of 4 ages out the least recent, 1.
    state = {}
    simulate_tiers(reqs[:1], 4, 0, 2, store_threshold=2, max_tracker_size=2, state_out=state)
    assert state["counts"] == [(1, 1), (2, 1)]
    state = {}
    simulate_tiers([*reqs[:1], R((4,), 5)], 4, 0, 2, store_threshold=2, max_tracker_size=2, state_out=state)
    assert state["counts"] == [(2, 1), (4, 1)]


def test_arc_keeps_reused_chunks_through_a_scan_and_adapts():
    # B = 4, G = 3 (2 cached: each request's own blocks), T = 4, M = 3; A = (1, 2), C = (5, 6), D = (7, 8).
    # ARC (arc.py): stored chunks enter T1; a request's reuse moves them to T2; eviction takes T1's LRU while
    # |T1| >= int(target), else T2's; victims go to the ghost lists B1 / B2; a store of a B1 key raises the target.
    # r0 A: T1 [2, 1] (finish re-ranks tail to head).  r1 (3, 4): T1 [2, 1, 4, 3].
    # r2 A: tier hit 2 blocks, reused: T2 [2, 1], T1 [4, 3].  r3 C: evicts 4, 3 from T1 (target 0) -> B1 [4, 3],
    # T1 [6, 5].  r4 D: evicts 6, 5 -> B1 [4, 3, 6, 5], T1 [8, 7].  r5 A: a tier hit (LRU evicted it in r4).
    # r6 C: 6 and 5 are in B1: the target rises 1 + 1 = 2 (|B2| / |B1| = 0 < 1); need 2: |T1| = 2 >= 2 -> T1's
    # 8 (B1), then |T1| = 1 < 2 -> T2's 2 (B2); B1 trimmed to 4 ([3, 6, 5, 8]), 5 and 6 leave it -> [3, 8].
    reqs = [R((1, 2), 9), R((3, 4), 9), R((1, 2), 9), R((5, 6), 9), R((7, 8), 9), R((1, 2), 9), R((5, 6), 9)]
    state: dict = {}
    arc = simulate_tiers(reqs, 4, 3, 4, keep_per_request=True, eviction_policy="arc", state_out=state)
    lru = simulate_tiers(reqs, 4, 3, 4, keep_per_request=True)
    assert [t for _, t in arc.per_request] == [0, 0, 2, 0, 0, 2, 0]
    assert [t for _, t in lru.per_request] == [0, 0, 2, 0, 0, 0, 0]
    assert state == {"t1": [7, 6, 5], "t2": [1], "b1": [3, 8], "b2": [2], "target": 2}
    assert (arc.eviction_policy, arc.evicted_chunks) == ("arc", 6)  # r3, r4, r6


def test_refuses_nonsense():
    with pytest.raises(KvplanError):
        simulate_tiers([], 0, 10, 10)
    with pytest.raises(KvplanError, match="eviction policy"):
        simulate_tiers([], 16, 10, 10, eviction_policy="fifo")
    with pytest.raises(KvplanError):
        simulate_tiers([], 16, 10, 10, store_threshold=-1)
    with pytest.raises(KvplanError):
        simulate_tiers([], 16, 10, -1)
    with pytest.raises(KvplanError):
        tier_curve([], 16, 10, 10, shares=(1.5,))
