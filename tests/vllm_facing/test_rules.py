"""Every rule of kvplan/vllm/rules.py, against the vLLM source it follows.

Source lines are cited as path@version (the wheels unpacked for docs/vllm-accounting.md).
Expected numbers are hand arithmetic from the config fields, written next to each assert.
"""

from dataclasses import replace
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device, find_device
from kvplan.model.arch import parse_architecture
from kvplan.model.source import load_bundled
from kvplan.plan.capacity import compute_capacity, default_block_size, default_scheduler_limits, resolve_kv_dtype
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.plan.speculative import parse_speculative_config
from kvplan.units import GiB, MiB
from kvplan.vllm.rules import NEWEST_KNOWN, parse_version, rules_for

OVERHEAD = load_overhead()
H100 = find_device("H100")


def arch(name, **overrides):
    return parse_architecture(load_bundled(name).config, overrides or None)


def cap(model, version, device=H100, **settings):
    a = model if not isinstance(model, str) else arch(model)
    return compute_capacity(a, device, Settings(**settings), rules_for(version), OVERHEAD)


def gpu(total_bytes: int) -> Device:
    return Device(name="test GPU", memory_bytes=total_bytes, cuda_total_bytes=total_bytes, cuda_total_measured=True)


# --- version strings ------------------------------------------------------------------------


def test_version_strings_as_vllm_prints_them():
    assert parse_version("0.9.1.dev705+g01220ce89") == (0, 9, 1)  # kv003's log
    assert parse_version("v0.11.0rc2.dev98+g393de22d2") == (0, 11, 0)  # kv040's log
    assert parse_version("0.15") == (0, 15, 0)
    assert rules_for(None).version == NEWEST_KNOWN
    with pytest.raises(KvplanError):
        parse_version("latest")


# --- "GPU KV cache size: N tokens": three formulas --------------------------------------------

# gpt-oss-120b: 36 layers, 18 sliding (window 128) + 18 full, 8 KV heads of 64, bf16.
# One layer's 16-token page: 16 x 8 x (64 + 64) x 2 B = 32,768 B; 18 layers per group share a
# block id, so a block is 18 x 32,768 = 589,824 B. 9,798 blocks = 5,779,095,552 B (5.38 GiB).
GPT_OSS_AVAIL = 9798 * 589_824


def test_per_group_tokens_up_to_0_20():
    # v1/core/kv_cache_utils.py@0.11.0:1080 (and @0.9.2:871):
    #   num_tokens = num_blocks // len(kv_cache_groups) * min_block_size
    # 9,798 // 2 groups x 16 = 4,899 x 16 = 78,384.
    c = cap("openai/gpt-oss-120b", "0.11.0", kv_cache_memory_bytes=GPT_OSS_AVAIL, max_model_len=16000)
    assert c.layout.block_bytes == 589_824
    assert c.num_blocks == 9798
    assert c.kv_cache_tokens_reported == 78_384
    assert rules_for("0.20.0").token_report == "per_group"


def test_concurrency_tokens_from_0_21():
    # v1/core/kv_cache_utils.py@0.21.0:1708: num_tokens = int(max_concurrency * max_model_len).
    # Per request at L = 16,000 (H100 serve: max_num_batched_tokens 8,192):
    #   full:    cdiv(16000, 16) = 1,000 blocks
    #   sliding: cdiv(min(128 - 1 + 8192, 16000), 16) + 1 = cdiv(8319, 16) + 1 = 520 + 1 = 521
    # (kv_cache_interface.py SlidingWindowSpec.max_memory_usage_bytes@0.11.0-0.22.0)
    # 9,798 / 1,521 = 6.44181...; x 16,000 = 103,069.03 -> 103,069.
    c = cap("openai/gpt-oss-120b", "0.21.0", kv_cache_memory_bytes=GPT_OSS_AVAIL, max_model_len=16000)
    assert c.blocks_per_request(16000) == 1521
    assert c.kv_cache_tokens_reported == 103_069
    assert round(c.max_concurrency_reported, 2) == 6.44


def test_0_33_keeps_two_batches_in_flight_for_sliding_layers():
    # kv_cache_interface.py@0.33.0:938: min(window - 1 + extra + max_in_flight_tokens, L), with
    # config/vllm.py@0.33.0:601 max_in_flight_tokens = 2 x 8,192 (async scheduling, pp = 1):
    #   sliding: cdiv(min(127 + 16384, 16000), 16) + 1 = 1,000 + 1 = 1,001; full 1,000.
    # 9,798 / 2,001 = 4.89655...; x 16,000 = 78,344.8 -> 78,344.
    c = cap("openai/gpt-oss-120b", "0.33.0", kv_cache_memory_bytes=GPT_OSS_AVAIL, max_model_len=16000)
    assert c.blocks_per_request(16000) == 2001
    assert c.kv_cache_tokens_reported == 78_344


