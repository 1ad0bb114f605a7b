"""The bundled moonshotai/Kimi-Linear-48B-A3B-Instruct, google/gemma-4-31B-it, -E2B-it and -E4B-it profiles, against
numbers worked out by hand from their config.json and vLLM 0.32.0's allocation code (never from
kvplan itself)."""

from __future__ import annotations

import json

from kvplan.model.arch import parse_architecture
from kvplan.model.dtypes import kv_dtype
from kvplan.model.layers import MLA, FullAttention, MambaState, SlidingWindow
from kvplan.model.source import load_bundled

BF16 = kv_dtype("bfloat16")
KIMI = "moonshotai/Kimi-Linear-48B-A3B-Instruct"
GEMMA = "google/gemma-4-31B-it"


def arch_of(name):
    found = load_bundled(name)
    assert found is not None, name
    return parse_architecture(found.config)


# --- Kimi-Linear-48B-A3B-Instruct --------------------------------------------------------------
# config.json: 27 layers, hidden 2,304; linear_attn_config.kda_layers (1-based) =
# 1-3, 5-7, 9-11, 13-15, 17-19, 21-23, 25, 26 (20 layers), full_attn_layers = 4, 8, 12, 16, 20, 24, 27
# (7 MLA layers); KDA num_heads 32, head_dim 128, short_conv_kernel_size 4; MLA kv_lora_rank 512,
# qk_rope_head_dim 64. vLLM: layer i (0-based) is KDA when i + 1 is in kda_layers
# (`KimiLinearConfig.is_kda_layer`, transformers_utils/configs/kimi_linear.py@0.32.0 lines 157-161).
KIMI_MLA_LAYERS = [3, 7, 11, 15, 19, 23, 26]  # full_attn_layers - 1


def test_kimi_linear_layer_kinds_follow_kda_layers():
    arch = arch_of(KIMI)
    assert len(arch.layers) == 27
    mla = [i for i, s in enumerate(arch.layers) if isinstance(s, MLA)]
    kda = [i for i, s in enumerate(arch.layers) if isinstance(s, MambaState)]
    assert mla == KIMI_MLA_LAYERS
    assert len(kda) == 20 and set(kda) | set(mla) == set(range(27))


def test_kimi_linear_mla_kv_bytes_per_token():
    # MLA layers (models/kimi_k3/nvidia/mla.py@0.32.0 line 156: head_size = kv_lora_rank +
    # qk_rope_head_dim; lines 417-431: MLAAttentionSpec with num_kv_heads=1, dtype of the cache):
    # one latent of 512 + 64 = 576 elements per token per layer, bf16 = 2 bytes -> 1,152 B;
    # 7 MLA layers -> 7 x 1,152 = 8,064 B per token. The KDA layers hold no per-token KV.
    arch = arch_of(KIMI)
    mla = [s for s in arch.layers if isinstance(s, MLA)]
    assert {s.latent_size for s in mla} == {576}
    assert [s.bytes_per_token(BF16) for s in mla] == [1_152] * 7
    assert sum(s.bytes_per_token(BF16) for s in arch.layers) == 8_064


def test_kimi_linear_kda_state_bytes_per_request():
    # Standalone Kimi-Linear's KDA layer is KimiGatedDeltaNetAttention (models/kimi_k3/nvidia/model.py
    # @0.32.0 lines 889-906: no use_full_rank_gate in this config). Its state
    # (model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py@0.32.0 lines 157-175) is
    # MambaStateShapeCalculator.kda_state_shape(tp, num_heads, head_dim, conv_kernel_size)
    # (model_executor/layers/mamba/mamba_utils.py@0.32.0 lines 304-326), at TP 1, no speculation:
    #   conv_dim = 32 x 128 + 2 x 32 x 128 = 4,096 + 8,192 = 12,288
    #   conv state      = (12,288, 4 - 1) (or (3, 12,288), by layout) = 36,864 elements
    #   recurrent state = (32, 128, 128) = 524,288 elements
    # and its dtypes (`MambaStateDtypeCalculator.kda_state_dtype`, mamba_utils.py@0.32.0 lines
    # 133-149, called without mamba_ssm_cache_dtype at line 162-164 of the layer): conv in the
    # cache dtype ("auto": the model's bfloat16, 2 B), recurrent float32 (4 B) for "auto":
    #   36,864 x 2 = 73,728 B  +  524,288 x 4 = 2,097,152 B  =  2,170,880 B per KDA layer
    # and 20 KDA layers x 2,170,880 = 43,417,600 B per request.
    arch = arch_of(KIMI)
    states = [s for s in arch.layers if isinstance(s, MambaState)]
    assert {s.variant for s in states} == {"kda"}
    assert {(s.conv_bytes, s.ssm_bytes) for s in states} == {(2, 4)}
    assert {s.state_bytes() for s in states} == {2_170_880}
    assert sum(s.state_bytes() for s in states) == 43_417_600


