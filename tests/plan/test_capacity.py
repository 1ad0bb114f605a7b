"""The pool arithmetic against the seed articles and real vLLM start-up reports.

Expected numbers are hand arithmetic from config fields (in comments) or what vLLM printed.
"""

import pytest

from kvplan.hardware.catalog import Device, find_device
from kvplan.model.arch import parse_architecture
from kvplan.model.source import load_bundled
from kvplan.plan.capacity import blocks_needed, compute_capacity, max_concurrency_for, pipeline_stages
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.units import GiB, MiB
from kvplan.vllm.rules import rules_for

OVERHEAD = load_overhead()


def arch(name, **overrides):
    return parse_architecture(load_bundled(name).config, overrides or None)


def capacity(name, device="H100", version="0.33.0", **settings):  # 0.34 sizes blocks and memory anew
    dev = find_device(device) if isinstance(device, str) else device
    return compute_capacity(arch(name), dev, Settings(**settings), rules_for(version), OVERHEAD)


def test_seed_pool_32gib_llama_8b():
    cap = capacity("meta-llama/Llama-3.1-8B", kv_cache_memory_bytes=32 * GiB, max_model_len=32768)
    # A 16-token block is 16 x 131,072 B = 2 MiB; 32 GiB / 2 MiB = 16,384 blocks.
    assert cap.layout.block_bytes == 2 * MiB
    assert cap.num_blocks == 16_384
    # vLLM's printed ceiling: 16,384 / (32,768 / 16) = 8.00x; at 8k contexts, 32x.
    assert cap.max_concurrency_reported == 8.0
    assert cap.num_blocks / cap.blocks_per_request(8192) == 32.0
    # The exact rule keeps block 0 as the null block: 16,383 usable blocks hold 7 full
    # 32k histories, not 8 (7 x 2,048 = 14,336 <= 16,383 < 16,384 = 8 x 2,048).
    assert max_concurrency_for(cap, 32768) == 7
    assert max_concurrency_for(cap, 8192) == 31  # 16,383 // 512


def test_seed_shared_prefix_two_requests():
    cap = capacity("meta-llama/Llama-3.1-8B", kv_cache_memory_bytes=32 * GiB, max_model_len=32768)
    # Two 24,576-token sequences sharing 16,384: 1,024 shared blocks + 2 x 512 own = 2,048 blocks
    # = 4 GiB, against 2 x 1,536 = 3,072 blocks = 6 GiB without sharing.
    assert blocks_needed(cap, 2, 24576, shared_prefix=16384) * cap.layout.block_bytes == 4 * GiB
    assert blocks_needed(cap, 2, 24576) * cap.layout.block_bytes == 6 * GiB


def test_gemma3_27b_reproduces_vllm_0_11_log():
    # kv040 (vLLM 0.11.0rc2, ROCm, max_model_len 4096): "Available KV cache memory: 109.86 GiB",
    # "Add 8 padding layers", "num_gpu_blocks is: 89994", "GPU KV cache size: 205,696 tokens",
    # "Maximum concurrency for 4,096 tokens per request: 50.05x".
    # Page = 16 x 16 KV heads x 128 x 2 (K,V) x 2 B = 131,072; groups of 10 layers (10 global
    # layers; 52 sliding -> 6 groups + 8 padding); one block = 1,310,720 B.
    available = 89_994 * 1_310_720  # the unrounded pool those 89,994 blocks came from
    cap = capacity("google/gemma-3-27b-it", device="MI300X", version="0.11.0",
                   kv_cache_memory_bytes=available, max_model_len=4096)
    assert cap.layout.padding_layers == 8
    assert cap.num_blocks == 89_994
    assert cap.kv_cache_tokens_reported == 89_994 // 7 * 16 == 205_696
    # per request: 256 full blocks + 6 sliding groups x (cdiv(min(1023 + 8192, 4096), 16) + 1)
    assert cap.blocks_per_request(4096) == 256 + 6 * 257
    assert round(cap.max_concurrency_reported, 2) == 50.05