def test_v0_prints_blocks_times_block_size_and_has_no_null_block():
    # executor/executor_base.py@0.9.2:116: max_concurrency = num_gpu_blocks * block_size / max_model_len
    # Llama-3.1-8B: 32 x 2 x 8 x 128 x 2 B x 16 = 2 MiB a block; 1,478 blocks -> 23,648 tokens and
    # 23,648 / 29,000 = 0.815 -> "0.82x" (kv002, vLLM#10517).
    c = cap("meta-llama/Llama-3.1-8B", "0.6.0", kv_cache_memory_bytes=1478 * 2 * MiB, max_model_len=29000)
    assert rules_for("0.6.0").engine == "v0"
    assert c.num_blocks == 1478
    assert c.kv_cache_tokens_reported == 23_648
    assert round(c.max_concurrency_reported, 2) == 0.82
    assert c.usable_blocks == 1478  # V1's BlockPool pops a null block (block_pool.py@0.11.0:157); V0 does not


def test_0_21_tokens_differ_from_blocks_when_the_context_is_not_a_block_multiple():
    # 100 blocks, L = 1,000: 0.20 prints 100 // 1 x 16 = 1,600; 0.21 prints
    # int(100 / cdiv(1000, 16) x 1000) = int(100 / 63 x 1000) = int(1587.30) = 1,587.
    kw = {"kv_cache_memory_bytes": 100 * 2 * MiB, "max_model_len": 1000}
    assert cap("meta-llama/Llama-3.1-8B", "0.20.0", **kw).kv_cache_tokens_reported == 1600
    assert cap("meta-llama/Llama-3.1-8B", "0.21.0", **kw).kv_cache_tokens_reported == 1587


# --- the budget ------------------------------------------------------------------------------


def test_gpu_memory_utilization_default_0_92_from_0_20():
    # config/cache.py@0.19.1:41 Field(default=0.9); config/cache.py@0.20.0:66 Field(default=0.92).
    # 80 GiB = 85,899,345,920 B: x 0.9 = 77,309,411,328; x 0.92 = 79,027,398,246.4 -> ceil 79,027,398,247.
    assert rules_for("0.19.1").default_gpu_memory_utilization == 0.9
    assert rules_for("0.20.0").default_gpu_memory_utilization == 0.92
    kw = {"max_model_len": 8192, "enforce_eager": True}
    assert cap("meta-llama/Llama-3.1-8B", "0.19.1", gpu(80 * GiB), **kw).limiting_stage.requested == 77_309_411_328
    assert cap("meta-llama/Llama-3.1-8B", "0.20.0", gpu(80 * GiB), **kw).limiting_stage.requested == 79_027_398_247


def test_requested_memory_is_rounded_up_from_0_19_1():
    # gpu_worker.py@0.11.0:183: requested_memory = total_memory * gpu_memory_utilization (a float;
    # kvplan keeps the whole bytes); v1/worker/utils.py@0.19.1:408: math.ceil(total * util).
    # (10 GiB + 1 B) x 0.9 = 10,737,418,241 x 0.9 = 9,663,676,416.9 -> 9,663,676,416 / 9,663,676,417.
    dev = gpu(10 * GiB + 1)
    kw = {"max_model_len": 4096, "gpu_memory_utilization": 0.9, "enforce_eager": True}
    assert cap("Qwen/Qwen3-0.6B", "0.11.0", dev, **kw).limiting_stage.requested == 9_663_676_416
    assert cap("Qwen/Qwen3-0.6B", "0.19.1", dev, **kw).limiting_stage.requested == 9_663_676_417


def test_cuda_graph_memory_is_subtracted_from_0_20():
    # envs.py@0.19.1:1655 VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default "0"; envs.py@0.20.0:1725
    # default "1"; gpu_worker.py@0.20.0:379-400 subtracts the estimate unless enforce_eager.
    # Same util and settings: 0.20's available KV is smaller by exactly the CUDA-graph estimate.
    kw = {"max_model_len": 8192, "gpu_memory_utilization": 0.9}
    before = cap("meta-llama/Llama-3.1-8B", "0.19.1", **kw).limiting_stage
    after = cap("meta-llama/Llama-3.1-8B", "0.20.0", **kw).limiting_stage
    assert before.cudagraphs.bytes == 0
    assert after.cudagraphs.bytes == OVERHEAD.cudagraph_bytes[1]
    assert before.available.bytes - after.available.bytes == OVERHEAD.cudagraph_bytes[1]
    eager = cap("meta-llama/Llama-3.1-8B", "0.20.0", enforce_eager=True, **kw).limiting_stage
    assert eager.available.bytes == before.available.bytes


