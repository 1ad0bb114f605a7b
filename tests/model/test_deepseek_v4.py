"""DeepSeek-V4: its caches, their packed groups and vLLM's start-up figures (issue 21).

The configs are the published ones. The expected figures are hand arithmetic from them and vLLM 0.32.0's
source (models/deepseek_v4/attention.py, compressor.py, v1/attention/backends/mla/sparse_swa.py,
v1/kv_cache_interface.py, v1/core/kv_cache_utils.py `_get_packed_kv_cache_groups`); the same figures came
out of vLLM's own grouping and capacity functions run on those specs, and a twin of this shape is built by
the CPU engine in tests/twins (synthetic/deepseek-v4). Pages: a packed state is 584 B (448 fp8 NoPE + 64 bf16
RoPE values + 8 scale bytes), pages round up to multiples of 576 B.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import find_device
from kvplan.model.arch import parse_architecture
from kvplan.model.dtypes import kv_dtype
from kvplan.model.layers import CompressedIndexer, CompressedMLA, CompressorState, SlidingMLA
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.plan.speculative import parse_speculative_config
from kvplan.units import GiB
from kvplan.vllm.rules import rules_for

# https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash-Base/blob/main/config.json
FLASH_BASE = {
    "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 1, "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 512, "hidden_act": "silu",
    "hidden_size": 4096, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512, "initializer_range": 0.02,
    "max_position_embeddings": 1048576, "model_type": "deepseek_v4", "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64,
    "num_experts_per_tok": 6, "num_hidden_layers": 43, "num_hash_layers": 3, "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1, "o_groups": 8, "o_lora_rank": 1024, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                                            "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128,
    "swiglu_limit": 10.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.57.1",
    "use_cache": True, "vocab_size": 129280, "compress_rope_theta": 160000, "topk_method": "noaux_tc",
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0]}
# https://huggingface.co/deepseek-ai/DeepSeek-V4-Pro/blob/main/config.json
PRO = {
    "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 1, "expert_dtype": "fp4", "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 512,
    "hidden_act": "silu", "hidden_size": 7168, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 1024,
    "initializer_range": 0.02, "max_position_embeddings": 1048576, "model_type": "deepseek_v4",
    "moe_intermediate_size": 3072, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 6, "num_hidden_layers": 61, "num_hash_layers": 3,
    "num_key_value_heads": 1, "num_nextn_predict_layers": 1, "o_groups": 16, "o_lora_rank": 1024, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                                    "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                                            "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128,
    "swiglu_limit": 10.0, "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1", "use_cache": True, "vocab_size": 129280, "compress_rope_theta": 160000,
    "compress_ratios": [128, 128] + [4, 128] * 29 + [4, 0]}

ONE_M = 1_048_576
FP8 = kv_dtype("fp8_ds_mla")  # the V4 specs carry their own layout; the dtype only names it


def capacity(config: dict, version: str = "0.32.0", **settings):
    base = dict(max_model_len=ONE_M, kv_cache_memory_bytes=50 * GiB, max_num_batched_tokens=8192)
    return compute_capacity(parse_architecture(config), find_device("H200"), Settings(**{**base, **settings}),
                            rules_for(version), load_overhead())


def test_each_cache_has_vllms_page():
    """Blocks of 256 for the compressed caches, 64 for the window, 4 / 8 for the compressor states."""
    assert CompressedMLA(tokens_per_state=4).page_bytes(256, FP8) == 37_440  # 64 x 584 = 37,376 -> 65 x 576
    assert CompressedMLA(tokens_per_state=128).page_bytes(256, FP8) == 1_728  # 2 x 584 = 1,168 -> 3 x 576
    assert CompressedIndexer(tokens_per_state=4, head_size=132, state_bytes=132).page_bytes(256, FP8) == 8_640
    assert SlidingMLA(window=128).page_bytes(64, FP8) == 37_440  # 64 x 584
    # compressor states: float32 rows of 2 x coff x dim; coff 2 for ratio 4 (window 8), 1 for 128 (window 128)
    assert CompressorState(window=8, own_block_size=4, head_size=2048, token_bytes=8192).page_bytes(4, FP8) == 32_832
    assert CompressorState(window=8, own_block_size=4, head_size=512, token_bytes=2048).page_bytes(4, FP8) == 8_640
    assert CompressorState(window=128, own_block_size=8, head_size=1024, token_bytes=4096).page_bytes(8, FP8) == 32_832


def test_flash_layers_hold_the_caches_its_compress_ratios_name():
    arch = parse_architecture(FLASH_BASE)
    kinds = [type(s).__name__ for s in arch.layers]
    # 2 window-only layers, 21 of ratio 4 (indexer, its compressor, window, cache, compressor), 20 of 128 (window,
    # cache, compressor): 2 + 21 x 5 + 20 x 3 = 167 caches.
    assert len(arch.layers) == 167
    assert kinds.count("SlidingMLA") == 43 and kinds.count("CompressedIndexer") == 21
    assert kinds.count("CompressorState") == 21 * 2 + 20 and kinds.count("CompressedMLA") == 41


def test_flash_packs_five_groups_and_prints_what_vllm_prints():
    """Buckets: the windows (43 x 37,440 B, blocks of 64), the compressed caches (21 x 37,440 + 21 x 8,640 +
    20 x 1,728 B, blocks of 256: unbalanced, whole), the ratio-4 states (21 x 32,832 + 21 x 8,640, blocks of 4:
    balanced, two page sizes, so at least 21 repeats a group), the ratio-128 states (20 x 32,832, blocks of 8).
    _approximate_gcd([43, 21, 20], lower bound 21) = 22 (padding 1 + 1 + 2), so the windows split into 22 and 21.
    A block id holds the widest group: 21 x 37,440 + 21 x 8,640 + 20 x 1,728 = 1,002,240 B.
    50 GiB = 53,687,091,200 B // 1,002,240 = 53,567 blocks. One 1M request with 2 x 8,192 tokens in flight (async):
    cdiv(1,048,576, 256) = 4,096; windows 2 x (cdiv(127 + 16,384, 64) + 1) = 2 x 259; ratio-4 states
    cdiv(7 + 16,384, 4) + 1 = 4,099; ratio-128 states cdiv(127 + 16,384, 8) + 1 = 2,065: 10,778 blocks.
    53,567 / 10,778 = 4.97x, and int(4.9700... x 1,048,576) = 5,211,455 tokens."""
    cap = capacity(FLASH_BASE)
    layout = cap.layout
    assert [(g.num_layers, g.block_size) for g in layout.groups] == [(22, 64), (21, 64), (62, 256), (42, 4), (20, 8)]
    assert layout.block_bytes == 21 * 37_440 + 21 * 8_640 + 20 * 1_728 == 1_002_240
    assert cap.num_blocks == 50 * GiB // 1_002_240 == 53_567
    assert cap.blocks_per_request(ONE_M) == 4_096 + 2 * 259 + 4_099 + 2_065
    assert round(cap.max_concurrency_reported, 2) == 4.97
    assert cap.kv_cache_tokens_reported == int(53_567 / 10_778 * ONE_M) == 5_211_455
    # the max_model_len check: bytes per block x the blocks one request takes (v1/core/kv_cache_utils.py@0.32.0)
    assert cap.needed_for_max_model_len() == 1_002_240 * 10_778
    assert cap.cache_config_block_size == 4  # EngineCore keeps the smallest group block


def test_without_async_scheduling_the_windows_and_states_hold_fewer_blocks():
    """One batch of 8,192 in flight: 4,096 + 2 x 131 + 2,051 + 1,041 = 7,450 blocks; 53,567 / 7,450 = 7.19x."""
    cap = capacity(FLASH_BASE, async_scheduling=False)
    assert cap.blocks_per_request(ONE_M) == 7_450
    assert cap.kv_cache_tokens_reported == int(53_567 / 7_450 * ONE_M) == 7_539_472


def test_pro_packs_its_own_groups():
    """Pro: 61 windows, 30 layers of ratio 4 and 31 of 128 (its first two are 128). The ratio-4 states (30 x 2)
    set at least 30 repeats; _approximate_gcd([61, 30, 31], 30) = 31 (padding 1 + 1 + 0): windows in 31 and 30.
    Widest group: 30 x 37,440 + 30 x 8,640 + 31 x 1,728 = 1,435,968 B; 53,687,091,200 // 1,435,968 = 37,387 blocks,
    37,387 / 10,778 = 3.47x, 3,637,327 tokens."""
    cap = capacity(PRO)
    assert sorted((g.num_layers, g.block_size) for g in cap.layout.groups) == [
        (30, 64), (31, 8), (31, 64), (60, 4), (91, 256)]
    assert cap.layout.block_bytes == 1_435_968
    assert cap.num_blocks == 37_387
    assert cap.kv_cache_tokens_reported == int(37_387 / 10_778 * ONE_M) == 3_637_327


def test_weights_follow_the_checkpoint_fp8_with_mxfp4_experts():
    """Pro's config is fp8 with expert_dtype fp4: DeepseekV4FP8Config loads the routed experts as MXFP4
    (models/deepseek_v4/quant_config.py@0.32.0). Flash-Base (no quantization_config) counts 284B parameters
    as published: 43 x 256 routed experts of 3 x 4,096 x 2,048 = 276.97B, and the rest."""
    flash = parse_architecture(FLASH_BASE)
    assert flash.params.experts == 43 * 256 * 3 * 4096 * 2048
    assert 283e9 < flash.params.total < 286e9
    pro = parse_architecture(PRO)
    assert dict(pro.quantization.role_bytes)["experts"] == pytest.approx(0.5 + 1 / 32)
    assert 1.55e12 < pro.params.total < 1.62e12


def test_mtp_adds_a_window_only():
    """The MTP layer compresses nothing (compress ratio 1): a 44th window; the windows split 22 / 22 and the
    block stays 1,002,240 B."""
    cap = capacity(FLASH_BASE, speculative=parse_speculative_config({"method": "mtp", "num_speculative_tokens": 1}))
    assert [(g.num_layers, g.block_size) for g in cap.layout.groups][:2] == [(22, 64), (22, 64)]
    assert cap.layout.block_bytes == 1_002_240


@pytest.mark.parametrize("settings, version, said", [
    ({}, "0.28.0", "0.29"),  # 0.20-0.28 grouped and counted it by other code
    ({}, "0.29.0", "--kv-cache-dtype fp8"),  # "auto" is refused before 0.30
    ({"kv_cache_dtype": "bfloat16"}, "0.32.0", "FlashInfer DSV4"),
    ({"block_size": 64}, "0.32.0", "blocks of 256"),
])
def test_what_kvplan_does_not_model_is_refused_with_the_reason(settings, version, said):
    with pytest.raises(KvplanError, match=said):
        capacity(FLASH_BASE, version=version, **settings)
    assert capacity(FLASH_BASE, version="0.29.0", kv_cache_dtype="fp8").num_blocks == 53_567


@pytest.mark.parametrize("change, said", [
    ({"compress_ratios": None}, "compress_ratios"),
    ({"compress_ratios": [4] * 10}, "compress_ratios"),
    ({"compress_ratios": [0, 0] + [4, 64] * 20 + [4, 0]}, "compress_ratios\\[3\\]"),
    ({"head_dim": 256}, "head_dim 256"),
    ({"sliding_window": -1}, "sliding_window"),
])
def test_a_broken_config_is_one_line_and_exit_2(tmp_path, change, said):
    (tmp_path / "config.json").write_text(json.dumps({**FLASH_BASE, **change}))
    result = CliRunner().invoke(app, ["size", str(tmp_path), "--gpu", "8xH200", "--ctx", "128k"])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") <= 3
    assert __import__("re").search(said, result.output), result.output


def test_size_plans_a_local_pro_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PRO))
    result = CliRunner().invoke(app, ["size", str(tmp_path), "--gpu", "8xB200", "--ctx", "1m", "--kv-memory", "50GiB",
                                      "--max-num-batched-tokens", "8192", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert (plan["kv_cache_dtype"], plan["num_blocks"], plan["kv_cache_tokens"]) == ("fp8_ds_mla", 37_387, 3_637_327)
    assert len(plan["kv_groups"]) == 5