def test_gpt_oss_120b_token_formula_by_version():
    # hf-mem#60 log: "Available KV cache memory: 5.38 GiB" -> "GPU KV cache size: 78,384 tokens".
    # 18 sliding + 18 full layers of 2 x 8 x 64 x 2 B: page 32,768 B, group 18 -> block 589,824 B.
    # 78,384 = 9,798 // 2 groups x 16, i.e. 9,798 blocks; 5.38 is the rounded print of 5.3822 GiB.
    cap = capacity("openai/gpt-oss-120b", version="0.11.0", kv_cache_memory_bytes=9_798 * 589_824,
                   max_model_len=131072)
    assert cap.kv_cache_tokens_reported == 78_384
    # From the rounded 5.38 GiB the same rule gives 9,793 blocks -> 78,336 (0.06 % low).
    rounded = capacity("openai/gpt-oss-120b", version="0.11.0", kv_cache_memory_bytes=int(5.38 * GiB),
                       max_model_len=131072)
    assert rounded.kv_cache_tokens_reported == 9_793 // 2 * 16
    # vLLM >= 0.21 prints int(concurrency x max_model_len) instead: 9,798 / (8,192 full +
    # cdiv(min(127 + 8192, 131072), 16) + 1 = 521 sliding blocks) x 131,072.
    new = capacity("openai/gpt-oss-120b", version="0.21.0", kv_cache_memory_bytes=9_798 * 589_824,
                   max_model_len=131072)
    assert new.kv_cache_tokens_reported == int(9_798 / (8192 + 521) * 131072)


def test_llama_8b_a100_log_0_15():
    # kv043 (vLLM 0.15.1): "Available KV cache memory: 19.28 GiB", "GPU KV cache size: 157,936
    # tokens", "Maximum concurrency for 131,072 tokens per request: 1.20x".
    # 19.28 GiB // 2 MiB per block = 9,871 blocks x 16 = 157,936; 9,871 / 8,192 = 1.20.
    cap = capacity("meta-llama/Llama-3.1-8B", device="A100 40GB", version="0.15.1",
                   kv_cache_memory_bytes=int(19.28 * GiB), max_model_len=131072)
    assert cap.kv_cache_tokens_reported == 157_936
    assert f"{cap.max_concurrency_reported:.2f}" == "1.20"


def test_v0_rtx3090_log():
    # kv001 (V0): 3.81 GiB -> "# GPU blocks: 1952" (3.81 is rounded: 1,952 x 2 MiB = 3.8125 GiB)
    # and "Maximum concurrency for 20000 tokens per request: 1.56x" = 1,952 x 16 / 20,000.
    cap = capacity("meta-llama/Llama-3.1-8B", device="RTX 3090", version="0.6.0",
                   kv_cache_memory_bytes=1952 * 2 * MiB, max_model_len=20000)
    assert cap.num_blocks == 1952 and cap.usable_blocks == 1952  # V0 has no null block
    assert f"{cap.max_concurrency_reported:.2f}" == "1.56"


def test_mla_default_block_size_and_tp_replication():
    cap = capacity("deepseek-ai/DeepSeek-V3", device="H200", tensor_parallel_size=8,
                   kv_cache_memory_bytes=40 * GiB, max_model_len=32768)
    assert cap.block_size == 64  # FlashMLA
    # MLA is replicated: per device 61 x 576 x 2 B per token, x 64 tokens per block.
    assert cap.layout.block_bytes == 61 * 576 * 2 * 64