def test_kv_cache_memory_flag_from_0_11():
    # --kv-cache-memory-bytes exists in CacheConfig from 0.11 (config/cache.py@0.11.0), not in 0.9.2.
    assert not rules_for("0.9.2").kv_cache_memory_flag
    assert rules_for("0.11.0").kv_cache_memory_flag


# --- hybrid grouping -------------------------------------------------------------------------

# 10 sliding + 8 full layers, 4 KV heads of 128, bf16: a 16-token page is 16 x 4 x 256 x 2 = 32,768 B.
MIXED = {
    "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 1024,
    "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 4096, "vocab_size": 1000, "max_position_embeddings": 4096, "sliding_window": 512,
    "torch_dtype": "bfloat16",
    "layer_types": ["sliding_attention"] * 10 + ["full_attention"] * 8,
}


def test_group_size_fewest_layers_before_0_19_1():
    # v1/core/kv_cache_utils.py@0.11.0:977: group_size = min(len(layers) per type) = 8.
    # Sliding 10 layers -> cdiv(10, 8) = 2 groups of 5 (+3 padding each); full 8 -> 1 group: 3 groups.
    # A block is 8 x 32,768 = 262,144 B; 32,768,000 B -> 125 blocks -> 125 // 3 x 16 = 656 tokens.
    c = cap(parse_architecture(MIXED), "0.11.0", kv_cache_memory_bytes=32_768_000, max_model_len=4096)
    assert c.layout.num_kv_groups == 3
    assert c.layout.padding_layers == 6
    assert c.layout.block_bytes == 262_144
    assert c.num_blocks == 125
    assert c.kv_cache_tokens_reported == 656


def test_group_size_most_layers_when_close_from_0_19_1():
    # v1/core/kv_cache_utils.py@0.19.1:1046: if max_num_layers < min_num_layers * 1.5: group_size = max.
    # 10 < 8 x 1.5 = 12 -> group_size 10: sliding 1 group, full 1 group (8 + 2 padding).
    # A block is 10 x 32,768 = 327,680 B; 32,768,000 B -> 100 blocks -> 100 // 2 x 16 = 800 tokens.
    c = cap(parse_architecture(MIXED), "0.19.1", kv_cache_memory_bytes=32_768_000, max_model_len=4096)
    assert c.layout.num_kv_groups == 2
    assert c.layout.padding_layers == 2
    assert c.layout.block_bytes == 327_680
    assert c.num_blocks == 100
    assert c.kv_cache_tokens_reported == 800


def test_chunked_local_attention_uses_the_hybrid_manager_from_0_19_1():
    # envs.py@0.11.0:1391 VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE default "0", and
    # config/__init__.py@0.11.0:520 then disables the hybrid manager: chunked layers become full.
    # envs.py@0.19.1:1460: default "1".
    # Llama 4 Scout: 36 chunked (8,192) + 12 NoPE full layers, 8 KV heads of 128:
    # a page is 16 x 8 x 256 x 2 = 65,536 B.
    kw = {"kv_cache_memory_bytes": 48 * 65_536 * 1000, "max_model_len": 32768}
    old = cap("meta-llama/Llama-4-Scout-17B-16E-Instruct", "0.11.0", **kw)
    # 0.11: one group of 48 full layers, a block = 48 x 65,536 = 3,145,728 B -> 1,000 blocks.
    assert not old.hybrid_allocator
    assert old.layout.num_kv_groups == 1 and old.layout.block_bytes == 3_145_728 and old.num_blocks == 1000
    assert any("disables the hybrid KV manager" in n for n in old.notes)
    new = cap("meta-llama/Llama-4-Scout-17B-16E-Instruct", "0.19.1", **kw)
    # 0.19.1: 36 >= 12 x 1.5, so group_size 12: 3 chunked groups + 1 full, a block = 12 x 65,536
    # = 786,432 B -> 3,145,728,000 / 786,432 = 4,000 blocks.
    assert new.hybrid_allocator
    assert new.layout.num_kv_groups == 4 and new.layout.block_bytes == 786_432 and new.num_blocks == 4000


# --- dtypes and block sizes ------------------------------------------------------------------


