"""Weights as vLLM loads them (issue 11, item 7): MXFP4 kernel layouts, NVFP4 module lists,
multimodal towers, MTP tensors. Expected figures are hand arithmetic from the configs and vLLM's
tensor shapes, and the "Model loading took" lines of public reports
(profiles/reports/vllm-startup-reports.jsonl)."""

import pytest

from kvplan.hardware.catalog import find_device
from kvplan.model.arch import parse_architecture
from kvplan.model.hub_weights import sum_tensors
from kvplan.model.source import load_bundled
from kvplan.model.weights import ExpertShape, mxfp4_expert_bytes, mxfp4_kernel_for, weight_bytes
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.units import GiB
from kvplan.vllm.rules import rules_for

GPT_OSS_120B = ExpertShape(moe_layers=36, experts=128, hidden=2880, intermediate=2880, bias=True)


def arch_of(name):
    return parse_architecture(load_bundled(name).config)


def test_mxfp4_triton_layout_by_hand():
    # Triton (H100, vLLM >= 0.11): intermediate padded to 64 (2880 stays), hidden unpadded.
    # Per layer: w13 128 x 5,760 x 1,440 B = 1,061,683,200; w2 128 x 2,880 x 1,440 = 530,841,600;
    # e8m0 scales 128 x (5,760 + 2,880) x 90 = 99,532,800, held twice (the swizzled copy beside
    # the original) = 199,065,600; fp32 biases 128 x (5,760 + 2,880) x 4 = 4,423,680.
    # 1,796,014,080 x 36 layers = 64,656,506,880 B.
    assert mxfp4_expert_bytes(GPT_OSS_120B, "triton") == 64_656_506_880


def test_mxfp4_marlin_layout_by_hand():
    # Marlin: intermediate 2880 -> 2944 (128), hidden 2880 -> 3072 (256).
    # w13 128 x 5,888 x 1,536 = 1,157,627,904; w2 128 x 3,072 x 1,472 = 578,813,952;
    # scales once: 128 x 5,888 x 96 + 128 x 3,072 x 92 = 72,351,744 + 36,175,872;
    # bf16 biases 128 x (5,888 + 3,072) x 2 = 2,293,760. Per layer 1,847,263,232; x 36 = 66,501,476,352.
    assert mxfp4_expert_bytes(GPT_OSS_120B, "marlin") == 66_501_476_352
    # TP 2 pads each shard: 1,440 -> 1,536, so both shards together hold more than TP 1.
    assert mxfp4_expert_bytes(GPT_OSS_120B, "marlin", tp=2) > mxfp4_expert_bytes(GPT_OSS_120B, "marlin")


def test_mxfp4_kernel_per_gpu_and_release():
    assert mxfp4_kernel_for(find_device("H100"), (0, 11, 0)) == "triton"
    assert mxfp4_kernel_for(find_device("H100"), (0, 10, 1)) == "marlin"  # vllm#23278's log
    assert mxfp4_kernel_for(find_device("A100"), (0, 14, 1)) == "marlin"  # below SM90
    assert mxfp4_kernel_for(find_device("B200"), (0, 14, 1)) == "flashinfer_sm100"
    assert mxfp4_kernel_for(None) is None


@pytest.mark.parametrize(("model", "version", "reported_gib", "tolerance"), [
    ("openai/gpt-oss-120b", "0.11.0", 64.38, 0.005),   # kv030 (0.11.0) and kv045 (vllm#33155, 0.14.1): Triton
    ("openai/gpt-oss-120b", "0.14.1", 64.38, 0.005),
    ("openai/gpt-oss-120b", "0.10.1", 65.9651, 0.005),  # kv046 (vllm#23278): Marlin on an H100
    ("openai/gpt-oss-20b", "0.11.0", 13.47, 0.01),     # kv029
])
def test_gpt_oss_weights_match_model_loading_took(model, version, reported_gib, tolerance):
    arch = arch_of(model)
    rules = rules_for(version)
    cap = compute_capacity(arch, find_device("H100"), Settings(max_model_len=16000), rules, load_overhead())
    got = cap.limiting_stage.weights / GiB
    assert got == pytest.approx(reported_gib, rel=tolerance)
    # The checkpoint's own layout (no kernel padding, scales once) was 5-6% under the log.
    plain = weight_bytes(arch.params, arch.model_dtype_bytes, arch.quantization) / GiB
    assert plain < reported_gib * 0.96


