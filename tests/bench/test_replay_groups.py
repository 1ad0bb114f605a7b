"""`kvplan bench --traffic`'s prediction on the served model's KV cache groups (kvplan.bench.replay): a hybrid
model's replay is predicted on its groups (the hybrid simulator, checked against vLLM's KVCacheManager in
tests/vllm_facing/test_hybrid_pool_parity.py), a recurrent-state model gets no prediction and says why, and a
model kvplan cannot read is predicted as one full-attention group and says so."""

from __future__ import annotations

from kvplan.bench.loadgen import RequestRecord
from kvplan.bench.replay import ServedGroups, replay_figures, served_groups
from kvplan.bench.results import ServerFigures
from kvplan.plan.hybrid_cache import FULL, SLIDING, CacheGroup, HybridGroups
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.prefix_cache import hybrid_sim_turns
from kvplan.plan.simulate import SchedulerConfig, SimTurn, session_load
from kvplan.traffic.loaders import agent_traffic


def test_the_served_models_groups():
    gpt_oss = served_groups("openai/gpt-oss-20b", None, 32, 512)
    assert gpt_oss.groups is not None and gpt_oss.groups.groups == (CacheGroup(SLIDING, 128), CacheGroup(FULL))
    assert gpt_oss.groups.block_size == 32 and not gpt_oss.unknown and not gpt_oss.refused
    assert gpt_oss.kinds == ("sliding_window", "full_attention") and gpt_oss.one_full_attention_group is False
    llama = served_groups("meta-llama/Llama-3.1-8B", None, 16, None)
    assert llama == ServedGroups(None, kinds=("full_attention",)) and llama.one_full_attention_group
    qwen3_next = served_groups("Qwen/Qwen3-Next-80B-A3B-Thinking", None, 16, None)
    assert "mamba KV groups is not modelled" in qwen3_next.refused and qwen3_next.one_full_attention_group is False
    unknown = served_groups("/nonexistent/model-dir", None, 16, None)
    assert unknown.groups is None and "cannot read" in unknown.unknown and unknown.one_full_attention_group is None


def _records(n: int, overlap: bool) -> list[RequestRecord]:
    """One record per request, 1 s apart, each lasting 0.5 s (or 1.5 s: they overlap)."""
    return [RequestRecord(i, 0, float(i), sent_s=float(i), end_s=i + (1.5 if overlap else 0.5), ok=True)
            for i in range(n)]


def test_a_hybrid_replay_one_at_a_time_is_predicted_on_its_groups():
    """Requests that did not overlap: predicted by replaying them one at a time on the hybrid pool; the figures are
    the hybrid simulator's for the same requests as one session."""
    traffic = agent_traffic(3, 2, 1, 64, 40, 20, think_s=10.0, session_rate_per_s=0.05)
    hg = HybridGroups((CacheGroup(SLIDING, 48), CacheGroup(FULL)), 16, 1 << 20, 1 << 30)
    config = SchedulerConfig(num_blocks=41, block_size=16)
    fig = replay_figures(traffic, _records(traffic.num_requests, False), ServerFigures(), config, groups=ServedGroups(hg))
    assert fig.predicted_by == "working set (requests one at a time, in the traffic's order) on sliding 48 + full attention"
    turns = [SimTurn(0, t.prompt, t.output, t.keys, arrival=0.0 if i == 0 else None)
             for i, t in enumerate(hybrid_sim_turns(traffic, 16))]
    sim = simulate_groups(config, session_load(turns), hg)
    assert (fig.predicted_queries, fig.predicted_hits) == (sim.prefix_queries, sim.prefix_hits) and sim.prefix_hits > 0


def test_refused_and_unknown_groups_are_said():
    traffic = agent_traffic(3, 2, 1, 64, 40, 20, think_s=10.0, session_rate_per_s=0.05)
    config = SchedulerConfig(num_blocks=41, block_size=16)
    records = _records(traffic.num_requests, False)
    refused = replay_figures(traffic, records, ServerFigures(), config,
                             groups=ServedGroups(None, refused="the prefix cache of mamba KV groups is not modelled"))
    assert refused.predicted_by == "none: the prefix cache of mamba KV groups is not modelled"
    assert refused.predicted_hit_rate is None
    unknown = replay_figures(traffic, records, ServerFigures(), config, groups=ServedGroups(None, unknown="x unread"))
    assert unknown.predicted_by.endswith("(one full-attention KV group assumed: x unread)")
    assert unknown.predicted_hits == replay_figures(traffic, records, ServerFigures(), config).predicted_hits