def test_auto_kv_dtype_reads_a_modelopt_checkpoint_from_0_19_1():
    # utils/torch_utils.py@0.19.1:262-279 get_kv_cache_quant_algo_string: a ModelOpt config's
    # kv_cache_quant_algo "FP8" turns "auto" into fp8; 0.11 keeps the model dtype.
    a = arch("meta-llama/Llama-3.1-8B", quantization_config={
        "quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"})
    assert resolve_kv_dtype(a, "auto", rules_for("0.11.0")).bytes_per_element == 2
    assert resolve_kv_dtype(a, "auto", rules_for("0.19.1")).bytes_per_element == 1
    # Only ModelOpt checkpoints: a compressed-tensors kv_cache_scheme leaves "auto" at the model dtype.
    ct = arch("meta-llama/Llama-3.1-8B", quantization_config={
        "quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"},
        "config_groups": {"g": {"weights": {"num_bits": 8}}}})
    assert resolve_kv_dtype(ct, "auto", rules_for("0.33.0")).bytes_per_element == 2


def test_deepseek_v32_auto_is_fp8_ds_mla_only_in_0_11():
    # models/config.py@0.11.0:408-421 DeepseekV32ForCausalLM.verify_and_update_config sets
    # cache_dtype = "fp8_ds_mla" for "auto"; gone in 0.19.1 (auto stays bf16).
    a = arch("deepseek-ai/DeepSeek-V3.2")
    assert resolve_kv_dtype(a, "auto", rules_for("0.11.0")).name == "fp8_ds_mla"
    assert resolve_kv_dtype(a, "auto", rules_for("0.19.1")).name != "fp8_ds_mla"


def test_mla_block_size_64_on_hopper_128_on_blackwell():
    # platforms/cuda.py@0.11.0:165-182: FlashMLA 64; CUTLASS MLA (Blackwell) 128.
    a = arch("deepseek-ai/DeepSeek-V3")
    assert default_block_size(a, H100, rules_for("0.11.0")) == 64
    assert default_block_size(a, find_device("B200"), rules_for("0.11.0")) == 128
    assert default_block_size(arch("meta-llama/Llama-3.1-8B"), H100, rules_for("0.11.0")) == 16


def test_scheduler_defaults_and_the_0_33_big_gpu_tier():
    # engine/arg_utils.py@0.11.0 _set_default_args: >= 70 GiB non-A100: serve 8,192 / LLM 16,384
    # tokens, 1,024 seqs; else 2,048 / 8,192 and 256. engine/arg_utils.py@0.33.0:2973: >= 160 GiB
    # (B200) batches 16,384 for `vllm serve` too.
    def limits(device, usage, version):
        x = default_scheduler_limits(find_device(device), usage, rules_for(version))
        return x.max_num_seqs, x.max_num_batched_tokens

    assert limits("H100", "serve", "0.11.0") == (1024, 8192)
    assert limits("H100", "llm", "0.11.0") == (1024, 16384)
    assert limits("A100 80GB", "serve", "0.11.0") == (256, 2048)  # "a100" in the name: the small tier
    assert limits("L4", "llm", "0.11.0") == (256, 8192)
    assert limits("B200", "serve", "0.22.0") == (1024, 8192)
    assert limits("B200", "serve", "0.33.0") == (1024, 16384)
    # An H200 (~140 GiB) stays in the 70 GiB tier in 0.33.
    assert limits("H200", "serve", "0.33.0") == (1024, 8192)


def test_admission_checks_the_whole_prompt_from_0_19_1():
    # config/scheduler.py@0.19.1:139 scheduler_reserve_full_isl: bool = True.
    assert not rules_for("0.11.0").admit_full_prompt
    assert rules_for("0.19.1").admit_full_prompt


def test_max_len_check_counts_padding_from_0_19_1():
    # v1/core/kv_cache_utils.py@0.19.1 _max_memory_usage_bytes_from_groups counts padding layers:
    # group_size x page x sum(cdiv(maxmem_g, page)). MIXED at L = 4,096 (0.19.1: group_size 10):
    #   full: cdiv(4096, 16) = 256 pages; sliding (H100 serve batches 8,192 tokens):
    #   cdiv(min(512 - 1 + 8192, 4096), 16) + 1 = 256 + 1 = 257.  10 x 32,768 x (256 + 257) = 168,099,840 B.
    # 0.11 sums per real layer: 8 x 256 x 32,768 + 10 x 257 x 32,768 = 67,108,864 + 84,213,760 = 151,322,624.
    new = cap(parse_architecture(MIXED), "0.19.1", kv_cache_memory_bytes=32_768_000, max_model_len=4096)
    old = cap(parse_architecture(MIXED), "0.11.0", kv_cache_memory_bytes=32_768_000, max_model_len=4096)
    assert new.needed_for_max_model_len() == 168_099_840
    # 0.11 (group_size 8): the padding is not counted.
    assert old.needed_for_max_model_len() == 151_322_624