def test_hybrid_mamba_raises_attention_block_size():
    # Qwen3-Next, TP 1: attention 2 KV heads x 256 x 2 x 2 B = 2,048 B/token; GDN state
    # (8,192 x 3 + 32 x 128 x 128) x 2 = 1,097,728 B -> block 16 x cdiv(1,097,728, 16 x 2,048) = 544
    # (an A100; or an H100 without prefix caching, no "align" mode).
    for device, settings in (("A100-80GB-SXM", {}), ("H100", {"enable_prefix_caching": False})):
        cap = capacity("Qwen/Qwen3-Next-80B-A3B-Thinking", device, kv_cache_memory_bytes=40 * GiB, max_model_len=32768,
                       **settings)
        assert cap.block_size == 544, device
        # 36 GDN + 12 attention layers -> group size 12 (36 >= 1.5 x 12): 3 state groups + 1 attention.
        assert [g.kind for g in cap.layout.groups].count("mamba") == 3
        assert cap.layout.block_bytes == 544 * 2048 * 12
    # On Hopper in "align" mode (prefix caching on) FlashInfer's GDN prefill exports checkpoints at 64-token
    # offsets, and vLLM 0.33 makes the block a multiple of them (`_align_hybrid_block_size`,
    # platforms/interface.py@0.33.0: lcm(16, 64)): 64 x cdiv(1,097,728, 64 x 2,048) = 64 x 9 = 576.
    cap = capacity("Qwen/Qwen3-Next-80B-A3B-Thinking", kv_cache_memory_bytes=40 * GiB, max_model_len=32768)
    assert cap.block_size == 576 and cap.layout.block_bytes == 576 * 2048 * 12
    # 0.32 exported no GDN checkpoints: 544 on Hopper too
    assert capacity("Qwen/Qwen3-Next-80B-A3B-Thinking", version="0.32.0", kv_cache_memory_bytes=40 * GiB,
                    max_model_len=32768).block_size == 544


def test_budget_terms_h100_0_11():
    # 79.18 GiB x 0.9 (0.11 default) = 71.262 GiB requested; weights 8.03B x 2 B.
    cap = capacity("meta-llama/Llama-3.1-8B", version="0.11.0", max_model_len=16000)
    st = cap.limiting_stage
    assert st.requested == int(79.18 * GiB * 0.9)
    assert st.weights == cap.arch.params.total * 2
    assert st.cudagraphs.bytes == 0  # not subtracted before 0.20
    assert st.available.bytes == st.requested - st.weights - st.activation.bytes - st.non_torch.bytes
    assert st.available.low < st.available.bytes < st.available.high


def test_util_default_and_cudagraphs_from_0_20():
    old = capacity("meta-llama/Llama-3.1-8B", version="0.19.1", max_model_len=16000).limiting_stage
    new = capacity("meta-llama/Llama-3.1-8B", version="0.20.0", max_model_len=16000).limiting_stage
    assert new.requested == pytest.approx(old.requested / 0.9 * 0.92, abs=2)
    assert old.cudagraphs.bytes == 0 and new.cudagraphs.bytes > 0
    eager = capacity("meta-llama/Llama-3.1-8B", version="0.20.0", max_model_len=16000, enforce_eager=True)
    assert eager.limiting_stage.cudagraphs.bytes == 0


def test_pipeline_stages_follow_get_pp_indices():
    # 61 layers over 4 stages: 15 each, the remainder 1 goes to the stage before the last.
    assert [len(r) for r in pipeline_stages(61, 4)] == [15, 15, 16, 15]
    assert [len(r) for r in pipeline_stages(32, 2)] == [16, 16]


def test_pipeline_pool_is_the_minimum_over_stages():
    cap = capacity("meta-llama/Llama-3.1-8B", device="RTX 4090", pipeline_parallel_size=2, max_model_len=8192)
    assert cap.num_blocks == min(st.num_blocks for st in cap.stages)
    assert cap.layout.block_bytes == 16 * 16 * 2 * 8 * 128 * 2  # 16 layers per stage


def test_num_gpu_blocks_override_pins_the_pool():
    cap = capacity("meta-llama/Llama-3.1-8B", num_gpu_blocks_override=17, block_size=32, max_model_len=512)
    assert cap.num_blocks == 17 and cap.usable_blocks == 16


def test_custom_device_memory():
    dev = Device("custom", 24 * GiB, 24 * GiB, True)
    cap = compute_capacity(arch("meta-llama/Llama-3.1-8B"), dev, Settings(max_model_len=8192),
                           rules_for("0.11.0"), OVERHEAD)
    assert cap.limiting_stage.requested == int(24 * GiB * 0.9)


def test_speculative_draft_layers_share_the_pool():
    # EAGLE: one draft layer shaped like the target's: 33 x 16 x 8 x 128 x 2 x 2 B = 2,162,688 B
    # per block; kv003's 51.63 GiB -> 25,633 blocks x 16 = 410,128 tokens (what vLLM printed).
    cap = capacity("meta-llama/Llama-3.1-8B", version="0.9.1", draft_layers=1,
                   kv_cache_memory_bytes=int(51.63 * GiB), max_model_len=131072)
    assert cap.layout.block_bytes == 2_162_688
    assert cap.kv_cache_tokens_reported == 410_128


