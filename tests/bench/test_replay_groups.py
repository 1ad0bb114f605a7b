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
    assert "did not report its vLLM release" in qwen3_next.refused and qwen3_next.one_full_attention_group is False
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


def test_a_state_groups_checkpoint_page_is_the_releases_or_the_gpus():
    """A mixer's prefill checkpoint page is the release's choice (Mamba-2's from 0.32: `MambaMixer2.
    get_kv_cache_spec`, mamba_mixer2.py@0.32.0), the GPU's only for GDN from 0.33 (Hopper's FlashInfer prefill):
    the served release alone decides the groups, except a GDN model from 0.33 with no --gpu."""
    from kvplan.plan.hybrid_cache import MAMBA

    qwen3_next = "Qwen/Qwen3-Next-80B-A3B-Thinking"  # 36 GDN layers, 12 full-attention ones
    for release, gpu in (("0.32.0", None), ("0.33.0", "A100")):
        served = served_groups(qwen3_next, None, 16, None, release, gpu)
        assert served.groups is not None and not served.refused, (release, served)
        assert served.groups.groups == (CacheGroup(MAMBA),) * 3 + (CacheGroup(FULL),)
    no_gpu = served_groups(qwen3_next, None, 16, None, "0.33.0")
    assert no_gpu.groups is None and "depends on the GPU" in no_gpu.refused and "pass --gpu" in no_gpu.refused
    hopper = served_groups(qwen3_next, None, 16, None, "0.33.0", "H100")  # GDN's checkpoint page (Hopper, 0.33+)
    assert hopper.groups is not None and not hopper.refused, hopper
    assert hopper.groups.groups == (CacheGroup(MAMBA, checkpoint=True),) * 3 + (CacheGroup(FULL),)


def test_a_mamba2_models_groups_need_only_the_release(tmp_path):
    """A Granite-4.0-H layout (a Mamba-2 layer, a full-attention one) at toy size: its checkpoint page from 0.32
    on, whatever the GPU; none before; no prediction when the engine did not say its release."""
    import json

    from kvplan.plan.hybrid_cache import MAMBA

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "vocab_size": 1024,
        "hidden_size": 128, "intermediate_size": 256, "shared_intermediate_size": 256, "num_local_experts": 0,
        "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 2048, "mamba_n_heads": 4, "mamba_n_groups": 2,
        "mamba_d_state": 8, "mamba_d_head": 32, "mamba_d_conv": 4, "mamba_expand": 1, "dtype": "bfloat16"}))
    model = str(tmp_path)
    for release, gpu, checkpoint in (("0.31.0", None, False), ("0.32.0", None, True), ("0.33.0", None, True),
                                     ("0.33.0", "H100", True)):
        served = served_groups(model, None, 32, None, release, gpu)
        assert served.groups is not None, (release, gpu, served)
        assert served.groups.groups == (CacheGroup(MAMBA, checkpoint=checkpoint), CacheGroup(FULL)), (release, gpu)
    unknown = served_groups(model, None, 32, None)
    assert unknown.groups is None and "did not report its vLLM release" in unknown.refused


def test_the_release_a_vllm_server_reports():
    """`/version` (entrypoints/serve/instrumentator/basic.py@0.32.0): ``{"version": VLLM_VERSION}``."""
    from kvplan.engines.vllm import version_from_endpoint

    assert version_from_endpoint('{"version": "0.32.0"}') == "0.32.0"
    assert version_from_endpoint('{"version": "0.9.1.dev705+g01220ce89"}') == "0.9.1"
    for body in ("", "not json", "[]", '{"version": 32}', "{}", '{"version": "x"}',
                 '{"version": "%s"}' % ("9" * 5000), '{"version": "0.32.0", "pad": "%s"}' % ("x" * 5000),
                 "[" * 4000):  # nested deeper than Python's recursion limit, under the 4 KB cap
        assert version_from_endpoint(body) is None, body[:40]