def test_speculative_state_blocks_count_per_request_from_0_15():
    """Qwen3-Next: 12 full-attention and 36 gated-delta-net layers, the state in 3 groups of 12. With K = 2
    drafted tokens each state group keeps 1 + 2 pages a request from 0.15.0 (0.14.1: 1): 3 x 2 = 6 blocks more,
    the same block size in both (the 0.11.1-0.19 alignment)."""
    spec = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 2})
    old, new = (cap("Qwen/Qwen3-Next-80B-A3B-Thinking", v, tensor_parallel_size=4, max_model_len=32768,
                    kv_cache_memory_bytes=8 * GiB, enable_prefix_caching=False, speculative=spec) for v in ("0.14.1", "0.15.0"))
    assert old.block_size == new.block_size
    assert new.blocks_per_request(32768) - old.blocks_per_request(32768) == 6


def test_mamba2_conv_state_keeps_the_drafted_tokens_from_0_17():
    """granite-4.0-h-350m: Mamba-2 conv dim 48 x 32 + 2 x 1 x 128 = 1,792 rows of bf16; K = 3 drafted tokens add 3
    columns from 0.17.0: 1,792 x 3 x 2 = 10,752 B a state (0.16.0: none). Gated delta net: always."""
    from kvplan.model.layers import MambaState

    spec = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3})

    def state_bytes(version, speculative):
        c = cap("ibm-granite/granite-4.0-h-350m", version, max_model_len=4096, kv_cache_memory_bytes=GiB,
                speculative=speculative)
        return next(s for s in c.arch.layers if isinstance(s, MambaState)).state_bytes()

    assert state_bytes("0.16.0", spec) == state_bytes("0.16.0", None)
    assert state_bytes("0.17.0", spec) - state_bytes("0.17.0", None) == 10_752
    assert rules_for("0.10.2").speculative_conv_variants == {"gated_delta_net"}
    assert rules_for("0.29.0").speculative_conv_variants == {"gated_delta_net", "mamba2", "kda", "short_conv"}


def test_every_rule_field_is_covered():
    """A new rule in VllmRules needs a test here: this list is the inventory."""
    tested = {
        "version", "engine", "default_gpu_memory_utilization", "subtracts_cudagraph_memory", "token_report",
        "hybrid_allocator", "group_size_close_factor", "unify_page_size", "block_size_multiple_of_16",
        "auto_kv_reads_checkpoint", "requested_memory_ceil", "kv_cache_memory_flag", "combined_capacity_line",
        "chunked_local_uses_hybrid", "async_scheduling_default", "inflight_counts_concurrent_batches",
        "mamba_prefix_caching", "hybrid_prefix_caching_default", "mamba2_checkpoint_page",
        "gdn_checkpoint_page_on_hopper", "hybrid_block_alignment", "mla_hybrid_block_min_128", "mla_block_size_rule",
        "nemotron_h_ssm_default", "qwen35_reads_mamba_ssm_dtype", "gdn_respects_ssm_dtype",
        "max_len_check_counts_padding", "big_gpu_tier", "sparse_mla_auto_fp8", "admit_full_prompt", "moe_shards_over_dp", "note",
        "free_uncached_first", "prefix_stats_at_admission", "mamba_counts_speculative_blocks",
        "speculative_conv_variants", "max_len_check_reserves_null_block", "dsv4_packed_layout", "dsv4_auto_fp8_ds_mla",
        "draft_kv_cache_dtype", "draft_model_keeps_target_kv_dtype", "offload_memory", "offload_cross_layer_mla",
        "capacity_logged_per_rank", "gpu_default_block_size", "extensible_kv_cache", "async_scheduling_with_pp",
    }
    assert set(rules_for(None).__dataclass_fields__) == tested


def test_every_rule_field_is_read_by_the_planner():
    """A rule field nothing reads is dead: every field name must appear in the planner's code."""
    import kvplan

    root = Path(kvplan.__file__).parent
    rules_file = root / "vllm" / "rules.py"
    code = "".join(p.read_text() for p in root.rglob("*.py") if p != rules_file)
    unread = [f for f in rules_for(None).__dataclass_fields__ if f not in ("version", "note") and f"rules.{f}" not in code]
    assert unread == []


def test_releases_outside_what_kvplan_has_read_are_named():
    assert rules_for(None).note is None and rules_for("0.11.0").note is None
    assert "newer than any release" in rules_for("9.9.9").note
    assert "older than any release" in rules_for("0.5.0").note


