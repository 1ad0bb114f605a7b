"""The profile run's multimodal encoder pass (kvplan/model/encoders.py). Expected bytes are hand
arithmetic from the bundled configs and the tensors vLLM's Qwen3-VL vision forward keeps alive
(models/qwen3_vl.py, models/qwen2_5_vl.py@0.24.0; see docs/vllm-accounting.md)."""

import pytest

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import find_device
from kvplan.model.arch import parse_architecture
from kvplan.model.encoders import _most_features_tokens
from kvplan.model.source import load_bundled
from kvplan.plan.capacity import compute_capacity
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.vllm.args import engine_args
from kvplan.vllm.rules import rules_for


def qwen36():
    return parse_architecture(load_bundled("nvidia/Qwen3.6-35B-A3B-NVFP4").config)


def test_largest_image_of_the_qwen36_processor_by_hand():
    # 4096 x 4096 pixels over 32 x 32-pixel merged tokens (patch 16, merge 2): 16,384 tokens = 128 x 128,
    # 4 patches each: 65,536 patches.
    enc = qwen36().vision_encoder
    assert (enc.merged_tokens, enc.patches) == (16_384, 65_536)
    assert enc.describe() == "4096x4096 pixels, 16,384 tokens, 65,536 patches"


def test_aspect_ratio_rule_of_get_image_size_with_most_features():
    # 211 tokens is prime: 1 x 211 exceeds the aspect ratio of 200, so vLLM steps down to 210 = 14 x 15.
    assert _most_features_tokens(211 * 32 * 32, 32) == 210
    assert _most_features_tokens(200 * 32 * 32, 32) == 200  # 10 x 20
    assert _most_features_tokens(32 * 32 - 1, 32) == 0  # smaller than one merged token


def test_encoder_peak_of_qwen36_by_hand():
    # Vision config: hidden 1,152, 16 heads (head_dim 72), MLP 4,304, patch 16, temporal 2, out 2,048.
    # Per patch, in bf16 elements:
    #   resident: pixel values 3 x 2 x 16 x 16 = 1,536; position embeddings 1,152; residual 1,152; rotary cos
    #             + sin 72 -> 3,912
    #   attention phase: norm1 1,152 + qkv 3,456 + q/k copy 2,304 + rotated 2,304 + output 1,152 = 10,368
    #   MLP phase: norm2 1,152 + fc1 4,304 + activation 4,304 = 9,760 (smaller)
    # 65,536 x (3,912 + 10,368) x 2 B = 1,871,708,160 B
    enc = qwen36().vision_encoder
    assert enc.peak_bytes(2) == 1_871_708_160
    # TP 2 splits heads and MLP: attention 1,152 + 4,608 = 5,760; MLP 1,152 + 4,304 = 5,456.
    # 65,536 x (3,912 + 5,760) x 2 = 1,267,728,384
    assert enc.peak_bytes(2, tp=2) == 1_267_728_384
    # Left allocated for the text dummy run: the pixel values 65,536 x 1,536 x 2 = 201,326,592 and the
    # encoder output 16,384 x 2,048 x 2 = 67,108,864.
    assert enc.retained_bytes(2) == 268_435_456


def test_deepstack_outputs_are_held_and_concatenated():
    # A Qwen3-VL-8B-shaped tower: three deepstack mergers, each adding 16,384 x 4,096 bf16 rows.
    config = {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096, "intermediate_size": 12288,
                        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "head_dim": 128, "vocab_size": 151936},
        "vision_config": {"model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                          "num_heads": 16, "in_channels": 3, "out_hidden_size": 4096, "patch_size": 16,
                          "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
                          "deepstack_visual_indexes": [8, 16, 24]},
    }
    enc = parse_architecture(config).vision_encoder
    # 1,871,708,160 (as Qwen3.6: same tower) + 3 x 16,384 x 4,096 x 2 = 402,653,184
    assert enc.peak_bytes(2) == 1_871_708_160 + 402_653_184
    # pixels 201,326,592 + output 16,384 x (4 x 4,096) x 2 = 536,870,912
    assert enc.retained_bytes(2) == 201_326_592 + 536_870_912


def _activation(arch, **settings):
    cap = compute_capacity(arch, find_device("RTX 5090"), Settings(max_model_len=131072, **settings),
                           rules_for("0.24.0"), load_overhead())
    return cap, cap.limiting_stage.activation


def test_the_encoder_pass_sets_the_activation_when_it_peaks_higher():
    # kv044's settings: max_num_seqs 1, MNBT 8,192. The text run's own peak is the MoE forward
    # (8,192 x (3 x 4,608 + 3 x 2,048) x 2 = 327,155,712 B), below the encoder's 1,871,708,160 B.
    arch = qwen36()
    cap, act = _activation(arch, max_num_seqs=1, max_num_batched_tokens=8192)
    assert act.bytes == act.low == act.high == 1_871_708_160
    assert any("largest image through the vision tower" in n and "1.74 GiB" in n for n in cap.notes)
    _, text_only = _activation(arch, max_num_seqs=1, max_num_batched_tokens=8192, language_model_only=True)
    assert text_only.bytes == 327_155_712
    _, skipped = _activation(arch, max_num_seqs=1, max_num_batched_tokens=8192, skip_mm_profiling=True)
    assert skipped.bytes == 327_155_712
    # A 1024 x 1024 largest image: 1,024 tokens, 4,096 patches; its peak 4,096 x 14,280 x 2 = 116,981,760 B
    # falls below the text run, which then runs on top of what the encoder left: pixels 4,096 x 1,536 x 2
    # = 12,582,912 and outputs 1,024 x 2,048 x 2 = 4,194,304.
    cap, small = _activation(arch, max_num_seqs=1, max_num_batched_tokens=8192, mm_max_pixels=1024 * 1024)
    assert small.bytes == 327_155_712 + 12_582_912 + 4_194_304
    assert "--mm-processor-kwargs" in engine_args(cap.settings).flags()


def test_the_v0_engine_and_unread_towers_are_named_not_counted():
    arch = qwen36()
    cap = compute_capacity(arch, find_device("RTX 5090"), Settings(max_model_len=8192), rules_for("0.7.0"),
                           load_overhead())
    assert cap.arch.vision_encoder is None
    assert any("a peak kvplan does not count" in n for n in cap.notes)
    gemma = parse_architecture(load_bundled("google/gemma-4-31B-it").config)
    assert gemma.params.towers and gemma.vision_encoder is None
    cap = compute_capacity(gemma, find_device("H100 SXM"), Settings(max_model_len=8192, mm_max_pixels=1 << 20),
                           rules_for("0.32.0"), load_overhead())
    assert any("--mm-max-pixels: no effect" in n for n in cap.notes)


def test_mm_max_pixels_is_checked():
    with pytest.raises(KvplanError, match="mm_max_pixels"):
        Settings(mm_max_pixels=0)
    with pytest.raises(KvplanError, match="at most"):
        Settings(mm_max_pixels=1 << 40)