def test_nvfp4_ignore_list_keeps_attention_in_bf16():
    # nvidia/Gemma-4-31B-IT-NVFP4: group_0 targets "Linear" (4-bit float, group 16) and the
    # ignore list names self_attn of all 60 layers, lm_head and the vision tower.
    q = arch_of("nvidia/Gemma-4-31B-IT-NVFP4").quantization
    prices = dict(q.role_bytes)
    assert prices["attention"] == 2.0
    assert prices["mlp"] == 0.5 + 1 / 16  # packed fp4 + one fp8 scale per 16
    assert not q.quantize_lm_head


def test_modelopt_mixed_precision_prices_each_group():
    # nvidia/Qwen3.6-27B-NVFP4: group_0 fp8 (8-bit float) targets every linear_attn and self_attn
    # projection; group_1 nvfp4 every mlp projection and lm_head.
    q = arch_of("nvidia/Qwen3.6-27B-NVFP4").quantization
    prices = dict(q.role_bytes)
    assert prices["recurrent"] == 1.0 and prices["attention"] == 1.0
    assert prices["mlp"] == 0.5625
    assert q.quantize_lm_head and q.bytes_per_param == 0.5625


def test_compressed_tensors_nvfp4_is_not_priced_as_int4():
    cfg = dict(load_bundled("meta-llama/Llama-3.1-8B").config)
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}}, "ignore": ["lm_head"]}
    # fp4 value (0.5 B) + fp8 scale per 16 (1/16 B); GPTQ-style int4 would add an fp16 scale + zero (0.656 B).
    assert parse_architecture(cfg).quantization.bytes_per_param == 0.5625


def test_qwen36_vision_tower_by_hand_and_language_model_only():
    # Qwen3_VisionTransformer (vision_config: hidden 1152, depth 27, intermediate 4304, patch 16,
    # temporal 2, 3 channels, merge 2, out 2048, 2304 positions, no deepstack):
    #   patch embed 3 x 2 x 16 x 16 x 1152 + 1152 = 1,770,624; positions 2304 x 1152 = 2,654,208
    #   block: norms 4,608 + qkv 3,984,768 + proj 1,328,256 + fc1 4,962,512 + fc2 4,959,360 = 15,239,504
    #   27 blocks = 411,466,608; merger: norm 2,304 + 4608^2 + 4608 + 4608 x 2048 + 2048 = 30,679,808
    #   total 446,571,248
    arch = arch_of("Qwen/Qwen3.6-35B-A3B")
    assert arch.params.towers == 446_571_248
    args = (find_device("H100"), rules_for("0.24.0"), load_overhead())
    full = compute_capacity(arch, args[0], Settings(max_model_len=8192), *args[1:])
    text = compute_capacity(arch, args[0], Settings(max_model_len=8192, language_model_only=True), *args[1:])
    assert full.limiting_stage.weights - text.limiting_stage.weights == pytest.approx(446_571_248 * 2, abs=2)
    assert any("language-model-only" in n for n in text.notes)
    # With the towers loaded, the encoder's pass in the profile run is counted and named (tests/model/
    # test_encoders.py); without them it is not.
    assert any("largest image through the vision tower" in n for n in full.notes)
    assert not any("vision tower:" in n or "multimodal encoder" in n for n in text.notes)


# Qwen2-VL-7B / Qwen2.5-VL-7B shaped configs: text 28 layers of 3,584; their vision_config as published.
QWEN2_VL = {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_size": 3584,
            "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "use_sliding_window": False, "sliding_window": 32768,
            "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                              "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}}