def test_release_boundaries():
    """Where each rule flips, over every release read (docs/vllm-accounting.md, "Rules by release",
    quotes the lines; a minor read only at its last patch is dated to the minor)."""
    from kvplan.vllm.rules import KNOWN_VERSIONS

    def flips(field):
        values = [getattr(rules_for(v), field) for v in KNOWN_VERSIONS]
        return [(KNOWN_VERSIONS[i], values[i]) for i in range(1, len(values)) if values[i] != values[i - 1]]

    assert flips("hybrid_allocator") == [("0.9.2", True)]  # per-group KV specs (kv_cache_utils.py@0.9.2)
    assert flips("unify_page_size") == [("0.12.0", True)]  # unify_kv_cache_spec_page_size
    assert flips("group_size_close_factor") == [("0.12.0", 1.25), ("0.18.1", 1.5)]
    assert flips("subtracts_cudagraph_memory") == [("0.20.0", True)]
    # blocks (V0 and 0.8) -> per_group (0.9) -> int(concurrency x L) (0.20.1)
    assert flips("token_report") == [("0.9.2", "per_group"), ("0.20.1", "concurrency")]
    assert flips("combined_capacity_line") == [("0.28.0", True)]
    assert flips("big_gpu_tier") == [("0.28.0", True)]
    for field in ("auto_kv_reads_checkpoint", "requested_memory_ceil", "chunked_local_uses_hybrid",
                  "max_len_check_counts_padding", "async_scheduling_default"):
        assert flips(field) == [("0.14.0", True)], field
    assert flips("inflight_counts_concurrent_batches") == [("0.26.0", True)]
    assert flips("hybrid_prefix_caching_default") == [("0.26.0", True)]
    assert flips("mamba_prefix_caching") == [("0.15.1", "align"), ("0.26.0", "all_for_supported"),
                                             ("0.28.0", "align")]
    assert flips("mamba2_checkpoint_page") == [("0.32.0", True)]
    assert flips("gdn_checkpoint_page_on_hopper") == [("0.33.0", True)]
    assert flips("hybrid_block_alignment") == [("0.11.1", "model"), ("0.20.0", "kernel")]
    assert flips("mla_hybrid_block_min_128") == [("0.27.1", True)]
    assert flips("mla_block_size_rule") == [("0.11.0", "backend_multiple"), ("0.18.1", "user")]
    assert flips("nemotron_h_ssm_default") == [("0.13.0", "float16"), ("0.20.0", "float32")]
    assert flips("qwen35_reads_mamba_ssm_dtype") == [("0.17.1", True)]
    assert flips("sparse_mla_auto_fp8") == [("0.11.0", True), ("0.11.1", False)]
    assert flips("admit_full_prompt") == [("0.19.1", True)]
    assert flips("free_uncached_first") == [("0.23.0", True)]  # block_pool.py: prepend_n (0.22.0: none)
    assert flips("prefix_stats_at_admission") == [("0.27.1", True)]  # "Record at admission" (0.26.0: at lookup)
    # "Reserve the null block" in the max_model_len check (kv_cache_utils.py@0.29.0; not in 0.28.0)
    assert flips("max_len_check_reserves_null_block") == [("0.29.0", True)]
    # DeepSeek-V4: `_get_packed_kv_cache_groups` from 0.29; "auto" -> fp8_ds_mla from 0.30 (0.29 asserts fp8)
    assert flips("dsv4_packed_layout") == [("0.29.0", True)]
    assert flips("dsv4_auto_fp8_ds_mla") == [("0.30.0", True)]
    # SpeculativeConfig.kv_cache_dtype from 0.26.0; 0.31's Model Runner V2 draft-model speculator ignores it
    assert flips("draft_kv_cache_dtype") == [("0.26.0", True)]
    assert flips("draft_model_keeps_target_kv_dtype") == [("0.31.0", True), ("0.32.0", False)]
    # the native offload tier: never built (0.11.1), pinned torch tensors (0.19.1), one shared region (0.27, PR #50094)
    assert flips("offload_memory") == [("0.19.1", "pinned"), ("0.27.1", "region")]
    assert flips("offload_cross_layer_mla") == [("0.24.0", True)]
    # a "GPU KV cache size" line per rank before the minimum (core.py@0.11.0), once after it (0.11.1)
    assert flips("capacity_logged_per_rank") == [("0.8.5", True), ("0.11.1", False)]
    # 0.34: CacheConfig.DEFAULT_BLOCK_SIZE 64, the extensible KV cache, async scheduling with pp > 1
    assert flips("gpu_default_block_size") == [("0.34.0", 64)]
    assert flips("extensible_kv_cache") == [("0.34.0", True)]
    assert flips("async_scheduling_with_pp") == [("0.34.0", True)]


