"""The hybrid KV cache's one-at-a-time replay (kvplan.plan.hybrid_sim.replay_one_at_a_time) against the hybrid
simulator stepping the same requests as one session, and, with one full-attention group, against the working-set
curve (kvplan.plan.prefix_cache.working_set); the groups read off kvplan's layouts. (The simulator itself is
checked block for block against vLLM's KVCacheManager in tests/vllm_facing/test_hybrid_pool_parity.py.)"""

from __future__ import annotations

import random

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.hybrid_cache import CHUNKED, FULL, MAMBA, SLIDING, CacheGroup, HybridGroups
from kvplan.plan.hybrid_sim import replay_one_at_a_time, simulate_groups
from kvplan.plan.prefix_cache import BlockHasher, working_set
from kvplan.plan.simulate import SchedulerConfig, SimTurn, session_load
from kvplan.traffic.model import Segment, Turn


def _turns(seed: int, n: int = 50) -> list[Turn]:
    """Requests from a few system prompts and documents (shorter copies too), unique tails, outputs crossing
    blocks and windows."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        segs = [Segment(f"sys{rng.randrange(3)}", rng.choice([40, 64, 100, 150]))]
        if rng.random() < 0.5:
            segs.append(Segment("doc", rng.choice([20, 70, 130])))
        segs.append(Segment(f"user{i}", rng.randrange(1, 60)))
        out.append(Turn(f"r{i}", 0, tuple(segs), rng.randrange(1, 90), arrival_s=float(i)))
    return out


def _sim_turns(turns: list[Turn], B: int) -> list[SimTurn]:
    hasher = BlockHasher(B)
    return [SimTurn(0, t.prompt_tokens, t.output_tokens, hasher.prompt_keys(t.segments),
                    arrival=0.0 if i == 0 else None) for i, t in enumerate(turns)]


GROUPS = {
    "window": (CacheGroup(FULL), CacheGroup(SLIDING, 40)),
    "two-windows": (CacheGroup(SLIDING, 24), CacheGroup(FULL), CacheGroup(SLIDING, 24), CacheGroup(FULL)),
    "three-specs": (CacheGroup(FULL), CacheGroup(SLIDING, 33), CacheGroup(SLIDING, 100)),
    "chunked": (CacheGroup(FULL), CacheGroup(CHUNKED, 48)),
    "mamba": (CacheGroup(MAMBA), CacheGroup(MAMBA), CacheGroup(FULL)),
    "mamba-window": (CacheGroup(FULL), CacheGroup(SLIDING, 40), CacheGroup(MAMBA)),
    "mamba2": (CacheGroup(MAMBA, checkpoint=True), CacheGroup(FULL), CacheGroup(MAMBA, checkpoint=True)),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("groups", list(GROUPS))
@pytest.mark.parametrize("retention", [0, None, 64])
@pytest.mark.parametrize("budget", [1 << 30, 48])
def test_one_at_a_time_replay_is_the_simulators(seed, groups, retention, budget):
    """At every pool size (from one that barely holds the largest request up), the replay's lookups and hits
    are the simulator's for the same requests as one session (each sent when the one before ends)."""
    B = 16
    turns = _sim_turns(_turns(seed), B)
    hg = HybridGroups(GROUPS[groups], B, 1 << 20, budget, retention)
    tried = 0
    for usable in (60, 90, 150, 400, 5000):
        config = SchedulerConfig(num_blocks=usable + 1, block_size=B, max_num_batched_tokens=budget)
        try:
            res = simulate_groups(config, session_load(turns), hg)
        except KvplanError:
            with pytest.raises(KvplanError):
                replay_one_at_a_time(turns, hg, usable, budget)
            continue
        assert res.preemptions == 0
        assert replay_one_at_a_time(turns, hg, usable, budget) == (res.prefix_queries, res.prefix_hits), usable
        tried += 1
    assert tried >= 3