def test_from_0_29_the_max_len_check_holds_the_null_block_back():
    """Llama-3.1-8B, blocks of 2 MiB: one 32,768-token request needs 2,048 blocks = 4 GiB. With exactly 4 GiB of
    KV memory vLLM 0.28 starts; 0.29 checks against 4 GiB less the null block's 2 MiB (`check_memory`,
    v1/core/kv_cache_utils.py@0.29.0) and refuses, estimating 32,752 tokens (2,047 blocks); one block more starts."""
    exact = dict(kv_cache_memory_bytes=4 * GiB, max_model_len=32768)
    assert capacity("meta-llama/Llama-3.1-8B", version="0.28.0", **exact).engine_starts
    refused = capacity("meta-llama/Llama-3.1-8B", version="0.29.0", **exact)
    assert not refused.engine_starts
    assert refused.estimated_max_model_len() == 2047 * 16
    more = dict(kv_cache_memory_bytes=4 * GiB + 2 * MiB, max_model_len=32768)
    assert capacity("meta-llama/Llama-3.1-8B", version="0.29.0", **more).engine_starts


def test_a_context_beyond_the_model_is_refused():
    # Llama-3.1-8B: max_position_embeddings 131,072 (no rope_scaling in the bundled subset).
    cap = capacity("meta-llama/Llama-3.1-8B", max_model_len=200_000)
    assert cap.context_too_long and not cap.engine_starts


def test_yarn_scaling_raises_the_limit():
    # _get_and_verify_max_len: YaRN's original 32,768 x factor 4 = 131,072.
    a = arch("Qwen/Qwen3-8B", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 32768})
    assert a.max_model_len_limit == 131_072
    assert arch("Qwen/Qwen3-8B").max_model_len_limit == 40_960


def test_block_sizes_vllm_accepts():
    import pytest as _pytest

    from kvplan.errors import KvplanError

    with _pytest.raises(KvplanError, match="block size 7"):
        capacity("meta-llama/Llama-3.1-8B", block_size=7, max_model_len=8192)
    with _pytest.raises(KvplanError):
        capacity("meta-llama/Llama-3.1-8B", version="0.11.0", block_size=256, max_model_len=8192)
    assert capacity("meta-llama/Llama-3.1-8B", block_size=256, max_model_len=8192).block_size == 256
    # MLA, by release (platforms/cuda.py; backends' get_supported_kernel_block_sizes):
    def mla(version, asked):
        return capacity("deepseek-ai/DeepSeek-V3", device="H200", version=version, tensor_parallel_size=8,
                        block_size=asked, kv_cache_memory_bytes=40 * GiB, max_model_len=8192)

    forced = mla("0.10.2", 128)  # FlashMLA forces 64 whatever was asked
    assert forced.block_size == 64 and any("forces block size 64" in n for n in forced.notes)
    assert mla("0.17.1", 16).block_size == 64  # 0.11-0.17: kept only as a multiple of FlashMLA's 64
    assert mla("0.17.1", 128).block_size == 128
    # From 0.18 an explicit size picks an MLA backend that takes it (FlashAttention MLA: multiples
    # of 16, v1/attention/backends/mla/flashattn_mla.py); a size no MLA backend takes is forced.
    assert mla("0.18.1", 16).block_size == 16
    odd = mla("0.32.0", 8)
    assert odd.block_size == 64


def test_per_token_head_scales_are_counted():
    from kvplan.model.dtypes import kv_dtype

    layer = arch("meta-llama/Llama-3.1-8B").layers[0]
    # int4 per-token-head: (128 + 128) x 0.5 B + 2 x 4 B of scales = 136 B per KV head (vLLM: h + 8).
    assert layer.bytes_per_token(kv_dtype("int4_per_token_head")) == 8 * 136
    # nvfp4: 2 x (128 / 2 + 128 / 16) = 144 B per KV head.
    assert layer.bytes_per_token(kv_dtype("nvfp4")) == 8 * 144