def test_rules_are_a_value_not_shared_state():
    r = rules_for("0.11.0")
    assert replace(r, version="x") != r and rules_for("0.11.0") == r


# --- 0.34 --------------------------------------------------------------------------------------


def test_0_34_offers_the_backends_64_token_blocks():
    # config/cache.py@0.34.0:185 DEFAULT_BLOCK_SIZE = 64 (16 in 0.33.0); platforms/interface.py@0.34.0:782
    # `_preferred_block_size_for_backends(backend_classes, CacheConfig.DEFAULT_BLOCK_SIZE, ...)`, and
    # FlashAttention takes MultipleOf(16) (v1/attention/backends/flash_attn.py@0.34.0:367), so 64 stays.
    # Llama-3.1-8B: 32 layers x 2 x 8 heads x 128 x 2 B = 131,072 B a token; a 64-token block is 8 MiB.
    # 8,000 MiB: 1,000 blocks of 64 (0.33: 4,000 blocks of 16). At L = 8,192 a request holds
    # cdiv(8192, 64) = 128 blocks: 1,000 / 128 = 7.8125 x 8,192 = 64,000 tokens
    # (get_max_concurrency_for_kv_cache_config, v1/core/kv_cache_utils.py@0.34.0:1108).
    kw = {"kv_cache_memory_bytes": 8000 * MiB, "max_model_len": 8192}
    new = cap("meta-llama/Llama-3.1-8B", "0.34.0", **kw)
    old = cap("meta-llama/Llama-3.1-8B", "0.33.0", **kw)
    assert (new.block_size, new.layout.block_bytes, new.num_blocks) == (64, 8 * MiB, 1000)
    assert (old.block_size, old.num_blocks) == (16, 4000)
    assert new.blocks_per_request(8192) == 128
    assert new.kv_cache_tokens_reported == 64_000
    # An asked size is kept; the CPU platform offers its backends 128 (platforms/cpu.py@0.34.0:562).
    assert cap("meta-llama/Llama-3.1-8B", "0.34.0", block_size=16, **kw).block_size == 16
    from kvplan.vllm.platforms import CPU

    cpu = replace(gpu(64 * GiB), vendor="cpu", platform_rules=CPU)
    assert cap("meta-llama/Llama-3.1-8B", "0.34.0", cpu, **kw).block_size == 128


def test_0_34_keeps_async_scheduling_with_pipeline_parallel():
    # config/vllm.py@0.34.0:1637: async_scheduling = True unless pooling, an executor without it, or ROCm
    # DeepEP DBO (0.33.0's "V1 model runner ... pipeline parallelism" exception is gone with that runner);
    # config/vllm.py@0.34.0:565 max_concurrent_batches = pp_size + 1 with async scheduling.
    # gpt-oss-120b at pp 2 (a stage: 9 sliding + 9 full layers, one group each), L = 40,000, MNBT 8,192:
    #   0.34: max_in_flight_tokens = 3 x 8,192 = 24,576; sliding cdiv(min(127 + 24,576, 40,000), 64) + 1
    #         = cdiv(24,703, 64) + 1 = 386 + 1 = 387; full cdiv(40,000, 64) = 625; 1,012 a request.
    #   0.33: no async at pp 2, max_concurrent_batches = pp = 2: cdiv(127 + 16,384, 16) + 1 = 1,032 + 1 = 1,033;
    #         full cdiv(40,000, 16) = 2,500; 3,533 a request.
    kw = {"kv_cache_memory_bytes": 8 * GiB, "max_model_len": 40_000, "pipeline_parallel_size": 2}
    new = cap("openai/gpt-oss-120b", "0.34.0", **kw)
    old = cap("openai/gpt-oss-120b", "0.33.0", **kw)
    assert (new.async_scheduling, new.batches_in_flight) == (True, 3)
    assert (old.async_scheduling, old.batches_in_flight) == (False, 2)
    assert new.blocks_per_request(40_000) == 1012
    assert old.blocks_per_request(40_000) == 3533
    # --no-async-scheduling: pp batches, as before.
    off = cap("openai/gpt-oss-120b", "0.34.0", async_scheduling=False, **kw)
    assert off.batches_in_flight == 2