@pytest.mark.parametrize("seed", range(3))
def test_one_full_attention_group_is_the_working_set(seed):
    """With one full-attention group the replay is the working-set curve's one-at-a-time model: equal hits at
    every pool size."""
    B = 16
    raw = _turns(seed)
    ws = working_set(raw, B)
    hg = HybridGroups((CacheGroup(FULL),), B, 1 << 20, 1 << 30)
    need = max(-(-(t.prompt_tokens + t.output_tokens - 1) // B) for t in raw)
    for usable in (need, need + 5, 2 * need, 5 * need, 10_000):
        assert replay_one_at_a_time(_sim_turns(raw, B), hg, usable) == (ws.queried_tokens, ws.hit_blocks(usable) * B)


@pytest.mark.parametrize("model,groups", [
    ("meta-llama/Llama-3.1-8B", (CacheGroup(FULL),)),
    ("openai/gpt-oss-20b", (CacheGroup(SLIDING, 128), CacheGroup(FULL))),
    ("google/gemma-3-12b-it", (CacheGroup(SLIDING, 1024),) * 5 + (CacheGroup(FULL),)),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", (CacheGroup(CHUNKED, 8192),) * 3 + (CacheGroup(FULL),)),
])
def test_groups_of_real_models(model, groups):
    """The groups kvplan plans for real model configs (windows from their config.json: gpt-oss 128, Gemma 3
    1,024 in five groups of sliding layers beside one of full ones; Llama 4's chunks of 8,192)."""
    from kvplan.api import size

    plan = size(model, "H100", gpus=8, ctx=8192)
    hg = HybridGroups.of_capacity(plan.capacity)
    assert hg.groups == groups
    assert hg.block_size == plan.block_size and hg.max_model_len == 8192
    assert hg.full_attention_only == (len(groups) == 1)


@pytest.mark.parametrize("model,gpu,layers", [
    # Qwen3-Next: 48 layers, every 4th full attention (config.json full_attention_interval 4): 36 gated-delta-net
    # layers in 3 groups of 12 beside the 12 full-attention ones. A100: no GDN checkpoint page.
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", "A100-80GB-SXM", (MAMBA,) * 3 + (FULL,)),
    # Jamba v0.1: 32 layers, attention every 8th (attn_layer_period 8): 28 Mamba-1 layers, 7 groups of 4.
    ("ai21labs/Jamba-v0.1", "H100", None),
])
def test_recurrent_state_in_align_mode_is_modelled(model, gpu, layers):
    """A Mamba / linear-attention group in "align" mode without a prefill checkpoint page is a state group."""
    from kvplan.api import size

    plan = size(model, gpu, gpus=8, ctx=8192)
    hg = HybridGroups.of_capacity(plan.capacity)
    kinds = tuple(g.kind for g in hg.groups)
    if layers is not None:
        assert kinds == layers
    else:
        assert kinds.count(MAMBA) == 7 and kinds.count(FULL) == 1
    assert hg.has_mamba and hg.block_size == plan.block_size


@pytest.mark.parametrize("vllm_version,checkpoint", [("0.31.0", False), ("0.32.0", True), ("0.33.0", True)])
def test_mamba2_state_groups_carry_the_checkpoint_page_from_032(vllm_version, checkpoint):
    """Granite 4.0-H 350M: 32 layers, 4 attention (layer_types), 28 Mamba-2: 7 state groups of 4 beside the
    attention group. From 0.32 the Mamba-2 mixer exports a prefill checkpoint page
    (`MambaMixer2.get_kv_cache_spec`, model_executor/layers/mamba/mamba_mixer2.py@0.32.0): modelled."""
    from kvplan.api import size

    plan = size("ibm-granite/granite-4.0-h-350m", "A100-80GB-SXM", gpus=4, ctx=8192, vllm_version=vllm_version)
    hg = HybridGroups.of_capacity(plan.capacity)
    assert hg.groups == (CacheGroup(MAMBA, checkpoint=checkpoint),) * 7 + (CacheGroup(FULL),)
    assert hg.mamba_checkpoint == checkpoint


@pytest.mark.parametrize("vllm_version,gpu,checkpoint", [("0.32.0", "H100", False), ("0.33.0", "H100", True),
                                                         ("0.34.0", "H100", True), ("0.33.0", "A100-80GB-SXM", False)])
def test_gdn_state_groups_carry_the_checkpoint_page_on_hopper_from_033(vllm_version, gpu, checkpoint):
    """Qwen3-Next: 36 GDN layers in 3 state groups beside the 12 full-attention layers' group. FlashInfer's GDN
    prefill (the auto choice on Hopper) exports a prefill checkpoint page from 0.33
    (`QwenGatedDeltaNet.get_kv_cache_spec`, model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py@0.33.0),
    aligned to the block: modelled as Mamba-2's."""
    from kvplan.api import size

    plan = size("Qwen/Qwen3-Next-80B-A3B-Thinking", gpu, gpus=4, ctx=8192, vllm_version=vllm_version)
    hg = HybridGroups.of_capacity(plan.capacity)
    assert hg.groups == (CacheGroup(MAMBA, checkpoint=checkpoint),) * 3 + (CacheGroup(FULL),)
    assert hg.block_size % 64 == 0 if checkpoint else hg.block_size == 272


@pytest.mark.parametrize("model,gpu,vllm_version,engine_args,why", [
    # 0.26-0.27: mamba_cache_mode "all" for the families that support it.
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", "A100-80GB-SXM", "0.26.0", {}, "outside mamba_cache_mode 'align'"),
])
def test_unmodelled_recurrent_state_is_refused(model, gpu, vllm_version, engine_args, why):
    """What the state group does not model is refused, naming it, never given full attention's hits."""
    from kvplan.api import size

    plan = size(model, gpu, gpus=4, ctx=8192, vllm_version=vllm_version, **engine_args)
    with pytest.raises(KvplanError, match=why):
        HybridGroups.of_capacity(plan.capacity)


def test_sessions_held_at_once_on_a_hybrid_cache():
    """2 agent sessions of 2 turns (tests/plan/test_prefix_cache.py's hand-worked one): each largest turn holds
    cdiv(95, 16) = 6 blocks, 2 of them (the prefix) shared. Full attention + a 40-token window with 16 tokens in
    flight: the window group's admission cap is cdiv(min(39 + 16, 2048), 16) + 1 = 5 blocks, never shared. Session
    0 needs 6 + 5 = 11 blocks, session 1 (6 - 2) + 5 = 9: 20 hold both, 19 one. (Full attention alone: 10.)"""
    from kvplan.plan.prefix_cache import sessions_held_at_once
    from kvplan.traffic.loaders import agent_traffic

    traffic = agent_traffic(2, 2, 1, 32, 16, 16)
    hg = HybridGroups((CacheGroup(FULL), CacheGroup(SLIDING, 40)), 16, 2048, 16)
    assert [sessions_held_at_once(traffic, 16, n, hg) for n in (10, 11, 19, 20)] == [0, 1, 1, 2]
    assert [sessions_held_at_once(traffic, 16, n) for n in (9, 10)] == [1, 2]


def test_hybrid_workload_plan_against_the_simulator():
    """The hybrid working set's figures, each checked on the hybrid simulator (requests as one session): the hit
    rate at the pool, the achievable one (a pool that never evicts), and every share's pool keeps that share."""
    from kvplan.plan.prefix_cache import hybrid_sim_turns, workload_plan
    from kvplan.traffic.loaders import agent_traffic

    traffic = agent_traffic(6, 3, 2, 200, 60, 40)
    hg = HybridGroups((CacheGroup(SLIDING, 64), CacheGroup(FULL)), 16, 1 << 20, 1 << 30)
    turns = hybrid_sim_turns(traffic, 16)
    one = [SimTurn(0, t.prompt, t.output, t.keys, arrival=0.0 if i == 0 else None) for i, t in enumerate(turns)]

    def sim(pool: int):
        return simulate_groups(SchedulerConfig(num_blocks=pool + 1, block_size=16), session_load(one), hg)

    w = workload_plan(traffic, 16, 120, hg)
    full = sim(100_000)
    assert w.queried_tokens == full.prefix_queries
    assert w.achievable_hit_rate == round(full.prefix_hits / full.prefix_queries, 6) > w.hit_rate_at_pool > 0
    assert w.hit_rate_at_pool == round(sim(120).prefix_hits / full.prefix_queries, 6)
    for share, pool in w.pool_for_share.items():
        assert sim(pool).prefix_hits >= float(share.rstrip("%")) / 100 * full.prefix_hits, share
        assert w.pool_share_used[share] == round(pool / 120, 4)


def test_a_hybrid_working_set_too_large_to_replay_is_refused():
    """Every probe replays every block: a traffic above the bound is refused at once, naming its size."""
    from kvplan.plan.hybrid_sim import MAX_HYBRID_BLOCK_OPS, hybrid_working_set

    hg = HybridGroups((CacheGroup(SLIDING, 64), CacheGroup(FULL)), 16, 1 << 30, 1 << 30)
    positions = MAX_HYBRID_BLOCK_OPS // 2 // 30  # per group: x 2 groups x ~33 probes is above the bound
    with pytest.raises(KvplanError, match="block positions over the model's 2 KV groups"):
        hybrid_working_set([SimTurn(0, 16 * positions, 1)], hg, 1000)
