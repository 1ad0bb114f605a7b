"""Differential tests: kvplan's KV layout against vLLM's own allocator, on tiny twins.

Every bundled profile whose architecture the installed vLLM (the CPU build in CI) can
construct gets a tiny twin (kvplan.vllm.twin: every KV-shaping config field kept, the rest
shrunk) that vLLM builds with dummy weights and no forward pass (kvplan.vllm.probe). The
expected numbers are the engine's own: the block size it settled on, the blocks it
allocated, the "KV cache size: N tokens" and "Maximum concurrency" it computed, its
per-layer specs, and (through vLLM's own capacity function) the same with async scheduling
on, which is the GPU default. kvplan plans the *real* config for the CPU platform with the
same settings, at the installed release's rules. Profiles whose twin is identical (same KV
fields) share one engine run. A twin the engine cannot build fails with the engine's error,
unless it is listed in ENGINE_CANNOT_BUILD with the reason, which the test then checks (or in
ENGINE_NEEDS_CPU_FLAG, on a host without that CPU feature).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from functools import cache

import pytest

from kvplan.deploy import load_draft
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device
from kvplan.model.arch import parse_architecture
from kvplan.model.layers import (
    MLA,
    ChunkedLocal,
    CompressedMLA,
    FullAttention,
    MambaState,
    MLAIndexer,
    SlidingMLA,
    SlidingWindow,
)
from kvplan.model.source import load_bundled
from kvplan.paths import PROFILES_DIR
from kvplan.plan.capacity import compute_capacity, with_state_dtype, with_tp
from kvplan.plan.offload import offload_tier_for
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.plan.speculative import draft_model, parse_speculative_config
from kvplan.units import GiB, MiB
from kvplan.vllm.platforms import cpu_flags, host_cpu_platform
from kvplan.vllm.rules import rules_for

pytestmark = pytest.mark.engine

# Settings variants: the engine's defaults, and for families where they matter, a large block
# size and prefix caching off (no Mamba "align" mode). An fp8 cache is not among them: the CPU
# build needs AVX-512 or AMX for it ("FP8 KV cache on CPU requires x86 with AVX-512 or AMX"),
# which these machines lack; kvplan's fp8 page sizes are covered by hand-computed unit tests.
DEFAULT = {}
VARIANTS = {
    "block256": {"block_size": 256},
    "no-prefix-caching": {"enable_prefix_caching": False},
    # Speculative decoding, vLLM's JSON as given (kvplan.plan.speculative): MTP drafts with the checkpoint's
    # own MTP module; ngram drafts without KV layers but widens the recurrent state.
    "mtp2": {"extra_engine_args": {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}},
    "ngram3": {"extra_engine_args": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}},
    # Drafters with configs of their own (DRAFTS, written beside the twin; "draft:NAME" becomes its folder):
    # their layers' shapes differ from the target's, so vLLM keeps one group of unequal pages.
    "eagle3": {"extra_engine_args": {"speculative_config": {"method": "eagle3", "model": "draft:eagle3-head",
                                                            "num_speculative_tokens": 2}}},
    "draft-model": {"extra_engine_args": {"speculative_config": {"method": "draft_model", "model": "draft:small-llama",
                                                                 "num_speculative_tokens": 3}}},
}
EXTRA_VARIANTS = {  # profile -> variants beyond the default
    "meta-llama/Llama-3.1-8B": ["block256"],
    "google/gemma-3-12b-it": ["block256", "no-prefix-caching"],
    "openai/gpt-oss-20b": ["block256"],
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": ["block256"],
    "nvidia/Nemotron-H-56B-Base-8K": ["block256", "no-prefix-caching"],
    "Qwen/Qwen3-Next-80B-A3B-Thinking": ["block256", "no-prefix-caching"],
    "ai21labs/Jamba-v0.1": ["no-prefix-caching"],
    "deepseek-ai/DeepSeek-V3": ["block256", "mtp2"],
    "google/gemma-4-26B-A4B": ["block256", "no-prefix-caching"],
    "google/gemma-4-E2B-it": ["block256"],
    "Qwen/Qwen3.5-35B-A3B": ["block256", "no-prefix-caching"],
    "zai-org/GLM-5.2": ["no-prefix-caching"],
    "tiiuae/Falcon-H1-34B-Instruct": ["no-prefix-caching", "block256"],
    "ibm-granite/granite-4.0-h-350m": ["no-prefix-caching", "ngram3"],
    "Qwen/Qwen3.5-9B": ["mtp2"],
    "synthetic/falcon-h1": ["no-prefix-caching", "block256"],
    "synthetic/granite-4.0-h": ["no-prefix-caching"],
    "synthetic/exaone4.0-32b-shape": ["block256"],
    "synthetic/laguna": ["no-prefix-caching"],
    "synthetic/mimo-v2-flash": ["no-prefix-caching", "block256"],
    "synthetic/nemotron-3.5-blocks": ["no-prefix-caching"],
    "synthetic/llama-drafted": ["eagle3", "draft-model"],
}

# Architectures the CI's vLLM CPU build cannot construct, with the engine error that says why.
ENGINE_CANNOT_BUILD: dict[str, str | tuple[str, ...]] = {  # the engine's error (one per host kind)
    # vllm/model_executor/models/registry.py@0.32.0: the Falcon (RW) class was removed.
    "tiiuae/falcon-7b": "RWForCausalLM was supported in vLLM until v0.28.0",
    # The CPU build has no MoE kernel for Nemotron-H's non-gated (squared-ReLU) experts.
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "No Unquantized MoE backend supports the deployment configuration",
    # The bundled config (THUDM's) predates the fields vLLM 0.32's ChatGLM code reads.
    "THUDM/glm-4-9b-chat": "object has no attribute 'original_rope'",
    # The CPU platform turns prefix caching off for MLA models, then refuses the mamba block size
    # the hybrid config set (vllm/platforms/cpu.py@0.32.0); with prefix caching off the KDA layer
    # imports CUTLASS, which the CPU build lacks. kvplan's KDA and MLA shapes are checked by hand in
    # tests/model/test_arch.py (test_kimi_linear_kda_state_and_mla_layers).
    # On an x86 host with AMX tiles MLA keeps prefix caching (AMX MLA), and the KDA layer's CUTLASS import fails.
    "synthetic/kimi-linear": ("--mamba-block-size can only be set with --enable-prefix-caching",
                              "No module named 'cutlass'"),
    # The same for the real config (checked against vLLM 0.32.0's CPU build); its KDA, MLA and
    # weights are checked by hand in tests/model/test_bundled_kimi_linear_gemma4.py.
    "moonshotai/Kimi-Linear-48B-A3B-Instruct": ("--mamba-block-size can only be set with --enable-prefix-caching",
                                                "No module named 'cutlass'"),
    # As the Nemotron 3 Nano profile: no CPU kernel for the non-gated experts of its "moe" blocks. The same
    # block list with "mlp" blocks builds (synthetic/nemotron-3.5-blocks); kvplan's "moe" blocks are checked
    # by hand in tests/model/test_added_families.py.
    "synthetic/nemotron-3.5-moe": "No Unquantized MoE backend supports the deployment configuration",
}
# Twins the engine builds only on hosts with a CPU feature: profile -> (the /proc/cpuinfo flag, the engine's
# error without it). Where the flag is missing the test checks that error; where present, the layout.
ENGINE_NEEDS_CPU_FLAG: dict[str, tuple[str, str]] = {
    # vllm/models/deepseek_v4/cpu/cpu_sparse.py@0.32.0 packs weights with torch.ops._C.convert_weight_packed,
    # compiled into vllm._C only, which vllm/platforms/cpu.py@0.32.0 (import_kernels) loads on avx512_bf16
    # hosts; the _C_AVX512 and _C_AVX2 builds loaded elsewhere lack it. The layout is checked by hand in
    # tests/model/test_deepseek_v4.py on every host.
    "synthetic/deepseek-v4": ("avx512_bf16", "convert_weight_packed"),
}

MAX_MODEL_LEN = 4096

# Small configs of a family's shape, written here, that check kvplan's rules against the engine where
# no bundled profile covers that shape: Granite 4.0-H with routed experts (the bundled 350m has none), a
# small Falcon-H1 (beside the bundled 34B), Qwen VL and Kimi-Linear shapes; EXAONE 4.0 (no complete
# published config.json was found: the 32B's shape, its "LLLG" sliding_window_pattern beside layer_types,
# and the 1.2B's all-global layers with a null window) and a Nemotron 3.5-style layers_block_type list
# (no published config was found; "mlp" blocks here, as the CPU build has no kernel for Nemotron-H's
# non-gated MoE: kvplan's "moe" blocks are checked by hand in tests/model/test_added_families.py).
_EXAONE4 = {
    "architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "hidden_size": 256, "intermediate_size": 256,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 512,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 1000000, "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "max_position_embeddings": 8192,
          "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
# Drafters' own configs (the "eagle3" and "draft-model" variants): an EAGLE-3 head (one decoder layer, as
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config has, with twice the target's KV heads here so its pages differ)
# and a small draft model of another shape (two layers, 1 KV head of 128).
DRAFTS: dict[str, dict] = {
    "eagle3-head": {**_LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 256, "intermediate_size": 512,
                    "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
                    "draft_vocab_size": 256},
    "small-llama": {**_LLAMA, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128},
}
# DeepSeek-V4-Flash's cache shapes (head_dim 512, RoPE 64, a 128-token window, indexer keys of 128, its
# compress_ratios pattern: SWA-only, then 4 / 128 alternating), small elsewhere; the published config
# (https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash-Base, as copied verbatim in tests/model/test_deepseek_v4.py).
_DSV4_FLASH_SHAPE = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 256, "head_dim": 512,
    "qk_rope_head_dim": 64, "num_attention_heads": 16, "num_key_value_heads": 1, "q_lora_rank": 64, "o_groups": 2,
    "o_lora_rank": 64, "index_head_dim": 128, "index_n_heads": 8, "index_topk": 64, "sliding_window": 128,
    "num_hidden_layers": 6, "compress_ratios": [0, 4, 128, 4, 128, 4, 0], "num_nextn_predict_layers": 1,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 64,
    "num_hash_layers": 1, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "swiglu_limit": 10.0,
    "compress_rope_theta": 160000, "rope_theta": 10000, "rms_norm_eps": 1e-06, "hidden_act": "silu",
    "vocab_size": 512, "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
SYNTHETIC: dict[str, dict] = {
    "synthetic/deepseek-v4": _DSV4_FLASH_SHAPE,
    "synthetic/llama-drafted": {**_LLAMA, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
                                "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32},
    "synthetic/exaone4.0-32b-shape": {
        **_EXAONE4, "num_hidden_layers": 8, "sliding_window": 1024, "sliding_window_pattern": "LLLG",
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
        "tie_word_embeddings": False},
    "synthetic/exaone4.0-1.2b-shape": {
        **_EXAONE4, "num_hidden_layers": 4, "sliding_window": None, "sliding_window_pattern": None,
        "layer_types": ["full_attention"] * 4, "tie_word_embeddings": True},
    "synthetic/nemotron-3.5-blocks": {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 256,
        "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "layers_block_type": ["mamba", "mlp", "attention", "mlp", "linear_attention", "mlp"],
        "mamba_num_heads": 16, "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 64, "conv_kernel": 4,
        "expand": 2, "chunk_size": 128, "intermediate_size": 256, "mlp_hidden_act": "relu2",
        "mamba_ssm_cache_dtype": "float32", "vocab_size": 512, "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    "synthetic/nemotron-3.5-moe": {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 256,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "layers_block_type": ["mamba", "moe", "attention", "moe"], "mamba_num_heads": 16, "mamba_head_dim": 32,
        "n_groups": 2, "ssm_state_size": 64, "conv_kernel": 4, "expand": 2, "chunk_size": 128,
        "intermediate_size": 256, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "moe_shared_expert_intermediate_size": 64, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 1.0, "mlp_hidden_act": "relu2",
        "mamba_ssm_cache_dtype": "float32", "vocab_size": 512, "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    "synthetic/falcon-h1": {
        "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "hidden_size": 256,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "mamba_d_ssm": 512, "mamba_n_heads": 16, "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 64,
        "mamba_d_conv": 4, "mamba_expand": 2, "intermediate_size": 256, "vocab_size": 512,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    "synthetic/granite-4.0-h": {
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 256,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "layer_types": ["mamba", "mamba", "attention", "mamba"], "mamba_n_heads": 16, "mamba_d_head": 32,
        "mamba_n_groups": 1, "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "num_local_experts": 4,
        "num_experts_per_tok": 2, "intermediate_size": 128, "shared_intermediate_size": 128, "vocab_size": 512,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "position_embedding_type": "nope"},
    "synthetic/qwen2.5-vl": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "vocab_size": 512, "max_position_embeddings": 8192, "rope_theta": 1000000.0, "sliding_window": 4096,
        "use_sliding_window": False, "max_window_layers": 4, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        "vision_start_token_id": 500, "vision_end_token_id": 501, "image_token_id": 502, "video_token_id": 503,
        "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "in_chans": 3,
                          "out_hidden_size": 256, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                          "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1],
                          "tokens_per_second": 2, "hidden_act": "silu"}},
    "synthetic/qwen3-vl": {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "tie_word_embeddings": False,
        "image_token_id": 502, "video_token_id": 503, "vision_start_token_id": 500, "vision_end_token_id": 501,
        "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 256, "intermediate_size": 512,
                        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                        "vocab_size": 512, "max_position_embeddings": 8192, "rope_theta": 5000000.0,
                        "rope_scaling": {"rope_type": "default", "mrope_section": [8, 12, 12], "mrope_interleaved": True},
                        "tie_word_embeddings": False, "dtype": "bfloat16"},
        "vision_config": {"model_type": "qwen3_vl", "depth": 2, "hidden_size": 64, "intermediate_size": 128,
                          "num_heads": 2, "in_channels": 3, "out_hidden_size": 256, "patch_size": 16,
                          "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
                          "deepstack_visual_indexes": [1], "hidden_act": "gelu_pytorch_tanh"}},
    # Laguna (poolside Laguna-XS.2's layout: one global layer in four, the sliding ones with more query heads,
    # per-head output gates, a dense first layer then experts); no published config.json was found in the
    # stored sources, so the shapes are small ones written here after transformers' LagunaConfig.
    "synthetic/laguna": {
        "architectures": ["LagunaForCausalLM"], "model_type": "laguna", "hidden_size": 256, "intermediate_size": 256,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "num_attention_heads_per_layer": [4 if i % 4 == 0 else 8 for i in range(8)], "sliding_window": 512,
        "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(8)],
        "mlp_layer_types": ["dense"] + ["sparse"] * 7, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "gating": True,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        "vocab_size": 512, "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    # MiMo-V2-Flash's layout, in the checkpoint's own fields (the ones vLLM's mimo_v2.py reads): global layers with
    # fewer KV heads than the sliding ones (so their pages differ: vLLM doubles the global block), K heads of 192 and
    # V heads of 128, MoE layers by moe_layer_freq; small shapes written here (the bundled profile,
    # profiles/models/XiaomiMiMo--MiMo-V2-Flash.json, is a field subset of the published config, from aiconfigurator).
    "synthetic/mimo-v2-flash": {
        "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "hidden_size": 256,
        "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 192, "v_head_dim": 128,
        "swa_num_attention_heads": 8, "swa_num_key_value_heads": 4, "swa_head_dim": 192, "swa_v_head_dim": 128,
        "sliding_window_size": 128, "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0], "moe_layer_freq": [0, 1, 1, 1, 1, 1],
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "intermediate_size": 256,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "attention_bias": False, "layernorm_epsilon": 1e-5,
        "rope_theta": 5000000, "swa_rope_theta": 10000, "partial_rotary_factor": 0.334,
        "vocab_size": 512, "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    "synthetic/kimi-linear": {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": 256,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "kv_lora_rank": 128,
        "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64, "q_lora_rank": None, "mla_use_nope": True,
        "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 8, "head_dim": 64,
                               "short_conv_kernel_size": 4},
        "num_experts": 4, "num_experts_per_token": 2, "moe_intermediate_size": 64, "intermediate_size": 128,
        "first_k_dense_replace": 1, "vocab_size": 512, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"},
}


def _profiles() -> list[str]:
    ids = []
    for path in sorted((PROFILES_DIR / "models").glob("*.json")):
        ids.append(json.loads(path.read_text())["id"])
    return ids + list(SYNTHETIC)


@cache
def _twin_config(profile: str) -> str:
    from kvplan.vllm.twin import make_twin

    config = SYNTHETIC.get(profile) or load_bundled(profile).config
    if profile in SYNTHETIC and "vision_config" not in config:
        return json.dumps(config, sort_keys=True)  # already tiny
    # A vision-language config becomes its text-only model, as the bundled ones do (make_twin).
    twin = make_twin(config)
    twin.pop("_kvplan_twin_notes", None)
    return json.dumps(twin, sort_keys=True)


@cache
def _settings_json(profile: str, variant: str) -> str:
    return json.dumps(_settings(profile, variant), sort_keys=True)


def _settings(profile: str, variant: str) -> dict:
    """Engine settings for one case: enough KV memory for a few max-length requests (an odd
    byte count, so the engine's floor division is exercised), at most 1.5 GiB."""
    arch = parse_architecture(_config(profile))
    limit = min(MAX_MODEL_LEN, arch.max_model_len_limit or MAX_MODEL_LEN)
    settings = {"max_model_len": limit, **(VARIANTS.get(variant) or DEFAULT)}
    # kvplan's own estimate of one max-length request only picks the pool's size (the expected
    # numbers are the engine's): room for about three, at least 64 MiB, at most 4 GiB.
    try:
        one = _plan(profile, {**settings, "kv_cache_memory_bytes": GiB}).needed_for_max_model_len()
    except Exception:  # noqa: BLE001 - a planner error shows in the test itself
        one = limit * 1024
    memory = int(min(max(3 * one, 64 * MiB), 4 * GiB)) + 12_345
    # The native CPU tier vLLM's own offloading spec would give (the probe sizes it beside the engine; an odd
    # size, so the floor division is exercised): no engine of its own.
    return {**settings, "kv_cache_memory_bytes": memory, "kv_offloading_size": 1.37}


def _cases() -> list[tuple[str, str]]:
    out = []
    for profile in _profiles():
        out.append((profile, "default"))
        out += [(profile, v) for v in EXTRA_VARIANTS.get(profile, [])]
    return out


def _engine_key(profile: str, variant: str) -> str:
    digest = hashlib.sha256(_twin_config(profile).encode()).hexdigest()[:12]
    return f"{digest}/{variant}/{_settings_json(profile, variant)}"


CASES = _cases()


def probe_cases(selected: set[tuple[str, str]], folder) -> list[dict]:
    """One probe case for every distinct (twin, settings) pair the session selected (all of them in CI;
    only the chosen ones for `pytest -k` or a test id, so one twin does not build them all), its twin
    folder written under ``folder``. Called by tests/twins/conftest.py when collection ends."""
    from kvplan.vllm.twin import write_twin

    cases, seen = [], set()
    for profile, variant in (c for c in CASES if c in selected):
        key = _engine_key(profile, variant)
        if key in seen:
            continue
        seen.add(key)
        twin_dir = folder / hashlib.sha256(key.encode()).hexdigest()[:16]
        if not twin_dir.exists():
            write_twin(json.loads(_twin_config(profile)), twin_dir, shrink=False)
        settings = json.loads(_settings_json(profile, variant))
        spec = (settings.get("extra_engine_args") or {}).get("speculative_config") or {}
        if str(spec.get("model", "")).startswith("draft:"):
            name = spec["model"].removeprefix("draft:")
            spec["model"] = str(folder / f"draft-{name}")
            if not (folder / f"draft-{name}").exists():
                write_twin(DRAFTS[name], folder / f"draft-{name}", shrink=False)
        cases.append({"name": key, "twin": str(twin_dir), "settings": settings})
    return cases


@pytest.fixture(scope="session")
def engine_results(request) -> dict:
    """The engine's answers for the session's cases, from the probe started when collection ended."""
    from helpers.twins import PROBE_RUN

    return request.config.stash[PROBE_RUN].results()


CPU_DEVICE = Device(name="CPU (vLLM CPU build)", memory_bytes=24 * GiB, cuda_total_bytes=24 * GiB,
                    cuda_total_measured=True, vendor="cpu")


def _config(profile: str) -> dict:
    """The profile's config as the twin sees it: a twin loads dummy weights, so it carries no
    quantization_config (and no checkpoint KV scheme for "auto" to follow)."""
    if profile in SYNTHETIC:
        return json.loads(json.dumps(SYNTHETIC[profile]))
    config = json.loads(json.dumps(load_bundled(profile).config))
    config.pop("quantization_config", None)
    if isinstance(config.get("text_config"), dict):
        config["text_config"].pop("quantization_config", None)
    return config


def _plan(profile: str, engine_settings: dict, async_scheduling: bool = False, version: str = "0.32.0"):
    arch = parse_architecture(_config(profile))
    settings = Settings(
        max_model_len=engine_settings["max_model_len"],
        kv_cache_memory_bytes=engine_settings["kv_cache_memory_bytes"],
        block_size=engine_settings.get("block_size"),
        enable_prefix_caching=engine_settings.get("enable_prefix_caching"),
        kv_cache_dtype=engine_settings.get("kv_cache_dtype") or "auto",
        usage_context="llm",  # the probe builds vLLM's offline LLM class
        speculative=_speculative(engine_settings),
    )
    platform = host_cpu_platform()  # this host: the CPU build the probe runs (its SSM dtype rule)
    if any(isinstance(s, MLAIndexer) for s in arch.layers) and platform.mla_block_size:
        # vLLM's CPU platform refuses sparse MLA; the probe lets FlashMLASparse build the model and
        # its kernels take multiples of 64 only, so the probe raises the reference MLA kernel's 16 to 64
        # (kvplan.vllm.probe). An AMX host keeps the CPU default of 128, a multiple of 64 already.
        platform = replace(platform, mla_block_size=64)
    if async_scheduling:  # what vLLM's capacity function gives with async scheduling on
        platform = replace(platform, async_scheduling=True)
    device = replace(CPU_DEVICE, platform_rules=platform)
    return compute_capacity(arch, device, settings, rules_for(version), load_overhead())


def _speculative(engine_settings: dict):
    """The case's speculative config as kvplan reads it: a drafter's folder through kvplan's own loader (as
    `kvplan size` reads it), a "draft:NAME" placeholder (before the folder is written) from DRAFTS."""
    given = (engine_settings.get("extra_engine_args") or {}).get("speculative_config")
    if not given:
        return None
    spec = parse_speculative_config(given)
    if spec.model and spec.model.startswith("draft:"):
        name = spec.model.removeprefix("draft:")
        return replace(spec, draft=draft_model(name, DRAFTS[name], "synthetic", spec.method))
    spec = load_draft(spec)
    assert spec is None or not spec.reads_draft_config or spec.draft is not None, spec.draft_unread
    return spec


def _engine_layer_shapes(result: dict) -> list[tuple]:
    """The engine's per-layer specs, as comparable tuples (kind, shape...)."""
    shapes = []
    for spec in result["layer_specs"].values():
        specs = list(spec["kv_cache_specs"].values()) if spec["class"] == "UniformTypeKVCacheSpecs" else [spec]
        for s in specs:
            cls = s["class"]
            if cls == "MambaSpec":
                shapes.append(("state", s.get("real_page_size_bytes") or s["page_size_bytes"]))
            elif cls == "SlidingWindowMLASpec":  # DeepSeek-V4's window and compressor states (blocks of their own)
                shapes.append(("window", s["block_size"], s["sliding_window"], s["head_size"]))
            elif (s.get("tokens_per_state") or 1) > 1:  # DeepSeek-V4's compressed caches and indexer keys
                shapes.append(("compressed", s["tokens_per_state"], s["head_size"]))
            elif "MLA" in cls or "Indexer" in cls:  # uint8 indexer keys: head_size is its bytes
                shapes.append(("mla", s["head_size"] * (s.get("num_kv_heads") or 1)))
            elif cls == "SlidingWindowSpec":
                shapes.append(("sliding", s["num_kv_heads"], s["head_size"], s["sliding_window"]))
            elif cls == "ChunkedLocalAttentionSpec":
                shapes.append(("chunked", s["num_kv_heads"], s["head_size"], s["attention_chunk_size"]))
            else:
                shapes.append(("full", s["num_kv_heads"], s["head_size"]))
    return sorted(shapes, key=repr)


def _kvplan_layer_shapes(cap) -> list[tuple]:
    shapes = []
    specs = with_state_dtype(with_tp(list(cap.arch.layers), 1), cap.rules, cap.mamba_ssm_cache_dtype)
    for s in specs:
        if isinstance(s, MambaState):
            shapes.append(("state", s.state_bytes()))
        elif isinstance(s, SlidingMLA):
            shapes.append(("window", s.own_block_size, s.window, s.head_size))
        elif isinstance(s, CompressedMLA):
            shapes.append(("compressed", s.tokens_per_state, s.head_size))
        elif isinstance(s, MLAIndexer):
            shapes.append(("mla", int(s.bytes_per_token(cap.dtype))))  # 128 fp8 keys + 4 B of scale
        elif isinstance(s, MLA):
            shapes.append(("mla", s.latent_size))
        elif isinstance(s, SlidingWindow):
            shapes.append(("sliding", s.num_kv_heads, s.head_size, s.window))
        elif isinstance(s, ChunkedLocal):
            shapes.append(("chunked", s.num_kv_heads, s.head_size, s.chunk))
        elif isinstance(s, FullAttention):
            shapes.append(("full", s.num_kv_heads, s.head_size))
    return sorted(shapes, key=repr)


@pytest.mark.parametrize("profile, variant", CASES, ids=[f"{p}-{v}" for p, v in CASES])
def test_layout_matches_vllm(profile, variant, engine_results):
    result = engine_results[_engine_key(profile, variant)]
    if profile in ENGINE_CANNOT_BUILD:
        assert not result["ok"], f"{profile} builds now: remove it from ENGINE_CANNOT_BUILD"
        reasons = ENGINE_CANNOT_BUILD[profile]
        reasons = (reasons,) if isinstance(reasons, str) else reasons
        assert any(reason in json.dumps(result["error"]) for reason in reasons), result["error"]
        return
    flag, reason = ENGINE_NEEDS_CPU_FLAG.get(profile, (None, None))
    if flag is not None and flag not in cpu_flags():
        assert not result["ok"], f"{profile} builds without {flag} now: remove it from ENGINE_NEEDS_CPU_FLAG"
        assert reason in json.dumps(result["error"]), result["error"]
        return
    assert result["ok"], f"vLLM {result['vllm_version']} could not build the twin: {result.get('error')}"
    version = result["vllm_version"].split("+")[0]
    cap = _plan(profile, result["settings"], version=version)
    engine = result["capacity"]
    assert _kvplan_layer_shapes(cap) == _engine_layer_shapes(result)
    assert cap.cache_config_block_size == result["cache_config"]["block_size"]
    assert cap.num_blocks == result["kv_cache_config"]["num_blocks"]
    assert cap.kv_cache_tokens_reported == engine["kv_cache_size_tokens"]
    assert cap.max_concurrency_reported == pytest.approx(engine["max_concurrency"], rel=1e-12)
    async_engine = result.get("capacity_async") or {}
    assert "max_concurrency" in async_engine, f"the probe recomputed no async capacity: {async_engine}"
    async_cap = _plan(profile, result["settings"], async_scheduling=True, version=version)
    assert async_cap.kv_cache_tokens_reported == async_engine["kv_cache_size_tokens"]
    assert async_cap.max_concurrency_reported == pytest.approx(async_engine["max_concurrency"], rel=1e-12)
    offload = result.get("offload") or {}
    if "divisible by tokens_per_hash" in json.dumps(offload.get("error")):  # vLLM refuses the tier: so must kvplan
        with pytest.raises(KvplanError, match="refuses the CPU offload tier"):
            offload_tier_for(cap, result["settings"]["kv_offloading_size"])
        return
    assert "num_chunks" in offload, f"the probe sized no CPU offload tier: {offload}"
    tier = offload_tier_for(cap, result["settings"]["kv_offloading_size"])
    assert (tier.num_chunks, tier.chunk_bytes, tier.blocks_per_chunk, tier.groups) == (
        offload["num_chunks"], offload["kv_bytes_per_chunk"], offload["blocks_per_chunk"], len(offload["group_ids"]))
    assert tier.tokens_per_chunk == min(offload["tokens_per_block"]) * offload["blocks_per_chunk"]



def test_text_config_defaults_are_transformers_own():
    """kvplan fills a LLaVA text_config's missing fields from TEXT_CONFIG_DEFAULTS (and the twins write
    them out): they must be the installed transformers' config class defaults, which vLLM reads."""
    from transformers import CONFIG_MAPPING

    from kvplan.model.families import TEXT_CONFIG_DEFAULTS, WRAPPER_TEXT_MODEL_TYPE

    for model_type, defaults in TEXT_CONFIG_DEFAULTS.items():
        built = CONFIG_MAPPING[model_type]()
        assert {k: getattr(built, k) for k in defaults} == defaults, model_type
        # head_dim and num_key_value_heads left out: hidden / heads and (for Llama) the head count
        assert built.head_dim == built.hidden_size // built.num_attention_heads, model_type
        if "num_key_value_heads" not in defaults:
            assert built.num_key_value_heads == built.num_attention_heads, model_type
    for wrapper, text_type in WRAPPER_TEXT_MODEL_TYPE.items():
        assert CONFIG_MAPPING[wrapper](text_config={}).text_config.model_type == text_type, wrapper
        assert CONFIG_MAPPING[wrapper]().text_config.model_type == text_type, wrapper