def test_measure_kv_cache_bytes_by_hand():
    # v1/worker/extensible_kv_cache.py@0.34.0:592-618:
    #   non_kv_used = init_free - free - committed; headroom = free + committed = init_free - non_kv_used
    #   margin = max(1 GiB, int(0.75 x transient)); available = min(requested - non_kv_used, headroom - margin)
    #   available -= transient (the larger of it and torch's reserve growth); max(available, 0)
    from kvplan.plan.capacity import measured_kv_bytes

    # 80 GiB requested (utilization 1.0), 79 GiB free at start, 20 GiB used, 4 GiB transient: margin 3 GiB;
    # min(80 - 20, 79 - 20 - 3) = 56; 56 - 4 = 52 GiB.
    assert measured_kv_bytes(80 * GiB, 79 * GiB, 20 * GiB, 4 * GiB) == 52 * GiB
    # A transient of 1 GiB: margin max(1, 0.75) = 1 GiB; min(60, 58) - 1 = 57 GiB.
    assert measured_kv_bytes(80 * GiB, 79 * GiB, 20 * GiB, 1 * GiB) == 57 * GiB
    # --gpu-memory-utilization 0.5 (40 GiB requested) binds: min(40 - 20, 56) - 4 = 16 GiB.
    assert measured_kv_bytes(40 * GiB, 79 * GiB, 20 * GiB, 4 * GiB) == 16 * GiB
    # Never negative.
    assert measured_kv_bytes(20 * GiB, 79 * GiB, 20 * GiB, 4 * GiB) == 0
    # ROCm's floor is 3 GiB (KV_CACHE_MARGIN_FLOOR_BYTES = (3 if is_rocm() else 1) << 30, line 64): a 1 GiB
    # transient keeps 3 GiB: min(60, 79 - 20 - 3) - 1 = 55 GiB. A 2 GiB transient: 3 GiB on AMD, 1.5 GiB on NVIDIA.
    from kvplan.plan.capacity import extensible_margin

    assert measured_kv_bytes(80 * GiB, 79 * GiB, 20 * GiB, 1 * GiB, 3 * GiB) == 55 * GiB
    amd = replace(gpu(80 * GiB), vendor="amd")
    assert (extensible_margin(2 * GiB, amd), extensible_margin(2 * GiB, gpu(80 * GiB))) == (3 * GiB, 3 * GiB // 2)


def test_0_34_sizes_the_pool_after_warmup_on_cuda():
    # config/cache.py@0.34.0:495 resolved_gpu_memory_utilization: the asked value, else 1.0 with the extensible
    # KV cache, else DEFAULT_GPU_MEMORY_UTILIZATION 0.92; config/vllm.py@0.34.0:3202-3212 turns it off off
    # CUDA/ROCm and under kv_cache_memory_bytes or num_gpu_blocks_override. v1/worker/utils.py@0.34.0
    # request_memory: ceil(total x util) -> 80 GiB x 1.0 = 85,899,345,920 B.
    from kvplan.plan.capacity import gpu_memory_utilization, measured_kv_bytes
    from kvplan.plan.overhead import STARTUP_BYTES

    kw = {"max_model_len": 8192, "enforce_eager": True}
    c = cap("meta-llama/Llama-3.1-8B", "0.34.0", gpu(80 * GiB), **kw)
    st = c.limiting_stage
    assert gpu_memory_utilization(c.settings, c.rules, c.device) == 1.0
    assert st.requested == 85_899_345_920
    # The budget is measure_kv_cache_bytes over the stage's own terms (graphs none under --enforce-eager;
    # the transient kept free is the profiled peak, gpu_worker.py@0.34.0:946 reserved_headroom_bytes =
    # peak_activation_memory), with STARTUP_BYTES held before vLLM's first snapshot.
    assert st.cudagraphs.bytes == 0
    free_at_start = 80 * GiB - STARTUP_BYTES[1]
    assert st.available.bytes == measured_kv_bytes(st.requested, free_at_start,
                                                   st.weights + st.non_torch.bytes, st.activation.bytes)
    # 0.33 (and 0.34 with --kv-cache-memory-bytes / --num-gpu-blocks-override) keep 0.92 and the profile run.
    assert cap("meta-llama/Llama-3.1-8B", "0.33.0", gpu(80 * GiB), **kw).limiting_stage.requested == 79_027_398_247
    given = cap("meta-llama/Llama-3.1-8B", "0.34.0", gpu(80 * GiB), kv_cache_memory_bytes=GiB, **kw)
    assert gpu_memory_utilization(given.settings, given.rules, given.device) == 0.92
    assert given.limiting_stage.available.bytes == GiB
    override = cap("meta-llama/Llama-3.1-8B", "0.34.0", gpu(80 * GiB), num_gpu_blocks_override=100, **kw)
    assert override.limiting_stage.requested == 79_027_398_247