def test_kimi_linear_weights_match_the_checkpoint_and_the_published_48b():
    # vLLM's KDA layer (kimi_gdn_linear_attn.py@0.32.0 lines 214-310), P = 32 x 128 = 4,096:
    #   in_proj (q, k, v, beta, f_a): 2,304 x (3 x 4,096 + 32 + 128) = 2,304 x 12,448 = 28,680,192
    #   f_b_proj, g_b_proj: 2 x 128 x 4,096 = 1,048,576;  g_a_proj: 2,304 x 128 = 294,912
    #   o_proj: 4,096 x 2,304 = 9,437,184;  conv1d: 3 x 4,096 x 4 = 49,152;  dt_bias: 4,096;
    #   A_log: 32;  o_norm: 128  -> 39,514,272 per KDA layer, x 20 = 790,285,440.
    # The same per-layer tensors in the report's weight table (q/k/v_proj 4,096 x 2,304, b_proj
    # 32 x 2,304, f_a/g_a 128 x 2,304, f_b/g_b 4,096 x 128, o_proj 2,304 x 4,096, three conv1d
    # 4,096 x 1 x 4, dt_bias 4,096, A_log 32, o_norm 128) sum to the same 39,514,272.
    arch = arch_of(KIMI)
    assert arch.params.recurrent == 20 * 39_514_272
    # MLA layer: q_proj 32 x 192 x 2,304 = 14,155,776; kv_a 2,304 x 576 = 1,327,104;
    # kv_b 512 x 32 x (128 + 128) = 4,194,304; o_proj 32 x 128 x 2,304 = 9,437,184 -> 29,114,368 x 7
    assert arch.params.attention == 7 * 29_114_368
    # Routed experts: 26 MoE layers (first_k_dense_replace 1) x 256 x 3 x 2,304 x 1,024.
    assert arch.params.experts == 26 * 256 * 3 * 2_304 * 1_024
    # The report's safetensors total is 49,122,681,728; kvplan leaves out 10,240 of it (the 7
    # kv_a_layernorm weights of 512 and 26 router biases of 256). Published: "48B" total.
    assert 49_122_681_728 - arch.params.total == 7 * 512 + 26 * 256
    assert 47.5e9 <= arch.params.total < 49.5e9


# --- gemma-4-31B-it ----------------------------------------------------------------------------
# config.json text_config: 60 layers, layer_types: every 6th (indices 5, 11, ..., 59) full_attention,
# the rest sliding_attention with sliding_window 1,024; head_dim 256, num_key_value_heads 16;
# global_head_dim 512, num_global_key_value_heads 4, attention_k_eq_v true.
# Per layer, vLLM takes head_dim and num_key_value_heads from config.per_layer_config
# (models/gemma4.py@0.32.0 lines 577-589), which transformers' Gemma4TextConfig fills for the
# full_attention layers with global_head_dim and, with attention_k_eq_v, num_global_key_value_heads
# (transformers/models/gemma4/configuration_gemma4.py@5.19.0 lines 210-223). With attention_k_eq_v
# vLLM still builds a QKVParallelLinear and loads K into both the K and V slots (gemma4.py@0.32.0
# lines 420-431), and the layer's Attention(num_kv_heads, head_dim) (lines 501-509) caches K and V.
GEMMA_GLOBAL_LAYERS = list(range(5, 60, 6))


def test_gemma4_31b_layer_shapes():
    arch = arch_of(GEMMA)
    assert len(arch.layers) == 60
    full = [i for i, s in enumerate(arch.layers) if type(s) is FullAttention]
    sliding = [s for s in arch.layers if isinstance(s, SlidingWindow)]
    assert full == GEMMA_GLOBAL_LAYERS and len(sliding) == 50
    assert {(s.num_kv_heads, s.head_size, s.window) for s in sliding} == {(16, 256, 1_024)}
    assert {(arch.layers[i].num_kv_heads, arch.layers[i].head_size) for i in full} == {(4, 512)}