QWEN25_VL = {**QWEN2_VL, "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
             "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                               "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                               "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}}


def test_qwen2_vl_vision_tower_by_hand():
    # Qwen2VisionTransformer (models/qwen2_vl.py@0.32.0), embed_dim h = 1,280, MLP 4 h = 5,120, out 3,584:
    #   patch 3 x 2 x 14 x 14 x 1,280 = 1,505,280
    #   block: 2 LayerNorms 5,120 + qkv 4,919,040 + proj 1,639,680 + fc1 6,558,720 + fc2 6,554,880 = 19,677,440
    #   32 blocks = 629,678,080; merger: LayerNorm 2,560 + 5,120^2 + 5,120 + 5,120 x 3,584 + 3,584 = 44,575,744
    #   total 675,759,104 (transformers' Qwen2VLForConditionalGeneration on the meta device: the same)
    arch = parse_architecture(QWEN2_VL)
    assert arch.params.towers == 675_759_104
    assert arch.layout_source == "kvplan rules" and len(arch.layers) == 28


def test_qwen25_vl_vision_tower_by_hand():
    # Qwen2_5_VisionTransformer (models/qwen2_5_vl.py@0.32.0), h = 1,280, gated MLP of 3,420, out 3,584:
    #   block: 2 RMSNorms 2,560 + qkv 4,919,040 + proj 1,639,680 + gate/up/down 13,132,800 + their biases
    #   2 x 3,420 + 1,280 = 8,120 -> 19,702,200; 32 blocks = 630,470,400
    #   merger: RMSNorm 1,280 + 26,219,520 + 18,353,664 = 44,574,464; patch 1,505,280
    #   total 676,550,144 (transformers' Qwen2_5_VLForConditionalGeneration on the meta device: the same)
    arch = parse_architecture(QWEN25_VL)
    assert arch.params.towers == 676_550_144
    assert arch.layout_source == "kvplan rules" and len(arch.layers) == 28


def test_mtp_layers_are_not_counted():
    # Qwen3.5 keeps its MTP block under `mtp.`; DeepSeek/GLM as layers past num_hidden_layers.
    tensors = [
        ("model.language_model.layers.0.mlp.down_proj.weight", (0, 100)),
        ("mtp.layers.0.mlp.down_proj.weight", (100, 160)),
        ("mtp.fc.weight", (160, 170)),
        ("model.layers.61.mlp.down_proj.weight", (170, 200)),
        ("model.visual.blocks.0.attn.qkv.weight", (200, 240)),
    ]
    got = sum_tensors(tensors, num_hidden_layers=61)
    assert (got.loaded_bytes, got.skipped_bytes, got.tower_bytes) == (140, 100, 40)


def test_mtp_note_for_qwen35_field_name():
    arch = arch_of("Qwen/Qwen3.5-27B")
    assert any("MTP" in n for n in arch.notes)


@pytest.mark.parametrize("bad", [{"patch_size": -14}, {"patch_size": "14"}, {"in_chans": True}, {"depth": 1e9}])
def test_a_vision_config_without_usable_sizes_is_named_not_guessed(bad):
    config = {**QWEN25_VL, "vision_config": {**QWEN25_VL["vision_config"], **bad}}
    arch = parse_architecture(config)
    assert arch.params.towers == 0
    assert any("vision tower of qwen2_5_vl not counted" in n for n in arch.notes)


def test_moonvit_sizes_are_read_from_their_vt_keys():
    # Kimi-K2.5's vision_config names its sizes vt_hidden_size 1,152, vt_num_hidden_layers 27,
    # vt_intermediate_size 4,304: estimated as a generic ViT (it used to be left out without a word).
    arch = parse_architecture(load_bundled("moonshotai/Kimi-K2.5").config)
    assert arch.params.towers > 27 * (4 * 1152 * 1152 + 2 * 1152 * 4304)
    assert any(n.startswith("vision tower (~0.42B parameters, estimated)") for n in arch.notes)


def test_qwen_next_attention_output_gate_doubles_q_proj():
    # Qwen3NextAttention (models/qwen3_next.py@0.32.0, used by Qwen3.5 / 3.6): qkv_proj has
    # total_num_heads * (1 + attn_output_gate) query heads. Qwen3.5-9B: hidden 4,096, 16 heads x 256,
    # 4 KV heads, 8 full-attention layers:
    #   gated: 8 x 4,096 x ((32 + 16) x 256 + 2 x 4 x 256) = 469,762,048 (q 2 x 4,096 wide, o, k, v)
    #   without the gate: 8 x 4,096 x (32 x 256 + 2,048) = 335,544,320
    config = load_bundled("Qwen/Qwen3.5-9B").config
    assert parse_architecture(config).params.attention == 469_762_048
    assert parse_architecture(config, overrides={"attn_output_gate": False}).params.attention == 335_544_320


def test_kimi_k25_keeps_shared_experts_dense_mlp_and_attention_in_bf16():
    # moonshotai/Kimi-K2.5: int4 groups of 32, symmetric ("symmetric": true), targets "Linear"; the ignore list names
    # self_attn, shared_experts and ``mlp.(gate|up|gate_up|down)_proj`` (the dense first layer), so only the routed
    # experts are 4-bit. Symmetric compressed-tensors groups keep no zero point (vLLM registers ``weight_zero_point``
    # only ``if not self.symmetric``): 0.5 B of value + a bf16 scale per 32 = 0.5625 B a weight.
    arch = arch_of("moonshotai/Kimi-K2.5")
    prices = dict(arch.quantization.role_bytes)
    assert prices == {"attention": 2.0, "experts": 0.5625, "shared_experts": 2.0, "mlp": 2.0}
    # 60 MoE layers (61 less first_k_dense_replace 1) x 384 experts x (gate + up + down) 3 x 7,168 x 2,048.
    routed = 60 * 384 * 3 * 7168 * 2048
    assert arch.params.experts == routed
    shared = 60 * 1 * 3 * 7168 * 2048  # n_shared_experts 1, of moe_intermediate_size
    assert arch.params.shared_experts == shared
    total = weight_bytes(arch.params, arch.model_dtype_bytes, arch.quantization)
    others = arch.params.total - routed  # everything else, in bf16 (lm_head is ignored too)
    assert total == int(routed * 0.5625 + others * 2)
    # The routed experts alone: 1,014,686,023,680 x 0.5625 = 570,760,888,320 B; pricing them at 2 B (the ignore
    # list's shared_experts read as every expert) had made the whole checkpoint 1.87 TiB.
    assert routed * 0.5625 == 570_760_888_320 and total < 1.2 * 570_760_888_320


def test_asymmetric_compressed_tensors_int4_keeps_zero_points():
    cfg = dict(load_bundled("meta-llama/Llama-3.1-8B").config)
    group = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128, "symmetric": False}}
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group},
                                  "ignore": ["lm_head"]}
    # 0.5 B value + bf16 scale 2/128 + a packed 4-bit zero point per 128 (0.5/128).
    assert parse_architecture(cfg).quantization.bytes_per_param == 0.5 + 2 / 128 + 0.5 / 128
    group["weights"]["symmetric"] = True
    assert parse_architecture(cfg).quantization.bytes_per_param == 0.5 + 2 / 128


def test_an_ignored_router_is_not_the_dense_mlp():
    # llm-compressor MoE checkpoints ignore the router, ``re:.*mlp.gate$`` (a few weights a layer). It must not take
    # the dense MLPs of DeepSeek-style first layers out of the quantized set, as an ignored ``mlp.(gate|up|down)_proj``
    # does (moonshotai/Kimi-K2.5).
    cfg = dict(load_bundled("moonshotai/Kimi-K2.5").config["text_config"])
    qc = dict(cfg["quantization_config"])
    qc["ignore"] = ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"]
    cfg["quantization_config"] = qc
    prices = dict(parse_architecture(cfg).quantization.role_bytes)
    assert prices["mlp"] == prices["experts"] == prices["shared_experts"] == 0.5625
    assert prices["attention"] == 2.0
