"""Config -> layer specs, checked against hand arithmetic from the configs' own fields."""

import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.model.arch import parse_architecture
from kvplan.model.dtypes import kv_dtype
from kvplan.model.layers import MLA, ChunkedLocal, FullAttention, MambaState, MLAIndexer, SlidingWindow
from kvplan.model.source import load_bundled

BF16 = kv_dtype("bfloat16")
FP8 = kv_dtype("fp8")


def arch_of(name, **overrides):
    cfg = load_bundled(name)
    assert cfg is not None, name
    return parse_architecture(cfg.config, overrides or None)


def kv_bytes(arch, dtype=BF16):
    return sum(s.bytes_per_token(dtype) for s in arch.layers)


@pytest.mark.parametrize(
    "model, expected",
    [
        ("meta-llama/Llama-3.1-8B", 2 * 32 * 8 * 128 * 2),  # 131,072 (seed figure)
        ("meta-llama/Llama-3.1-70B", 2 * 80 * 8 * 128 * 2),  # 327,680
        ("Qwen/Qwen3-8B", 2 * 36 * 8 * 128 * 2),  # 147,456
        ("meta-llama/Llama-2-7b-hf", 2 * 32 * 32 * 128 * 2),  # MHA: 524,288
        ("tiiuae/falcon-7b", 2 * 32 * 1 * (4544 // 71) * 2),  # MQA (multi_query): 8,192
        ("THUDM/glm-4-9b-chat", 2 * 40 * 2 * 128 * 2),  # multi_query_group_num 2, kv_channels 128
        ("deepseek-ai/DeepSeek-V3", 61 * (512 + 64) * 2),  # MLA: 70,272, no factor 2
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", 12 * 2 * 2 * 256 * 2),  # only the 12 full-attention layers
    ],
)
def test_kv_bytes_per_token(model, expected):
    assert kv_bytes(arch_of(model)) == expected


def test_llama_with_32_kv_heads_is_four_times_larger():
    # The seed's MHA contrast: same dims, 32 KV heads -> 2 x 32 x 32 x 128 x 2 = 524,288.
    assert kv_bytes(arch_of("meta-llama/Llama-3.1-8B", num_key_value_heads=32)) == 524_288


def test_mla_fp8_and_fp8_ds_mla():
    arch = arch_of("deepseek-ai/DeepSeek-V3")
    assert kv_bytes(arch, FP8) == 61 * 576 * 1 == 35_136
    assert kv_bytes(arch, kv_dtype("fp8_ds_mla")) == 61 * 656
    assert all(isinstance(s, MLA) and s.per_rank(8) == s for s in arch.layers)  # replicated under TP


def test_deepseek_v32_adds_an_indexer_cache_per_layer():
    arch = arch_of("deepseek-ai/DeepSeek-V3.2")
    indexers = [s for s in arch.layers if isinstance(s, MLAIndexer)]
    assert len(indexers) == 61
    # index_head_dim 128 fp8 values + one fp32 scale per 128 = 132 B/token/layer, any KV dtype.
    assert kv_bytes(arch) == 61 * 576 * 2 + 61 * 132


def test_deepseek_v32_counts_its_indexer_weights():
    """The indexer in each of the 61 layers (layers/attention/nsa/nsa_indexer.py@sglang 0.5.3): wq_b 1,536 x 64 x 128
    = 12,582,912 and wk 7,168 x 128 = 917,504 beside MLA's 187,105,280 (7,168 x 1,536 + 1,536 x 128 x 192 + 7,168 x
    576 + 512 x 128 x 256 + 128 x 128 x 7,168); weights_proj 7,168 x 64 = 458,752 and k_norm 2 x 128, unquantized, in
    "other" beside DeepSeek-V3's norms and routers."""
    v32, v3 = arch_of("deepseek-ai/DeepSeek-V3.2").params, arch_of("deepseek-ai/DeepSeek-V3").params
    assert v3.attention == 61 * 187_105_280
    assert v32.attention == 61 * (187_105_280 + 13_500_416) == 12_236_947_456
    assert v32.other - v3.other == 61 * 459_008


def test_gpt_oss_even_layers_slide():
    arch = arch_of("openai/gpt-oss-120b")
    kinds = [type(s) for s in arch.layers]
    assert kinds[0] is SlidingWindow and kinds[1] is FullAttention
    assert kinds.count(SlidingWindow) == 18 and kinds.count(FullAttention) == 18
    assert {s.window for s in arch.layers if isinstance(s, SlidingWindow)} == {128}
    assert kv_bytes(arch) == 36 * 2 * 8 * 64 * 2  # 73,728


def test_gemma3_pattern_default_is_five_local_to_one_global():
    arch = arch_of("google/gemma-3-27b-it")  # no layer_types: sliding_window_pattern default 6
    full = [i for i, s in enumerate(arch.layers) if type(s) is FullAttention]
    assert full == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert sum(isinstance(s, SlidingWindow) for s in arch.layers) == 52
    assert kv_bytes(arch) == 62 * 2 * 16 * 128 * 2  # 507,904


def test_gemma2_alternates_and_mistral_slides_everywhere():
    gemma2 = arch_of("google/gemma-2-9b-it")
    assert [type(s) for s in gemma2.layers[:2]] == [SlidingWindow, FullAttention]
    mistral = arch_of("mistralai/Mistral-7B-v0.1")
    assert all(isinstance(s, SlidingWindow) and s.window == 4096 for s in mistral.layers)


def test_qwen2_use_sliding_window_false_means_full_attention():
    arch = arch_of("Qwen/Qwen2.5-72B-Instruct")  # sliding_window 131072 but use_sliding_window false
    assert all(type(s) is FullAttention for s in arch.layers)


def test_llama4_chunked_except_every_fourth_layer():
    arch = arch_of("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    chunked = [isinstance(s, ChunkedLocal) for s in arch.layers]
    assert chunked[:4] == [True, True, True, False]  # (i + 1) % 4 == 0 -> NoPE global layer
    assert sum(chunked) == 36 and arch.layers[0].chunk == 8192


def test_jamba_mamba1_state():
    arch = arch_of("ai21labs/Jamba-v0.1")
    attention = [i for i, s in enumerate(arch.layers) if isinstance(s, FullAttention)]
    assert attention == [4, 12, 20, 28]  # attn_layer_period 8, offset 4
    state = next(s for s in arch.layers if isinstance(s, MambaState))
    # d_inner = 2 x 4096; conv (8192, 4 - 1) + ssm (8192, 16), bf16
    assert state.state_bytes() == (8192 * 3 + 8192 * 16) * 2


def test_nemotron_h_mamba2_state_and_tp():
    arch = arch_of("nvidia/Nemotron-H-56B-Base-8K")
    assert sum(isinstance(s, FullAttention) for s in arch.layers) == 10
    state = next(s for s in arch.layers if isinstance(s, MambaState))
    # 256 heads x 64 = 16,384; conv dim 16,384 + 2 x 8 groups x 256 = 20,480. The conv state is
    # bf16; the SSM state float32 (NemotronHForCausalLMConfig's default; the config names none).
    assert state.state_bytes() == 20480 * 3 * 2 + 256 * 64 * 256 * 4
    # TP 8: 8 groups divide, conv (20480 / 8, 3), ssm (32, 64, 256)
    assert state.per_rank(8).state_bytes() == 2560 * 3 * 2 + 32 * 64 * 256 * 4


def test_qwen3_next_gated_delta_net_state():
    arch = arch_of("Qwen/Qwen3-Next-80B-A3B-Thinking")
    state = next(s for s in arch.layers if isinstance(s, MambaState))
    assert state.variant == "gated_delta_net"
    # conv dim 2 x 16 x 128 + 32 x 128 = 8,192; ssm (32, 128, 128)
    assert state.state_bytes() == (8192 * 3 + 32 * 128 * 128) * 2


def test_tensor_parallel_splits_and_replicates_kv_heads():
    layer = arch_of("meta-llama/Llama-3.1-8B").layers[0]
    assert layer.per_rank(2).num_kv_heads == 4
    assert layer.per_rank(16).num_kv_heads == 1  # tp > kv heads: replicated
    with pytest.raises(KvplanError, match="does not divide"):
        FullAttention(6, 128).per_rank(4)


def test_weights_counts_match_published_sizes():
    # Published parameter counts (model cards); the config-based count must land within 2%.
    published = {
        "meta-llama/Llama-3.1-8B": 8.03e9,
        "meta-llama/Llama-3.1-70B": 70.6e9,
        "deepseek-ai/DeepSeek-V3": 671e9,
        "openai/gpt-oss-120b": 117e9,
        "mistralai/Mixtral-8x7B-v0.1": 46.7e9,
        "Qwen/Qwen3-30B-A3B": 30.5e9,
        "google/gemma-2-9b-it": 9.24e9,
    }
    for name, params in published.items():
        assert arch_of(name).params.total == pytest.approx(params, rel=0.02), name


def test_missing_fields_are_named_with_the_override():
    with pytest.raises(KvplanError) as err:
        parse_architecture({"model_type": "llama", "hidden_size": 1024})
    assert "num_hidden_layers" in str(err.value) and "--set" in str(err.value)


def test_unknown_model_type_is_refused_unless_opted_in():
    config = {"model_type": "mystery", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8}
    with pytest.raises(KvplanError, match="no layout rules for model_type 'mystery'") as err:
        parse_architecture(config)
    assert "--layout engine" in str(err.value) and "--allow-unverified-layout" in str(err.value)
    arch = parse_architecture(config, allow_unverified=True)
    assert not arch.layout_verified and any("UNVERIFIED LAYOUT" in n for n in arch.notes)
    assert parse_architecture({**config, "model_type": "llama"}).layout_verified


def test_unknown_layer_kind_is_refused():
    config = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
              "layer_types": ["full_attention", "quantum_attention"]}
    with pytest.raises(KvplanError, match="unknown layer type.*quantum_attention"):
        parse_architecture(config)


@pytest.mark.parametrize("field, value", [
    ("num_key_value_heads", 0), ("num_key_value_heads", -8), ("head_dim", -128), ("num_hidden_layers", 10**7),
    ("head_dim", 10**12), ("num_attention_heads", 0),
])
def test_impossible_sizes_are_refused_naming_the_field(field, value):
    config = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
              field: value}
    with pytest.raises(KvplanError, match=field):
        parse_architecture(config)


def test_zero_mla_ranks_are_refused():
    config = json.loads(json.dumps(load_bundled("deepseek-ai/DeepSeek-V3").config))
    config.update(kv_lora_rank=0, qk_rope_head_dim=0)
    with pytest.raises(KvplanError, match="kv_lora_rank"):
        parse_architecture(config)


def test_every_reference_config_gives_a_result_or_a_clear_refusal():
    data = json.loads((Path(__file__).parent.parent / "data" / "reference-model-configs.json").read_text())
    results = {}
    for name, entry in data.items():
        if name == "missing":
            continue
        try:
            arch = parse_architecture(entry["fields"])
            results[name] = kv_bytes(arch)
            assert results[name] > 0
        except KvplanError as exc:  # a refusal must say what is missing
            assert str(exc)
    assert len(results) >= 30


def test_gemma4_full_layers_use_the_global_head_shape():
    # google/gemma-4-26B-A4B (config.json): 30 layers, 25 sliding (8 KV heads x 256, window 1,024),
    # 5 full with attention_k_eq_v: num_global_key_value_heads 2 x global_head_dim 512.
    arch = arch_of("google/gemma-4-26B-A4B")
    sliding = [s for s in arch.layers if isinstance(s, SlidingWindow)]
    full = [s for s in arch.layers if type(s) is FullAttention]
    assert (len(sliding), len(full)) == (25, 5)
    assert (sliding[0].num_kv_heads, sliding[0].head_size, sliding[0].window) == (8, 256, 1024)
    assert (full[0].num_kv_heads, full[0].head_size) == (2, 512)
    # 25 x 8 x 256 x 2 (K, V) x 2 B + 5 x 2 x 512 x 2 x 2 B = 204,800 + 20,480
    assert kv_bytes(arch) == 225_280


def test_gemma4_without_k_eq_v_keeps_the_kv_heads_and_forces_the_last_layer_full():
    config = {"model_type": "gemma4_text", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64, "global_head_dim": 128, "num_global_key_value_heads": 1,
              "sliding_window": 256, "layer_types": ["sliding_attention"] * 4}
    arch = parse_architecture(config)
    full = [s for s in arch.layers if type(s) is FullAttention]
    # transformers forces the last layer to full attention; without attention_k_eq_v the
    # global layers keep num_key_value_heads (Gemma4TextConfig.__post_init__).
    assert len(full) == 1 and (full[0].num_kv_heads, full[0].head_size) == (4, 128)


def test_gemma4_attention_weights_per_layer_shape():
    # nvidia/Gemma-4-31B-IT-NVFP4 (bundled config): hidden 5,376, 32 query heads; 50 sliding layers of
    # 16 KV heads x 256, 10 global layers of 4 KV heads x 512 whose V slot vLLM allocates even with
    # attention_k_eq_v (models/gemma4.py@0.32.0). q + o + k + v = hidden x head x (2 x 32 + 2 x kv heads):
    # 50 x 5,376 x 256 x 96 + 10 x 5,376 x 512 x 72 = 6,606,028,800 + 1,981,808,640
    assert arch_of("nvidia/Gemma-4-31B-IT-NVFP4").params.attention == 8_587_837_440


def test_kv_shared_layers_have_query_and_output_projections_only():
    # 4 layers, the last 2 reuse earlier layers' KV (Gemma3nAttention / Gemma4Attention: q_proj, o_proj only).
    base = {"model_type": "gemma4_text", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 64, "global_head_dim": 64, "sliding_window": 256,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    own = parse_architecture(base).params.attention
    shared = parse_architecture({**base, "num_kv_shared_layers": 2}).params.attention
    # every layer: 512 x 64 x (2 x 8 + 2 x 2) = 655,360; q + o alone: 512 x 64 x 16 = 524,288
    assert own == 4 * 655_360
    assert shared == 2 * 655_360 + 2 * 524_288


def test_kimi_linear_kda_state_and_mla_layers():
    config = {"model_type": "kimi_linear", "hidden_size": 2304, "num_hidden_layers": 4, "num_attention_heads": 32,
              "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
              "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 32,
                                     "head_dim": 128, "short_conv_kernel_size": 4}}
    arch = parse_architecture(config)
    states = [s for s in arch.layers if isinstance(s, MambaState)]
    mla = [s for s in arch.layers if isinstance(s, MLA)]
    assert (len(states), len(mla)) == (3, 1) and mla[0].latent_size == 576
    # kda_state_shape: conv (3, 32 x 128 + 2 x 32 x 128 = 12,288) in bf16; recurrent state
    # (32, 128, 128) in float32 (kda_state_dtype: "auto" is float32).
    assert states[0].state_bytes() == 3 * 12288 * 2 + 32 * 128 * 128 * 4


def test_qwen35_ssm_state_follows_mamba_ssm_dtype():
    base = arch_of("Qwen/Qwen3.5-27B")
    state = next(s for s in base.layers if isinstance(s, MambaState))
    assert state.ssm_bytes == 4  # the config says mamba_ssm_dtype: float32
    patched = arch_of("Qwen/Qwen3.5-27B", mamba_ssm_dtype="bfloat16")
    assert next(s for s in patched.layers if isinstance(s, MambaState)).ssm_bytes == 2


def test_the_configs_mamba_ssm_dtype_is_kept_as_spelled_for_every_family():
    # SGLang 0.5.9+ reads the config's mamba_ssm_dtype for any Mamba2-style state (configs/mamba_utils.py@0.5.9):
    # kvplan keeps it as written, text_config's first, without changing vLLM's ssm_bytes (its family rules decide).
    def config_dtypes(arch):
        return {s.config_mamba_ssm_dtype for s in arch.layers if isinstance(s, MambaState)}

    assert config_dtypes(arch_of("Qwen/Qwen3.5-27B")) == {"float32"}  # its text_config says float32
    assert config_dtypes(arch_of("Qwen/Qwen3-Next-80B-A3B-Thinking")) == {None}  # no such field
    # Nemotron-3-Nano names vLLM's mamba_ssm_cache_dtype only, which SGLang does not read
    assert config_dtypes(arch_of("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")) == {None}
    nemotron = arch_of("nvidia/Nemotron-H-56B-Base-8K", mamba_ssm_dtype="bfloat16")
    assert config_dtypes(nemotron) == {"bfloat16"}
    assert {s.ssm_bytes for s in nemotron.layers if isinstance(s, MambaState)} == {
        s.ssm_bytes for s in arch_of("nvidia/Nemotron-H-56B-Base-8K").layers if isinstance(s, MambaState)}