def test_gemma4_31b_kv_bytes_per_token():
    # sliding layer: 16 KV heads x 256 x 2 (K and V) x 2 B (bf16) = 16,384 B per token
    # global layer:   4 KV heads x 512 x 2 (K and V) x 2 B         =  8,192 B per token
    #                 (with attention_k_eq_v the V slot is still allocated, see above)
    # all layers: 50 x 16,384 + 10 x 8,192 = 819,200 + 81,920 = 901,120 B per token
    # (a sliding layer keeps at most its 1,024-token window of that, plus a block).
    arch = arch_of(GEMMA)
    per_layer = [s.bytes_per_token(BF16) for s in arch.layers]
    assert {per_layer[i] for i in GEMMA_GLOBAL_LAYERS} == {8_192}
    assert {b for i, b in enumerate(per_layer) if i not in GEMMA_GLOBAL_LAYERS} == {16_384}
    assert sum(per_layer) == 901_120


def test_gemma4_31b_text_weights_and_the_published_31b():
    arch = arch_of(GEMMA)
    # embed_tokens 262,144 x 5,376 = 1,409,286,144 (tied: no lm_head)
    assert (arch.params.embedding, arch.params.lm_head) == (1_409_286_144, 0)
    # MLP: 60 x 3 x 5,376 x 21,504 = 20,808,990,720
    assert arch.params.mlp == 20_808_990_720
    # q + o + k + v as vLLM holds them (the V slot kept on the k_eq_v global layers):
    # 50 x 5,376 x 256 x (2 x 32 + 2 x 16) + 10 x 5,376 x 512 x (2 x 32 + 2 x 4)
    # = 6,606,028,800 + 1,981,808,640 (the checkpoint has no v_proj there: 110,100,480 fewer)
    assert arch.params.attention == 8_587_837_440
    # Published: a dense model with 31B parameters; the report's safetensors total is 31,273,088,876.
    assert 30.5e9 <= arch.params.total < 31.5e9


def test_gemma4_vision_tower_counted_module_by_module():
    """Gemma 4's vision tower is transformers' Gemma4VisionModel (vLLM: AutoModel.from_config in
    models/gemma4_mm.py@0.32.0). Its modules with this vision_config (h 1152, 27 layers, 16 heads x
    72, intermediate 4304, patch 16, position_embedding_size 10240), as transformers builds them:
      position table 2 x 10,240 x 1,152                 =  23,592,960
      patch projection 1,152 x (3 x 16 x 16), no bias   =     884,736
      per layer: q, k, v, o 4 x 1,152 x 1,152           =   5,308,416
                 q_norm + k_norm 2 x 72                  =         144
                 gate, up, down 3 x 1,152 x 4,304        =  14,874,624
                 four norms 4 x 1,152                    =       4,608
                 = 20,187,792; x 27                      = 545,070,384
      tower                                              = 569,548,080
    plus embed_vision's projection 1,152 x 5,376 (text width), no bias = 6,193,152.
    (The tower total is what torch counts for Gemma4VisionModel built on the meta device.)"""
    assert arch_of(GEMMA).params.towers == 569_548_080 + 6_193_152


def test_kimi_linear_state_dtype_flag():
    """vLLM 0.32's KDA layer keeps its recurrent state in float32 whatever --mamba-ssm-cache-dtype
    says (kimi_gdn_linear_attn.py@0.32.0 passes only the conv dtype), while the model hook that
    aligns the block size reads the flag: float32 plans as auto; bfloat16 is refused, not guessed."""
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    def size(dtype: str):
        return CliRunner().invoke(app, ["size", "moonshotai/Kimi-Linear-48B-A3B-Instruct", "--ctx", "32k",
                                        "--gpu", "2xH100-SXM", "--mamba-ssm-cache-dtype", dtype, "--json"])

    auto, fp32, bf16 = size("auto"), size("float32"), size("bfloat16")
    assert auto.exit_code == fp32.exit_code == 0, auto.output
    a, f = json.loads(auto.stdout), json.loads(fp32.stdout)
    for key in ("block_size", "block_bytes", "num_blocks", "kv_cache_tokens", "max_concurrency"):
        assert a[key] == f[key], key
    assert bf16.exit_code == 2 and "KDA state in float32" in bf16.output
    assert len(bf16.output.strip().splitlines()) == 1


# --- google/gemma-4-E2B-it ---------------------------------------------------------------------
# config.json (text_config): hidden 1,536, 35 layers, intermediate 6,144, 8 heads of 256, 1 KV head,
# global_head_dim 512, num_kv_shared_layers 20, use_double_wide_mlp, hidden_size_per_layer_input 256,
# vocab 262,144 (tied); audio_config: gemma4_audio, hidden 1,024, 12 layers, 8 heads, conv kernel 5,
# subsampling channels [128, 32], output_proj_dims 1,536.
E2B = "google/gemma-4-E2B-it"


