"""Families and layer kinds kvplan used to refuse or misread although vLLM 0.32.0 serves them: EXAONE 4.0,
OLMo 3, Seed-OSS, Ministral 3, Nemotron-H's ``layers_block_type`` with "moe" / "mlp" blocks, and LLaVA(-NeXT)
text configs that leave layers and heads to transformers' defaults. Each is planned (not refused, layout
verified) and its KV bytes per token equal the hand arithmetic from its config, in bf16 (2 B):
layers x 2 (K and V) x KV heads x head_dim x 2 B. The engine twins (tests/twins) check the same layouts
against vLLM itself where the CPU build can build them."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanError
from kvplan.model.arch import parse_architecture
from kvplan.model.dtypes import kv_dtype
from kvplan.model.layers import FullAttention, MambaState, SlidingWindow
from kvplan.model.source import load_bundled

BF16 = kv_dtype("bfloat16")


def bundled(name: str) -> dict:
    found = load_bundled(name)
    assert found is not None, name
    return found.config


def kv_bytes(arch) -> float:
    return sum(s.bytes_per_token(BF16) for s in arch.layers)


def kinds(arch) -> list[str]:
    return ["sliding" if isinstance(s, SlidingWindow) else "full" if isinstance(s, FullAttention) else "state"
            for s in arch.layers]


# EXAONE 4.0-32B's text shape (its config.json was not found published in full): 64 layers, 40 query
# heads, 8 KV heads, head_dim 128, a 4,096-token window on 3 of every 4 layers.
EXAONE4_32B = {
    "architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "hidden_size": 5120, "intermediate_size": 27392,
    "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 102400, "max_position_embeddings": 131072, "sliding_window": 4096, "sliding_window_pattern": "LLLG",
}
# EXAONE 4.0-1.2B's: 30 layers, 32 heads, 8 KV heads, head_dim 64, global attention everywhere.
EXAONE4_1B = {
    "architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "hidden_size": 2048, "intermediate_size": 4096,
    "num_hidden_layers": 30, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 102400, "max_position_embeddings": 65536, "sliding_window": None, "sliding_window_pattern": None,
    "layer_types": ["full_attention"] * 30, "tie_word_embeddings": True,
}


def test_exaone4_lllg_string_pattern_is_planned():
    # "LLLG" from layer 0: layers 3, 7, ..., 63 global (16), the other 48 slide over 4,096 tokens.
    arch = parse_architecture(EXAONE4_32B)
    assert arch.layout_verified and arch.model_type == "exaone4"
    assert [i for i, k in enumerate(kinds(arch)) if k == "full"] == list(range(3, 64, 4))
    assert {s.window for s in arch.layers if isinstance(s, SlidingWindow)} == {4096}
    # 64 x 2 x 8 x 128 x 2 B = 262,144 B/token (a sliding layer's token costs what a full one's does)
    assert kv_bytes(arch) == 64 * 2 * 8 * 128 * 2 == 262_144


def test_exaone4_layer_types_win_over_the_pattern():
    # vLLM reads config.layer_types (`Exaone4Attention.__init__`, models/exaone4.py@0.32.0).
    config = dict(EXAONE4_32B, layer_types=["full_attention"] * 64)
    assert kinds(parse_architecture(config)) == ["full"] * 64


def test_exaone4_string_pattern_forces_the_last_layer_global():
    # 30 layers of "LLLG": global at 3, 7, ..., 27, and layer 29 ("L" by the pattern) global as the last layer.
    arch = parse_architecture(dict(EXAONE4_32B, num_hidden_layers=30))
    assert [i for i, k in enumerate(kinds(arch)) if k == "full"] == [3, 7, 11, 15, 19, 23, 27, 29]
    # An integer pattern is transformers' `(i + 1) % k`: no forced last layer (layer 29 slides).
    arch = parse_architecture(dict(EXAONE4_32B, num_hidden_layers=30, sliding_window_pattern=4))
    assert [i for i, k in enumerate(kinds(arch)) if k == "full"] == [3, 7, 11, 15, 19, 23, 27]


def test_exaone4_null_window_is_global_everywhere():
    # The 1.2B: 30 x 2 x 8 x 64 x 2 B = 61,440 B/token, no window.
    arch = parse_architecture(EXAONE4_1B)
    assert kinds(arch) == ["full"] * 30
    assert kv_bytes(arch) == 30 * 2 * 8 * 64 * 2 == 61_440
    # A null window with sliding layer_types: vLLM gives those layers sliding_window=None, i.e. full.
    config = dict(EXAONE4_1B, layer_types=["sliding_attention"] * 29 + ["full_attention"])
    assert kinds(parse_architecture(config)) == ["full"] * 30


@pytest.mark.parametrize("pattern", ["LXG", "", 0, -4, True, 2.5])
def test_exaone4_broken_patterns_are_refused(pattern):
    with pytest.raises(KvplanError, match="sliding_window_pattern"):
        parse_architecture(dict(EXAONE4_32B, sliding_window_pattern=pattern))


def test_gemma3_still_wants_an_integer_pattern():
    config = dict(bundled("google/gemma-3-27b-it"))
    config["text_config"] = dict(config["text_config"], sliding_window_pattern="LLLLLG")
    with pytest.raises(KvplanError, match="invalid sliding_window_pattern"):
        parse_architecture(config)


def test_olmo3_bundled_layer_types():
    # complexly/olmo3-190m-zh-continue: 12 layers, 3 sliding (window 4,096) : 1 full, 12 KV heads x 64
    # (768 / 12): 12 x 2 x 12 x 64 x 2 B = 36,864 B/token.
    arch = parse_architecture(bundled("complexly/olmo3-190m-zh-continue"))
    assert arch.layout_verified
    assert kinds(arch) == (["sliding"] * 3 + ["full"]) * 3
    assert {s.window for s in arch.layers if isinstance(s, SlidingWindow)} == {4096}
    assert kv_bytes(arch) == 12 * 2 * 12 * 64 * 2 == 36_864


def test_olmo3_defaults_without_layer_types_or_window():
    # transformers' Olmo3Config: layer_types three sliding then one full, sliding_window 4096. An Olmo-3-7B
    # shape (32 layers, 32 heads = 32 KV heads x 128): 24 sliding + 8 full, 32 x 2 x 32 x 128 x 2 B = 524,288.
    config = {"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "hidden_size": 4096,
              "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 100278}
    arch = parse_architecture(config)
    assert kinds(arch) == (["sliding"] * 3 + ["full"]) * 8
    assert {s.window for s in arch.layers if isinstance(s, SlidingWindow)} == {4096}
    assert kv_bytes(arch) == 32 * 2 * 32 * 128 * 2 == 524_288


def test_seed_oss_36b():
    # darkc0de/4.3test2 (Seed-OSS-36B): 64 layers x 2 x 8 KV heads x head_dim 128 x 2 B = 262,144 B/token.
    arch = parse_architecture(bundled("darkc0de/4.3test2"))
    assert arch.layout_verified and arch.model_type == "seed_oss"
    assert kinds(arch) == ["full"] * 64
    assert kv_bytes(arch) == 64 * 2 * 8 * 128 * 2 == 262_144


def test_seed_oss_head_dim_defaults_to_128_not_hidden_over_heads():
    # SeedOssConfig's head_dim default is 128; hidden / heads would be 5,120 / 80 = 64 (half the cache).
    config = {k: v for k, v in bundled("darkc0de/4.3test2").items() if k != "head_dim"}
    assert {s.head_size for s in parse_architecture(config).layers} == {128}


def test_ministral3_text_model():
    # rootlocalghost/ERNIE-Image pe/ (Ministral 3 3B text shape): 26 x 2 x 8 x 128 x 2 B = 106,496 B/token.
    arch = parse_architecture(bundled("rootlocalghost/ERNIE-Image"))
    assert arch.layout_verified and arch.model_type == "ministral3"
    assert kinds(arch) == ["full"] * 26
    assert kv_bytes(arch) == 26 * 2 * 8 * 128 * 2 == 106_496


def test_ministral3_inside_mistral3_wrapper():
    # Mistral3ForConditionalGeneration with a ministral3 text_config (the Ministral 3 checkpoints' layout).
    text = bundled("rootlocalghost/ERNIE-Image")
    config = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "text_config": text}
    assert kv_bytes(parse_architecture(config)) == 106_496


def _nemotron_blocks(blocks: list[str]) -> dict:
    """The bundled Nemotron 3 Nano config with its pattern written as a layers_block_type list (as
    Nemotron 3.5 configs write it; transformers' NemotronHConfig maps one to the other)."""
    config = dict(bundled("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"))
    pattern = config.pop("hybrid_override_pattern")
    names = dict(zip("M*E-", blocks))
    return dict(config, layers_block_type=[names[c] for c in pattern])


@pytest.mark.parametrize("blocks", [["mamba", "attention", "moe", "mlp"],
                                    ["linear_attention", "full_attention", "moe", "mlp"]])
def test_layers_block_type_moe_and_mlp_hold_no_cache(blocks):
    arch = parse_architecture(_nemotron_blocks(blocks))
    same = parse_architecture(bundled("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"))
    assert arch.layers == same.layers and arch.layer_index == same.layer_index
    assert arch.params == same.params  # the MoE blocks still count as experts
    # 52 blocks: 23 Mamba-2, 6 attention, 23 MoE (no cache). KV: 6 x 2 x 2 KV heads x 128 x 2 B = 6,144 B/token.
    assert kinds(arch).count("full") == 6 and kinds(arch).count("state") == 23
    assert kv_bytes(arch) == 6 * 2 * 2 * 128 * 2 == 6_144
    # Each Mamba-2 state: 64 heads x 64 = 4,096 inner, conv (4,096 + 2 x 8 groups x 128) x (4 - 1) in bf16,
    # SSM 64 x 64 x 128 in float32 (mamba_ssm_cache_dtype): 6,144 x 3 x 2 = 36,864 + 2,097,152 = 2,134,016 B.
    assert {s.state_bytes() for s in arch.layers if isinstance(s, MambaState)} == {
        (4096 + 2 * 8 * 128) * 3 * 2 + 64 * 64 * 128 * 4} == {2_134_016}
    assert arch.params.experts > 0


def test_layers_block_type_mlp_blocks_are_dense_mlps():
    config = dict(bundled("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"))
    config.pop("hybrid_override_pattern")
    config.update(num_hidden_layers=4, layers_block_type=["mamba", "mlp", "attention", "mlp"])
    arch = parse_architecture(config)
    assert kinds(arch) == ["state", "full"]
    assert arch.params.experts == 0 and arch.params.mlp == 2 * 2 * 2688 * 1856  # two up/down (relu2) MLPs


def test_llava_next_mistral_text_config_takes_mistral_defaults():
    # text_config names no layers or heads: MistralConfig's 32 layers, 32 heads, hidden 4096 (head_dim
    # 4096 / 32 = 128), its num_key_value_heads 8, sliding_window null: 32 x 2 x 8 x 128 x 2 B = 131,072.
    arch = parse_architecture(bundled("llava-hf/llava-v1.6-mistral-7b-hf"))
    assert arch.layout_verified and arch.model_type == "mistral"
    assert kinds(arch) == ["full"] * 32
    assert kv_bytes(arch) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert arch.max_model_len_limit == 32768
    assert any("transformers' mistral defaults" in n for n in arch.notes)


def test_llava_next_vicuna_text_config_takes_llama_defaults():
    # LlamaConfig: 32 layers, 32 heads, hidden 4096, KV heads None -> 32 (MHA): 32 x 2 x 32 x 128 x 2 B = 524,288.
    arch = parse_architecture(bundled("llava-hf/llava-v1.6-vicuna-7b-hf"))
    assert arch.model_type == "llama" and kinds(arch) == ["full"] * 32
    assert kv_bytes(arch) == 32 * 2 * 32 * 128 * 2 == 524_288
    assert arch.vocab_size == 32064 and arch.max_model_len_limit == 4096


def test_llava_mistral_text_config_without_window_slides_every_layer():
    # MistralConfig's sliding_window default is 4096, and vLLM applies a model-wide window to every layer
    # of a model without layer_types (engine/arg_utils.py@0.32.0).
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
              "text_config": {"model_type": "mistral"}}
    arch = parse_architecture(config)
    assert kinds(arch) == ["sliding"] * 32 and {s.window for s in arch.layers} == {4096}
    assert kv_bytes(arch) == 32 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("config", [
    {"architectures": ["LlavaNextForConditionalGeneration"], "model_type": "llava_next"},
    {"architectures": ["LlavaNextForConditionalGeneration"], "model_type": "llava_next", "text_config": {}},
    {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": {"vocab_size": 32064}},
    {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": {"model_type": "llama"}},
])
def test_llava_without_a_text_model_is_a_default_llama(config):
    # LlavaConfig / LlavaNextConfig build a missing text_config (or one without model_type) as LlamaConfig():
    # 32 x 2 x 32 x 128 x 2 B = 524,288 B/token.
    arch = parse_architecture(config)
    assert arch.model_type == "llama" and arch.layout_verified
    assert kv_bytes(arch) == 32 * 2 * 32 * 128 * 2 == 524_288


def test_a_top_level_llama_config_still_needs_its_fields():
    with pytest.raises(KvplanError, match="missing num_hidden_layers"):
        parse_architecture({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32})


@pytest.mark.parametrize("model_type", ["exaone4", "olmo3", "seed_oss", "ministral3"])
def test_the_added_model_types_are_no_longer_refused(model_type):
    config = {"model_type": model_type, "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 1000}
    arch = parse_architecture(config)
    assert arch.layout_verified and not any("UNVERIFIED" in n for n in arch.notes)
    # 8 layers x 2 x 2 KV heads x 128 x 2 B = 8,192 B/token, whatever slides
    assert kv_bytes(arch) == 8 * 2 * 2 * 128 * 2 == 8_192


# Laguna-XS.2's shape (poolside; transformers' LagunaConfig defaults, layer_types one global in four; no published
# config.json was found in the stored sources): 40 layers, 8 KV heads, head_dim 128, a 512-token window on the
# layers layer_types names sliding, 48 query heads on the global layers and 64 on the sliding ones.
LAGUNA_XS = {
    "architectures": ["LagunaForCausalLM"], "model_type": "laguna", "vocab_size": 100352, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 48, "num_key_value_heads": 8,
    "head_dim": 128, "sliding_window": 512, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "gating": "per-head",
    "max_position_embeddings": 262144, "tie_word_embeddings": False,
    "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(40)],
    "mlp_layer_types": ["dense"] + ["sparse"] * 39,
    "num_attention_heads_per_layer": [48 if i % 4 == 0 else 64 for i in range(40)],
}


def test_laguna_slides_where_layer_types_says_and_counts_its_per_layer_heads():
    arch = parse_architecture(LAGUNA_XS)
    assert arch.layout_verified
    assert kinds(arch) == ["full" if i % 4 == 0 else "sliding" for i in range(40)]
    assert {s.window for s in arch.layers if isinstance(s, SlidingWindow)} == {512}
    assert kv_bytes(arch) == 40 * 2 * 8 * 128 * 2  # 163,840 B a token before the windows cap the sliding layers
    # q and o: heads x 128 each way, k and v: 2 x 8 x 128, the per-head gate: heads, all times hidden 2,048.
    per_layer = [2048 * (2 * h * 128 + 2 * 8 * 128 + h) for h in LAGUNA_XS["num_attention_heads_per_layer"]]
    assert arch.params.attention == sum(per_layer) == 10 * 2048 * (12288 + 2048 + 48) + 30 * 2048 * (16384 + 2048 + 64)
    # Layer 0 dense (3 x 2,048 x 8,192); 39 layers of 256 experts of 3 x 2,048 x 512 and one shared expert of 512.
    assert arch.params.mlp == 3 * 2048 * 8192
    assert arch.params.experts == 39 * 256 * 3 * 2048 * 512
    assert arch.params.shared_experts == 39 * 3 * 2048 * 512


def test_laguna_without_layer_types_is_global_everywhere():
    """transformers' LagunaConfig defaults layer_types to full attention on every layer, and vLLM's LagunaModel
    clears the model-level window, so a config without layer_types has no sliding layer despite sliding_window."""
    config = {k: v for k, v in LAGUNA_XS.items() if k not in ("layer_types", "num_attention_heads_per_layer")}
    arch = parse_architecture(config)
    assert kinds(arch) == ["full"] * 40


# MiMo-V2-Flash's shape in the checkpoint's own fields (those vLLM's mimo_v2.py reads; written here before the bundled
# profile, a field subset of the published config transcribed by aiconfigurator, was found): 48 layers, layer 0 and
# every 6th global (4 KV heads),
# the rest sliding (8 KV heads, a 128-token window), K heads of 192 and V heads of 128, 256 experts from layer 1.
MIMO_V2_FLASH = {
    "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "hidden_size": 4096,
    "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128,
    "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8, "swa_head_dim": 192, "swa_v_head_dim": 128,
    "sliding_window_size": 128, "hybrid_layer_pattern": [0 if i == 0 or (i + 1) % 6 == 0 else 1 for i in range(48)],
    "moe_layer_freq": [0] + [1] * 47, "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
    "intermediate_size": 16384, "vocab_size": 152576, "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
}


def test_mimo_v2_flash_gives_its_sliding_and_global_layers_their_own_shapes():
    arch = parse_architecture(MIMO_V2_FLASH)
    assert arch.layout_verified
    globals_ = [s for s in arch.layers if not isinstance(s, SlidingWindow)]
    sliding = [s for s in arch.layers if isinstance(s, SlidingWindow)]
    assert len(globals_) == 9 and len(sliding) == 39
    assert {(s.num_kv_heads, s.head_size, s.head_size_v) for s in globals_} == {(4, 192, 128)}
    assert {(s.num_kv_heads, s.head_size, s.head_size_v, s.window) for s in sliding} == {(8, 192, 128, 128)}
    # K 192 + V 128 per KV head, 2 B: 9 x 4 x 320 x 2 + 39 x 8 x 320 x 2
    assert kv_bytes(arch) == 9 * 4 * 320 * 2 + 39 * 8 * 320 * 2 == 222_720
    # q 64 x 192, o 64 x 128, k 192 and v 128 per KV head, times hidden 4,096
    assert arch.params.attention == 9 * 4096 * (64 * 320 + 4 * 320) + 39 * 4096 * (64 * 320 + 8 * 320)
    assert arch.params.experts == 47 * 256 * 3 * 4096 * 2048 and arch.params.mlp == 3 * 4096 * 16384


def test_mimo_v2_flash_without_its_layer_pattern_is_refused_as_vllm_would():
    config = {k: v for k, v in MIMO_V2_FLASH.items() if k != "hybrid_layer_pattern"}
    with pytest.raises(KvplanError, match="hybrid_layer_pattern"):
        parse_architecture(config)
    with pytest.raises(KvplanError, match="swa_head_dim"):
        parse_architecture({k: v for k, v in MIMO_V2_FLASH.items() if k != "swa_head_dim"})
    with pytest.raises(KvplanError, match="moe_layer_freq"):
        parse_architecture({**MIMO_V2_FLASH, "moe_layer_freq": [1, -1] + [1] * 46})