def test_gemma4_e2b_double_wide_mlp_on_the_kv_shared_layers():
    # vLLM (`Gemma4DecoderLayer.__init__`, models/gemma4.py@0.32.0): layers >= 35 - 20 = 15 get
    # 2 x 6,144. Gated MLP: 3 x 1,536 x 6,144 = 28,311,552 per plain layer, twice that when wide:
    # 15 x 28,311,552 + 20 x 56,623,104 = 424,673,280 + 1,132,462,080 = 1,557,135,360.
    arch = arch_of(E2B)
    assert arch.params.mlp == 1_557_135_360
    assert arch.mlp_activation_width == 12_288


def test_gemma4_e2b_audio_and_vision_towers():
    # Audio (transformers' Gemma4AudioModel, built by vLLM with AutoModel.from_config), h = 1,024:
    #   per layer: 2 feed-forwards x (8 h^2 + 2 h) = 16,781,312; attention 5 h^2 + h / 8 = 5,243,008;
    #   light conv 3 h^2 + 5 h + 2 h = 3,152,896; 3 norms 3,072 -> 25,180,288; x 12 = 302,163,456
    #   subsampling: 128 x 9 + 128 + 32 x 128 x 9 + 32 + (128 // 4) x 32 x 1,024 = 1,086,752
    #   output projection 1,536 x 1,024 + 1,536 = 1,574,400; embed_audio 1,536 x 1,536 = 2,359,296
    #   -> 307,183,904
    # Vision (Gemma4VisionModel, h 768, 16 layers, intermediate 3,072, 12 heads of 64, patch 16,
    # position_embedding_size 10,240, output to 1,536):
    #   positions 2 x 10,240 x 768 = 15,728,640; patch 3 x 16 x 16 x 768 = 589,824
    #   per layer: q/k/v/o 4 x 768 x 768 = 2,359,296 + q/k norms 128 + MLP 3 x 768 x 3,072 = 7,077,888
    #   + 4 norms 3,072 = 9,440,384; x 16 = 151,046,144; embed_vision 768 x 1,536 = 1,179,648
    #   -> 168,544,256
    # Together 475,728,160 (transformers 5.19.0 on the meta device: audio_tower 304,824,608 +
    # embed_audio 2,359,296 + vision_tower 167,364,608 + embed_vision 1,179,648 = 475,728,160).
    arch = arch_of(E2B)
    assert arch.params.towers == 475_728_160
    assert any(n.startswith("audio tower (0.31B parameters)") for n in arch.notes)


def test_gemma4_e2b_kv_layout():
    # 15 layers hold KV (20 reuse an earlier one's): layers 4, 9, 14 of the first 15 are full attention
    # (every 5th), with global_head_dim 512 and the 1 KV head; the other 12 slide over 512 tokens.
    arch = arch_of(E2B)
    full = [s for s in arch.layers if type(s) is FullAttention]
    sliding = [s for s in arch.layers if type(s) is SlidingWindow]
    assert len(arch.layers) == 15 and len(full) == 3 and len(sliding) == 12
    assert [i for i, s in enumerate(arch.layers) if type(s) is FullAttention] == [4, 9, 14]
    assert {(s.num_kv_heads, s.head_size) for s in full} == {(1, 512)}
    assert {(s.num_kv_heads, s.head_size, s.window) for s in sliding} == {(1, 256, 512)}


# --- google/gemma-4-E4B-it ---------------------------------------------------------------------
# config.json (text_config): hidden 2,560, 42 layers, intermediate 10,240, 2 KV heads of 256, global_head_dim
# 512, every 6th layer full attention, num_kv_shared_layers 18, use_double_wide_mlp false.
E4B = "google/gemma-4-E4B-it"


def test_gemma4_e4b_no_double_wide_mlp_and_24_kv_layers():
    # No double-wide flag: 42 x 3 x 2,560 x 10,240 = 3,303,014,400.
    arch = arch_of(E4B)
    assert arch.params.mlp == 3_303_014_400 and arch.mlp_activation_width == 10_240
    # 42 - 18 = 24 layers hold KV; of them 5, 11, 17, 23 are full attention (2 KV heads x 512).
    assert len(arch.layers) == 24
    assert [i for i, s in enumerate(arch.layers) if type(s) is FullAttention] == [5, 11, 17, 23]
    assert {(s.num_kv_heads, s.head_size) for s in arch.layers if type(s) is FullAttention} == {(2, 512)}
    assert {(s.num_kv_heads, s.head_size, s.window) for s in arch.layers if type(s) is SlidingWindow} == {(2, 256, 512)}
