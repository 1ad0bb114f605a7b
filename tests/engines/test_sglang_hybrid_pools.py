"""SGLang's hybrid pools sized from the GPU (kvplan/sglang/hybrid.py): the sliding-window pool's split by release and
DeepSeek-V3.2's NSA pool, worked by hand from the bundled configs and SGLang's source (the formulas are quoted in
kvplan/sglang/hybrid.py and docs/engines-sglang-rules.md), and the bad input refused in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvplan.deploy import load_model, select_gpus
from kvplan.engines import EngineOptions, engine_named
from kvplan.errors import KvplanError
from kvplan.plan.schema import Settings
from kvplan.sglang.hybrid import swa_split
from kvplan.sglang.pool import default_fraction, size_pool
from kvplan.sglang.rules import rules_for
from kvplan.units import GiB
from kvplan.validate.reports import REPORTS_DIR

# MiMo-V2-Flash at TP 4, bf16 (profiles/models/XiaomiMiMo--MiMo-V2-Flash.json): 9 full-attention layers of 4 KV heads
# -> 1 a GPU, x (head_dim 192 + v_head_dim 128) x 2 B = F = 640 B a layer; 39 sliding-window layers of 8 KV heads -> 2,
# S = 2 x 320 x 2 = 1,280 B a layer.
F, NF, S, NS = 640, 9, 1_280, 39
# sg010's run (main of 2026-01-31, before sglang PR #18039) printed full_layer_tokens=375360, swa_layer_tokens=300288
# at page 64. Under 0.5.8's rule the budget is divided by 640 x 48 + 1,280 x 39 = 80,640 B (every layer at the full
# shape, plus the SWA layers again: the over-count), so a budget of 314,368 x 80,640 = 25,350,635,520 B gives M = 314,368
# tokens, full = int(314,368 x 48 / (0.8 x 39 + 9)) = int(375,364.78) = 375,364 -> 375,360, swa = int(375,364 x 0.8) =
# 300,291 -> 300,288: the printed split.
SG010_BUDGET = 314_368 * 80_640


@pytest.mark.parametrize("sizing, architecture, budget, expected", [
    ("0.5.8", "MiMoV2FlashForCausalLM", SG010_BUDGET, (375_360, 300_288)),
    # gpt-oss has no over-count: cell 640 x 48 = 30,720; M = 825,216; full = int(825,216 x 48 / 40.2) = 985,332
    # -> 985,280; swa = int(985,332 x 0.8) = 788,265 -> 788,224
    ("0.5.8", "GptOssForCausalLM", SG010_BUDGET, (985_280, 788_224)),
    # 0.5.9: cell 640 x 9 + 1,280 x 39 = 55,680; M = 25,350,635,520 // 55,680 = 455,291 -> 455,232; full =
    # int(455,232 x 55,680 / (5,760 + 0.8 x 49,920 = 45,696)) = 554,694 -> 554,688; swa = int(554,694 x 0.8) = 443,755
    # -> 443,712
    ("0.5.9", "MiMoV2FlashForCausalLM", SG010_BUDGET, (554_688, 443_712)),
    # 0.5.11 on: 25,350,635,520 // 45,696 = 554,767 -> 554,752; swa = int(554,752 x 0.8) = 443,801 -> 443,776
    ("0.5.11", "MiMoV2FlashForCausalLM", SG010_BUDGET, (554_752, 443_776)),
    # 0.5.9 and 0.5.10 part where the full count's page rounding crosses one of the SWA count's: 25,361,785,472 B //
    # 55,680 = 455,492 -> 455,488; full = int(455,488 x 55,680 / 45,696) = 555,006 -> 554,944; 0.5.9: int(555,006 x
    # 0.8) = 444,004 -> 443,968; 0.5.10: int(554,944 x 0.8) = 443,955 -> 443,904
    ("0.5.9", "MiMoV2FlashForCausalLM", 25_361_785_472, (554_944, 443_968)),
    ("0.5.10", "MiMoV2FlashForCausalLM", 25_361_785_472, (554_944, 443_904)),
])
def test_the_sliding_window_split_by_release(sizing, architecture, budget, expected):
    split = swa_split(budget, F, NF, S, NS, 0.8, 64, sizing, architecture)
    assert (split.full_tokens, split.swa_tokens) == expected


def test_the_split_under_max_total_tokens_and_bad_ratios():
    # 0.5.11 caps the full count (calculate_pool_sizes_from_max_tokens): 100,000 -> 99,968; int(99,968 x 0.8) = 79,974
    # -> 79,936
    split = swa_split(SG010_BUDGET, F, NF, S, NS, 0.8, 64, "0.5.11", "MiMoV2FlashForCausalLM", max_total_tokens=100_000)
    assert (split.full_tokens, split.swa_tokens) == (99_968, 79_936)
    for ratio in (0, 1.5, -0.1):
        with pytest.raises(KvplanError, match="swa-full-tokens-ratio"):
            swa_split(SG010_BUDGET, F, NF, S, NS, ratio, 64, "0.5.11", "MiMoV2FlashForCausalLM")


def _mimo(version: str, **kw):
    model = load_model("XiaomiMiMo/MiMo-V2-Flash", source="bundled")
    return size_pool(model.arch, select_gpus("H200").device, Settings(tensor_parallel_size=4), rules_for(version),
                     70 * GiB, mem_fraction_static=0.7, page_size=64, **kw)


def test_mimo_s_two_pools_from_the_gpu():
    """The budget is the plain pool's, P x 0.7 - 70 GiB (P: the H200's CUDA total less 0.75 GiB), then 0.5.8's split;
    the two pool lines SGLang prints are (tokens + 1 page) x each pool's K and V bytes."""
    pool = _mimo("0.5.8")
    p = select_gpus("H200").device.cuda_total_bytes - 0.75 * GiB
    budget = int(p * 0.7 - 70 * GiB)
    m = budget // 80_640 // 64 * 64
    full = int(m * 48 / (0.8 * 39 + 9))
    assert (pool.tokens, pool.swa_tokens) == (full // 64 * 64, int(full * 0.8) // 64 * 64)
    lines = pool.startup_lines()
    assert lines[0] == f"Use sliding window memory pool. full_layer_tokens={pool.tokens}, swa_layer_tokens={pool.swa_tokens}"
    # the SWA pool first (SWAKVPool): K = 2 heads x 192 x 39 layers x 2 B = 29,952 B, V = 2 x 128 x 39 x 2 = 19,968 B
    rows = pool.swa_tokens + 64
    assert lines[1] == (f"KV Cache is allocated. #tokens: {pool.swa_tokens}, K size: {rows * 29_952 / GiB:.2f} GB, "
                        f"V size: {rows * 19_968 / GiB:.2f} GB")
    # then the full pool: K = 1 x 192 x 9 x 2 = 3,456 B, V = 1 x 128 x 9 x 2 = 2,304 B
    rows = pool.tokens + 64
    assert lines[2] == (f"KV Cache is allocated. #tokens: {pool.tokens}, K size: {rows * 3_456 / GiB:.2f} GB, "
                        f"V size: {rows * 2_304 / GiB:.2f} GB")
    assert pool.pool_bytes() == {"full": rows * 5_760, "swa": (pool.swa_tokens + 64) * 49_920}
    # 0.5.11 divides the same budget by 5,760 + 0.8 x 49,920 = 45,696 B: PR #18039's fix gives more tokens
    fixed = _mimo("0.5.11")
    assert fixed.tokens == int(budget // 45_696) // 64 * 64 > pool.tokens
    # the ratio given: 0.5 -> cell 5,760 + 0.5 x 49,920 = 30,720 B
    half = _mimo("0.5.11", swa_full_tokens_ratio=0.5)
    assert (half.tokens, half.swa_tokens) == (budget // 30_720 // 64 * 64, int(budget // 30_720 // 64 * 64 * 0.5) // 64 * 64)


def _v32(version: str, gpu: str = "B200", weights: float = 90 * GiB, **kw):
    model = load_model("deepseek-ai/DeepSeek-V3.2", source="bundled")
    return size_pool(model.arch, select_gpus(gpu).device, Settings(tensor_parallel_size=8), rules_for(version),
                     weights, mla_ranks=(512, 64), **kw)


def test_the_nsa_pool_from_the_gpu():
    """DeepSeek-V3.2 (61 MLA layers, kv_lora_rank 512, rope 64, index_head_dim 128) on a B200 (FP8 forced on
    Blackwell, page 64). 0.5.3 divides the budget by (512 + 64) x 61 x 1 B = 35,136 B and sets mem_fraction_static 0.8
    over the one given; its buffers hold 656 B a layer (512 + 4 scales x 4 + 64 x 2): 40,016 B a token."""
    p = select_gpus("B200").device.cuda_total_bytes - 0.75 * GiB
    pool = _v32("0.5.3", mem_fraction_static=0.9)
    assert pool.mem_fraction_static == 0.8 and "over the 0.9 given" in pool.fraction_how
    assert (pool.cell_bytes, pool.buffer_bytes_per_token, pool.page_size) == (35_136, 40_016, 64)
    assert pool.tokens == int(p * 0.8 - 90 * GiB) // 35_136 // 64 * 64
    assert pool.startup_lines()[0] == (f"KV Cache is allocated. #tokens: {pool.tokens}, "
                                       f"KV size: {(pool.tokens + 64) * 40_016 / GiB:.2f} GB")
    # 0.5.3.post1: the indexer's keys, 128 + 4 = 132 B a layer, in both: 35,136 + 61 x 132 = 43,188 and 48,068 B; the
    # fraction is SGLang's default for a 183,359 MiB card at TP 8: 1 - (512 + 16,384 x 1.5 + 512 x 2 + 1,024) MiB /
    # 183,359 = 0.852; with --enable-dp-attention --dp-size 8 given, + 512 x 8 x (3 + 1.5) = 18,432 MiB: 0.751
    post1 = _v32("0.5.3.post1")
    assert (post1.cell_bytes, post1.buffer_bytes_per_token, post1.mem_fraction_static) == (43_188, 48_068, 0.852)
    assert post1.tokens == int(p * 0.852 - 90 * GiB) // 43_188 // 64 * 64
    assert _v32("0.5.3.post1", dp_attention_size=8).mem_fraction_static == 0.751
    # 0.5.4 on an H200 (not Blackwell): "auto" is bf16, (512 + 64) x 61 x 2 + 61 x 132 = 78,324 B
    assert _v32("0.5.4", gpu="H200", weights=80 * GiB).cell_bytes == 78_324
    with pytest.raises(KvplanError, match="0.5.3 to 0.5.10 only"):
        _v32("0.5.11", dp_attention_size=8)


def test_dp_attention_keeps_the_attention_weights_whole():
    """Llama-3.1-8B at TP 2 with --enable-dp-attention (attention TP 1): its attention, 32 x (4,096 x 4,096 x 2 + 4,096
    x 1,024 x 2) = 1,342,177,280 params, its embedding, 128,256 x 4,096 = 525,336,576, and its norms, (2 x 32 + 1) x
    4,096 = 266,240 (RMSNorm: no TP splits them), at 2 B, are whole on each GPU: 3,735,560,192 B, of which TP 2 already
    counts half, so 1,867,780,096 B more a GPU; the KV heads are not split:
    8 x 128 x 2 x 32 x 2 B = 131,072 B a token. SGLang's default fraction on an H100 (81,559 MiB) at TP 2 (0.5.23):
    1 - (512 + 8,192 x 1.5 + 256 x 2 + 256 + 58 x 8) MiB / 81,559 = 0.828; with DP attention, + 256 x 2 x 3 = 0.809."""
    model = load_model("meta-llama/Llama-3.1-8B", source="bundled")
    sglang = engine_named("sglang")

    def size(**kw):
        return sglang.size(model, select_gpus("2xH100"), Settings(tensor_parallel_size=2), "0.5.23", EngineOptions(**kw))

    plain, dp = size(), size(enable_dp_attention=True)
    weights = {p: next(t.bytes for t in p.memory_terms if t.name == "weights") for p in (plain, dp)}
    assert weights[dp] - weights[plain] == 1_867_780_096
    assert (plain.kv_bytes_per_token_per_gpu, dp.kv_bytes_per_token_per_gpu) == (65_536, 131_072)
    assert (plain.engine_flags["--mem-fraction-static"], dp.engine_flags["--mem-fraction-static"]) == ("0.828", "0.809")
    assert dp.launch_command.endswith("--enable-dp-attention --dp-size 2")
    assert default_fraction(rules_for("0.5.23"), 81_559, 2, False, True, 2)[0] == 0.809


def test_nsa_weights_on_each_gpu_by_hand():
    """DeepSeek-V3.2-Exp on 8 x B200 (sg008 / sg009's deployment; NSA forces DP attention: attention TP 1), FP8 in
    128 x 128 blocks (1 + 4 / 16,384 B a parameter). Whole on each GPU: MLA, 61 x (7,168 x 1,536 + 1,536 x 128 x 192 +
    7,168 x 576 + 512 x 128 x 256 + 128 x 128 x 7,168) = 61 x 187,105,280, and the indexer's wq_b and wk, 61 x (1,536 x
    64 x 128 + 7,168 x 128) = 61 x 13,500,416: 12,236,947,456 FP8 params; the embedding 129,280 x 7,168 = 926,679,040
    and the bf16 rest: norms 61 x 2 x 7,168 + 7,168, routers 58 x 256 x 7,168, the indexer's weights_proj and k_norm
    61 x (7,168 x 64 + 256), i.e. 135,451,392 (kvplan leaves out the q_a / kv_a norms and the routers' biases,
    139,776 params). Split 8 ways: routed experts 58 x 256 x 3 x 7,168 x 2,048 = 653,908,770,816, shared 58 x 3 x 7,168
    x 2,048 = 2,554,331,136, dense 3 x 3 x 7,168 x 18,432 = 1,189,085,184 (FP8) and lm_head 926,679,040 (bf16).
    (657,652,187,136 x (1 + 2^-12) + 926,679,040 x 2) / 8 + 12,236,947,456 x (1 + 2^-12) + (926,679,040 + 135,451,392)
    x 2 = 96,822,458,960 B. Then w_kc / w_vc in bf16 (post_load_weights, models/deepseek_v2.py@0.5.3): 61 x 128 heads
    x (128 + 128) x 512 x 2 B = 2,046,820,352 B."""
    model = load_model("deepseek-ai/DeepSeek-V3.2-Exp", source="bundled")
    pool = engine_named("sglang").size(model, select_gpus("8xB200"), Settings(tensor_parallel_size=8), "0.5.3",
                                       EngineOptions())
    terms = {t.name: t.bytes for t in pool.memory_terms}
    assert abs(terms["weights"] - 96_822_458_960) <= 139_776 * 2  # the norms and biases kvplan leaves out
    assert terms["MLA's w_kc / w_vc"] == 2_046_820_352
    # 0.5.3: 0.8 of P = the B200's CUDA total less 0.75 GiB; the budget divided by 61 x 576 = 35,136 B, pages of 64
    p = select_gpus("B200").device.cuda_total_bytes - 0.75 * GiB
    rest = p * 0.8 - terms["weights"] - 2_046_820_352
    assert pool.pool_tokens == int(rest) // 35_136 // 64 * 64


def test_absorbed_kv_b_copies_by_quantization():
    """w_kc / w_vc: kv_b_proj's heads x (qk_nope + v) x kv_lora_rank a layer, for the heads of the attention rank.
    DeepSeek-V3 at TP 8 without DP attention: 61 x 128 / 8 x 256 x 512 x 2 B (bf16 from 128 x 128 FP8 blocks) =
    255,852,544 B; FP8 in other blocks is requantized per tensor, 1 B: 127,926,272; another architecture: none."""
    from kvplan.sglang.weights import absorbed_kv_b_bytes

    v3 = dict(load_model("deepseek-ai/DeepSeek-V3", source="bundled").config.config)
    assert absorbed_kv_b_bytes(v3, 8) == 255_852_544
    assert absorbed_kv_b_bytes(v3 | {"quantization_config": {"quant_method": "fp8"}}, 8) == 127_926_272
    assert absorbed_kv_b_bytes(v3 | {"quantization_config": None}, 1) == 2_046_820_352
    assert absorbed_kv_b_bytes(v3 | {"architectures": ["MiniCPM3ForCausalLM"]}, 1) == 0
    assert absorbed_kv_b_bytes({"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": None}, 1) == 0


def test_size_engine_sglang_prints_each_pool():
    from helpers.harness import invoke

    r = invoke("size", "XiaomiMiMo/MiMo-V2-Flash", "--gpu", "4xH200", "--engine", "sglang", "--engine-version", "0.5.11",
               "--mem-fraction-static", "0.7", "--page-size", "64", "--swa-full-tokens-ratio", "0.5", "--json")
    assert r.code == 0
    pool = json.loads(r.stdout)["engines"][0]
    split = pool["pool_split"]
    assert set(split) == {"full_layer_tokens", "swa_layer_tokens"} and pool["pool_tokens"] == split["full_layer_tokens"]
    assert split["swa_layer_tokens"] == int(split["full_layer_tokens"] * 0.5) // 64 * 64  # align(int(full x r))
    assert pool["engine_flags"]["--swa-full-tokens-ratio"] == "0.5"
    assert "--swa-full-tokens-ratio 0.5" in pool["launch_command"]
    text = invoke("size", "XiaomiMiMo/MiMo-V2-Flash", "--gpu", "4xH200", "--engine", "sglang",
                  "--engine-version", "0.5.8", env={"COLUMNS": "200"})
    assert text.code == 0 and "pools: full_layer_tokens " in text.stdout and "Use sliding window memory pool." in text.stdout


@pytest.mark.parametrize("model, argv, what", [
    ("XiaomiMiMo/MiMo-V2-Flash", ("--engine", "vllm", "--swa-full-tokens-ratio", "0.5"), "not a vLLM flag"),
    ("XiaomiMiMo/MiMo-V2-Flash", ("--engine", "trtllm", "--enable-dp-attention"), "not a TensorRT-LLM flag"),
    ("XiaomiMiMo/MiMo-V2-Flash", ("--engine", "sglang", "--engine-version", "0.5.7", "--page-size", "64"),
     "page size 1 only"),
    ("XiaomiMiMo/MiMo-V2-Flash", ("--engine", "sglang", "--engine-version", "0.4.5"), "0.4.5"),
    ("deepseek-ai/DeepSeek-V3.2", ("--engine", "sglang", "--engine-version", "0.5.6"), "no longer sets --dp-size"),
    ("XiaomiMiMo/MiMo-V2-Flash", ("--engine", "sglang", "--engine-version", "0.9.1"), "0.9.1"),
    ("XiaomiMiMo/MiMo-V2-Flash", ("--engine", "sglang", "--swa-full-tokens-ratio", "1.5"), "swa-full-tokens-ratio"),
    ("meta-llama/Llama-3.1-8B", ("--engine", "sglang", "--swa-full-tokens-ratio", "0.5"), "sliding-window layers"),
    # Gemma 3 takes full pages from 0.5.1 (no hybrid pool): its ratio has nothing to split there.
    ("google/gemma-3-4b-it", ("--engine", "sglang", "--engine-version", "0.5.2", "--swa-full-tokens-ratio", "0.5"),
     "sliding-window layers"),
    ("deepseek-ai/DeepSeek-V3.2", ("--engine", "sglang"), "0.5.3 to 0.5.10 only"),
    ("deepseek-ai/DeepSeek-V3.2", ("--engine", "sglang", "--engine-version", "0.5.11", "--enable-dp-attention"),
     "0.5.3 to 0.5.10 only, not 0.5.11"),
    ("deepseek-ai/DeepSeek-V3.2", ("--engine", "sglang", "--engine-version", "0.5.10"), "no longer sets --dp-size"),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", ("--engine", "sglang"), "max_mamba_cache_size"),
    # the first release not read: 0.5.16 sizes the pool in mem_cache/kv_cache_configurator.py
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", ("--engine", "sglang", "--engine-version", "0.5.16"), "kv_cache_configurator"),
    ("Qwen/Qwen3.5-9B", ("--engine", "sglang", "--engine-version", "0.5.16", "--language-model-only"), "0.5.9-0.5.15"),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", ("--engine", "sglang", "--engine-version", "0.5.15", "--gpu", "4xMI300X"),
     "extra_buffer needs CUDA"),
    # Qwen3.5 is not in hybrid_gdn_config before 0.5.9 (model_runner.py@0.5.8.post1)
    ("Qwen/Qwen3.5-9B", ("--engine", "sglang", "--engine-version", "0.5.8", "--language-model-only"),
     "Qwen3_5ForConditionalGeneration in SGLang 0.5.8"),
    ("nvidia/Nemotron-H-56B-Base-8K", ("--engine", "sglang"), "mamba_full_memory_ratio"),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", ("--engine", "sglang", "--engine-version", "0.5.6",
                                          "--mamba-full-memory-ratio", "inf"), "invalid --mamba-full-memory-ratio"),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", ("--engine", "sglang", "--engine-version", "0.5.6",
                                          "--mamba-full-memory-ratio", "nan"), "invalid --mamba-full-memory-ratio"),
])
def test_bad_input_is_one_line(model, argv, what):
    from helpers.harness import invoke

    r = invoke("size", model, "--gpu", "4xH200", *argv)
    assert r.code == 2 and what in r.one_line_error(), (argv, r.stderr)


def _qwen3_next(version: str, **kw):
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking", source="bundled")
    return size_pool(model.arch, select_gpus("H100").device, Settings(tensor_parallel_size=4), rules_for(version),
                     37 * GiB, mem_fraction_static=0.85, **kw)


def test_the_mamba_state_pool_from_the_gpu():
    """Qwen3-Next-80B-A3B at TP 4 (profiles/models: 48 layers, every 4th full attention; GDN of 32 value heads and 16
    key heads of 128, conv kernel 4; full attention 2 KV heads of 256). SGLang's state a request on one GPU
    (``Mamba2StateShape.create``, configs/qwen3_next.py@0.5.6.post2): conv (128 x 32 + 2 x 16 x 128 = 8,192) / 4 x 3
    x 2 B (bf16) = 12,288 B, temporal 32 / 4 x 128 x 128 x 4 B (float32) = 524,288 B, x 36 GDN layers = 19,316,736 B.
    The KV cell counts the 12 full-attention layers only: 1 KV head (2 / 4, replicated) x 256 x 2 x 2 B x 12 =
    12,288 B. `handle_max_mamba_cache` (model_runner.py@0.5.6.post2): slots = int(rest x 0.9 / 1.9 x 2^30 //
    19,316,736), the KV pool gets rest - slots x 19,316,736 B; running requests at most slots // 3."""
    pool = _qwen3_next("0.5.6")
    p = select_gpus("H100").device.cuda_total_bytes - 0.75 * GiB
    rest_gib = (p * 0.85 - 37 * GiB) / 2**30
    slots = int((rest_gib * 0.9 / (1 + 0.9) * 2**30) // 19_316_736)
    kv = (rest_gib - slots * 19_316_736 / 2**30) * 2**30
    assert pool.mamba_slots == slots and sum(pool.mamba_state_bytes) == 19_316_736
    assert (pool.cell_bytes, pool.tokens) == (12_288, int(kv) // 12_288)
    assert pool.max_running_requests == min(4096, pool.tokens // 2, slots // 3) == slots // 3
    assert pool.startup_lines()[0].startswith(f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, ")
    # the ratio given: 0.5 -> a third of the budget to the state
    assert _qwen3_next("0.5.6", mamba_full_memory_ratio=0.5).mamba_slots == int(
        (rest_gib * 0.5 / 1.5 * 2**30) // 19_316_736)
    assert _qwen3_next("0.5.3.post3").mamba_slots == slots  # the same rule from 0.5.3.post3
    # 0.5.3: --max-mamba-cache-size or 512; 0.5.16 on: not read
    for version in ("0.5.3", "0.5.16", "0.5.23"):
        with pytest.raises(KvplanError, match="0.5.3.post3-0.5.15"):
            _qwen3_next(version)


def test_size_engine_sglang_mamba_flags():
    from helpers.harness import invoke

    r = invoke("size", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpu", "4xH100", "--engine", "sglang",
               "--engine-version", "0.5.6", "--mamba-full-memory-ratio", "0.5", "--json")
    assert r.code == 0
    pool = json.loads(r.stdout)["engines"][0]
    assert set(pool["pool_split"]) == {"max_total_num_tokens", "max_mamba_cache_size"}
    assert pool["engine_flags"]["--mamba-full-memory-ratio"] == "0.5"
    assert "--mamba-full-memory-ratio 0.5" in pool["launch_command"]
    bad = invoke("size", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "sglang",
                 "--mamba-full-memory-ratio", "0.5")
    assert bad.code == 2 and "Mamba / linear-attention hybrid" in bad.one_line_error()
    vllm = invoke("size", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpu", "4xH100", "--mamba-full-memory-ratio", "0.5")
    assert vllm.code == 2 and "not a vLLM flag" in vllm.one_line_error()


def test_check_log_judges_a_hybrid_full_budget_where_it_can():
    """sg010's quote (MiMo-V2-Flash, TP 4, --mem-fraction-static 0.7, --page-size 64): with a GPU and a release the
    two pools are sized and compared; without either, the reason names what is missing."""
    from kvplan.gate.enginelog import judge_sglang

    rows = [json.loads(line) for line in
            (REPORTS_DIR / "sglang-startup-reports.jsonl").read_text().splitlines() if line.strip()]
    quote = next(r for r in rows if r["case_id"] == "sg010")["quote"].replace(" / ", "\n")
    model = load_model("XiaomiMiMo/MiMo-V2-Flash", source="bundled")
    judged = judge_sglang(quote, "sg010", 0.02, "all", None, "4xH200", "0.5.8", None, None, resolved=model)
    full = {c.quantity: c for c in judged.full_budget.comparisons}
    assert (full["full_layer_tokens"].reported, full["swa_layer_tokens"].reported) == (375_360, 300_288)
    assert judged.rules.startswith("SGLang 0.5.8") and judged.full_budget_reason is None
    # the printed pools' buffers: (375,360 + 64) x 5,760 + (300,288 + 64) x 49,920 B = 17,156,014,080 B = 15.98 GiB
    assert full["KV budget GiB per GPU"].reported == 15.98
    none = judge_sglang(quote, "sg010", 0.02, "all", None, None, None, None, None, resolved=model)
    assert none.full_budget is None and none.full_budget_reason.startswith("not judged because it names no GPU and no "
                                                                           "release")
    unread = judge_sglang(quote, "sg010", 0.02, "all", None, "4xH200", "0.6.0", None, None, resolved=model)
    assert unread.full_budget_reason == "not judged because kvplan has not read SGLang 0.6.0's pool code"


@pytest.mark.parametrize("sizing, expected", [
    # 0.4.9-0.5.6 (`set_num_token_hybrid`, model_runner.py@0.4.9.post6 .. @0.5.6.post2): every layer at the full shape,
    # 640 x 48 = 30,720 B; M = 25,350,635,520 // 30,720 = 825,216; full = int(825,216 x 48 / (0.8 x 39 + 9 = 40.2))
    # = int(985,332.54) = 985,332; swa = int(985,332 x 0.8) = int(788,265.6) = 788,265 (page 1: no rounding)
    ("0.4.9", (985_332, 788_265)),
    # 0.5.7 (model_runner_kv_cache_mixin.py@0.5.7): the cell over the full layers plus MiMo's SWA term, 640 x 9 +
    # 1,280 x 39 = 55,680 B; M = 25,350,635,520 // 55,680 = 455,291 (remainder 32,640); full = int(455,291 x 48 /
    # 40.2) = int(543,631.04) = 543,631; swa = int(543,631 x 0.8) = int(434,904.8) = 434,904
    ("0.5.7", (543_631, 434_904)),
])
def test_the_split_before_0_5_8_by_layers_at_page_1(sizing, expected):
    split = swa_split(SG010_BUDGET, F, NF, S, NS, 0.8, 1, sizing, "MiMoV2FlashForCausalLM")
    assert (split.full_tokens, split.swa_tokens) == expected
    # their allocator is SWATokenToKVPoolAllocator only at page 1 (model_runner.py@0.4.9.post6 `init_memory_pool`)
    with pytest.raises(KvplanError, match="page size 1 only"):
        swa_split(SG010_BUDGET, F, NF, S, NS, 0.8, 64, sizing, "MiMoV2FlashForCausalLM")


def _gemma(name: str, version: str, **kw):
    model = load_model(name, source="bundled")
    return size_pool(model.arch, select_gpus("H100").device, Settings(), rules_for(version), 2 * GiB,
                     mem_fraction_static=0.8, **kw)


def test_gemma_s_sliding_window_pool_in_0_4_9_and_0_4_10():
    """gemma-3-1b-it (profiles/models: Gemma3ForCausalLM, 26 layers, every 6th full attention -> 4 full and 22
    sliding-window, 1 KV head of 256): 0.4.9's `ModelRunner` turns the hybrid pool on for a model class with
    ``get_attention_sliding_window_size`` (models/gemma3_causal.py@0.4.9.post6) and 0.4.10 still does; 0.5.1 sets
    --disable-hybrid-swa-memory for every Gemma 3 (server_args.py@0.5.1.post3). The cell is 1 x 256 x 2 (K, V) x 26
    x 2 B = 26,624 B; M = budget // 26,624; full = int(M x 26 / (0.8 x 22 + 4 = 21.6)); swa = int(full x 0.8)."""
    p = select_gpus("H100").device.cuda_total_bytes - 0.75 * GiB
    budget = int(p * 0.8 - 2 * GiB)
    m = budget // 26_624
    full = int(m * 26 / 21.6)
    for version in ("0.4.9", "0.4.10.post2"):
        pool = _gemma("google/gemma-3-1b-it", version)
        assert (pool.kind, pool.tokens, pool.swa_tokens) == ("swa", full, int(full * 0.8))
        # "Use Sliding window memory pool." with a capital S (model_runner.py@0.4.9.post6 .. @0.5.6.post2)
        assert pool.startup_lines()[0] == (f"Use Sliding window memory pool. full_layer_tokens={full}, "
                                           f"swa_layer_tokens={int(full * 0.8)}")
    # the releases either side: no hybrid pool, every layer a full page, the budget over 26,624 B
    for version in ("0.4.8", "0.5.1"):
        pool = _gemma("google/gemma-3-1b-it", version)
        assert (pool.kind, pool.tokens, pool.cell_bytes) == ("kv", m, 26_624)
    # Gemma 2 only in 0.4.9: 0.4.10 disables it (server_args.py@0.4.10.post2). gemma-2-2b-it: 26 layers alternating,
    # 4 KV heads x 256 x 2 x 26 x 2 B = 106,496 B; full = int(M x 26 / (0.8 x 13 + 13 = 23.4))
    m2 = budget // 106_496
    assert _gemma("google/gemma-2-2b-it", "0.4.9").tokens == int(m2 * 26 / 23.4)
    assert (_gemma("google/gemma-2-2b-it", "0.4.10").kind, _gemma("google/gemma-2-2b-it", "0.4.10").tokens) == ("kv", m2)
    with pytest.raises(KvplanError, match="page size 1 only"):
        _gemma("google/gemma-3-1b-it", "0.4.9", page_size=16)
    # Gemma 3n's class has the hook too (models/gemma3n_causal.py@0.4.9.post6), but its shared-KV layers are not
    # sized: refused in 0.4.9-0.4.10 (a Gemma 3n-named copy of gemma-3-1b's layers; no Gemma 3n config is bundled)
    three_n = dataclasses.replace(load_model("google/gemma-3-1b-it", source="bundled").arch,
                                  architectures=("Gemma3nForCausalLM",))
    with pytest.raises(KvplanError, match="Gemma 3n a hybrid sliding-window pool"):
        size_pool(three_n, select_gpus("H100").device, Settings(), rules_for("0.4.10"), 2 * GiB, mem_fraction_static=0.8)


def test_mimo_in_0_5_7_and_gpt_oss_before_0_5_8():
    """0.5.7 gives MiMo-V2-Flash the hybrid pool (`is_hybrid_model`, configs/model_config.py@0.5.7) at page 1, the
    budget over 55,680 B (see test_the_split_before_0_5_8_by_layers_at_page_1); gpt-oss gets none before 0.5.8
    (server_args.py@0.5.1.post3 .. @0.5.7 set --disable-hybrid-swa-memory for it): 24 full pages of 8 x 64 x 2 x 2 B."""
    pool = size_pool(
        load_model("XiaomiMiMo/MiMo-V2-Flash", source="bundled").arch, select_gpus("H200").device,
        Settings(tensor_parallel_size=4), rules_for("0.5.7"), 70 * GiB, mem_fraction_static=0.7)
    p = select_gpus("H200").device.cuda_total_bytes - 0.75 * GiB
    m = int(p * 0.7 - 70 * GiB) // 55_680
    full = int(m * 48 / 40.2)
    assert (pool.kind, pool.tokens, pool.swa_tokens) == ("swa", full, int(full * 0.8))
    assert pool.startup_lines()[0].startswith("Use sliding window memory pool.")
    # the running-request estimate is of M, taken before the split (`init_memory_pool`,
    # model_runner_kv_cache_mixin.py@0.5.7), then capped by full // 2 (model_runner.py `max_running_requests`): at a
    # 131,072-token context int(M / 131,072 x 512), within [2,048, 4,096]
    short = size_pool(load_model("XiaomiMiMo/MiMo-V2-Flash", source="bundled").arch, select_gpus("H200").device,
                      Settings(tensor_parallel_size=4, max_model_len=131_072), rules_for("0.5.7"), 70 * GiB,
                      mem_fraction_static=0.7)
    assert 2048 < int(m / 131_072 * 512) < int(full / 131_072 * 512) < 4096
    assert short.max_running_requests == min(int(m / 131_072 * 512), full // 2)
    for version, kind in (("0.5.7", "kv"), ("0.5.8", "swa")):
        gpt = size_pool(load_model("openai/gpt-oss-20b", source="bundled").arch, select_gpus("H100").device,
                        Settings(), rules_for(version), 13 * GiB, mem_fraction_static=0.8)
        assert gpt.kind == kind
    assert gpt.swa is not None and gpt.cell_bytes == 49_152  # 0.5.8: both pools, 24,576 B each a token
    # ... but not on an SM100 GPU in 0.5.8-0.5.9: gpt-oss gets trtllm_mha there, which sets
    # --disable-hybrid-swa-memory (server_args.py@0.5.8.post1, @0.5.9; gone @0.5.10.post1): one pool of full pages
    for version, kind in (("0.5.8", "kv"), ("0.5.9", "kv"), ("0.5.10", "swa")):
        b200 = size_pool(load_model("openai/gpt-oss-20b", source="bundled").arch, select_gpus("B200").device,
                         Settings(), rules_for(version), 13 * GiB, mem_fraction_static=0.8)
        assert (b200.kind, b200.cell_bytes) == (kind, 49_152), version
        assert ("with trtllm_mha, which turns it off" in b200.how) == (kind == "kv")


def test_nsa_pool_in_0_5_5_to_0_5_8():
    """0.5.5.post3 keeps 0.5.4's NSA rules (model_runner.py `profile_max_num_token`, mem_cache/memory_pool.py
    ``NSATokenToKVPool``, server_args.py's NSA branch): on an H200 "auto" is bf16, (512 + 64) x 61 x 2 + 61 x 132 =
    78,324 B a token; on a B200 FP8, (512 + 64) x 61 x 1 + 61 x 132 = 43,188 B, buffers 61 x (656 + 132) = 48,068 B.
    0.5.6-0.5.8 keep the cell, the buffers and page 64 but leave --dp-size as given: sized where DP attention over the
    TP group is given, refused otherwise."""
    p = select_gpus("H200").device.cuda_total_bytes - 0.75 * GiB
    pool = _v32("0.5.5.post3", gpu="H200", weights=80 * GiB, mem_fraction_static=0.85)
    assert (pool.cell_bytes, pool.page_size, pool.kind) == (78_324, 64, "nsa")
    assert pool.tokens == int(p * 0.85 - 80 * GiB) // 78_324 // 64 * 64
    b200 = _v32("0.5.5", mem_fraction_static=0.85)
    assert (b200.cell_bytes, b200.buffer_bytes_per_token) == (43_188, 48_068)
    # 0.5.8.post1 with --enable-dp-attention --dp-size 8 on a B200: the fraction given, the same 43,188 B and 64
    p_b200 = select_gpus("B200").device.cuda_total_bytes - 0.75 * GiB
    last = _v32("0.5.8.post1", mem_fraction_static=0.85, dp_attention_size=8)
    assert (last.cell_bytes, last.buffer_bytes_per_token, last.page_size) == (43_188, 48_068, 64)
    assert last.tokens == int(p_b200 * 0.85 - 90 * GiB) // 43_188 // 64 * 64
    for version, why in (("0.5.6", "no longer sets --dp-size"), ("0.5.8", "no longer sets --dp-size"),
                         ("0.5.9", "no longer sets --dp-size"), ("0.5.11", r"0.5.3 to 0.5.10 only, not 0.5.11")):
        with pytest.raises(KvplanError, match=why):
            _v32(version)
    with pytest.raises(KvplanError, match="NVIDIA GPUs only"):
        _v32("0.5.8", gpu="MI300X", dp_attention_size=8)
    from helpers.harness import invoke

    # on the command line (0.5.7, 8 x H200, bf16): the same 78,324 B a token in pages of 64 with DP attention given
    r = invoke("size", "deepseek-ai/DeepSeek-V3.2", "--gpu", "8xH200", "--engine", "sglang", "--engine-version", "0.5.7",
               "--enable-dp-attention", "--json")
    sized = json.loads(r.stdout)["engines"][0]
    assert r.code == 0 and (sized["kv_bytes_per_token_per_gpu"], sized["page_tokens"]) == (78_324, 64)
    assert sized["launch_command"].endswith("--enable-dp-attention --dp-size 8")


def test_the_mamba_state_pool_in_0_5_7_and_0_5_8():
    """`handle_max_mamba_cache`'s ratio branch is unchanged in model_runner_kv_cache_mixin.py@0.5.7 and @0.5.8.post1
    (and the state shapes in configs/qwen3_next.py): the slots and the KV pool of test_the_mamba_state_pool_from_the_gpu.
    The running cap divides the slots by 3 + 2 in 0.5.7 (MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP added unless
    extra_buffer and speculative decoding are both on) and by 3 in 0.5.8. Under DP attention (attention TP 1) one
    request's state is whole, (8,192 x 3 x 2 + 32 x 128 x 128 x 4) x 36 = 77,266,944 B; 0.5.6 then divides GDN's slots
    by the DP size, 0.5.7 on do not."""
    p = select_gpus("H100").device.cuda_total_bytes - 0.75 * GiB
    rest_gib = (p * 0.85 - 37 * GiB) / 2**30
    slots = int((rest_gib * 0.9 / 1.9 * 2**30) // 19_316_736)
    kv_tokens = int((rest_gib - slots * 19_316_736 / 2**30) * 2**30) // 12_288
    for version, per_request in (("0.5.7", 5), ("0.5.8.post1", 3)):
        pool = _qwen3_next(version)
        assert (pool.mamba_slots, pool.tokens) == (slots, kv_tokens)
        assert pool.max_running_requests == min(4096, kv_tokens // 2, slots // per_request) == slots // per_request
    whole = int((rest_gib * 0.9 / 1.9 * 2**30) // 77_266_944)
    assert _qwen3_next("0.5.6", dp_attention_size=4).mamba_slots == whole // 4
    assert _qwen3_next("0.5.8", dp_attention_size=4).mamba_slots == whole


def test_swa_ratio_is_taken_where_the_release_gives_gemma_3_the_hybrid_pool():
    # 0.4.9 gives Gemma 3 the hybrid pool by model class (model_runner.py@0.4.9.post6), so its ratio is SGLang's flag
    # there; the ratio splits the full-layer count: swa_layer_tokens = int(full x 0.5).
    from helpers.harness import invoke

    r = invoke("size", "google/gemma-3-4b-it", "--gpu", "H100", "--engine", "sglang", "--engine-version", "0.4.9.post6",
               "--swa-full-tokens-ratio", "0.5", "--json")
    assert r.code == 0, r.stderr
    split = json.loads(r.stdout)["engines"][0]["pool_split"]
    assert split["swa_layer_tokens"] == int(split["full_layer_tokens"] * 0.5)


def test_the_mamba_state_pool_through_0_5_13():
    """`handle_max_mamba_cache`'s ratio branch (no speculative decoding) is the same text in
    model_runner_kv_cache_mixin.py@0.5.9 .. @0.5.12.post1 and the same arithmetic in @0.5.13.post1 (``mamba_budget``),
    "auto" still "no_buffer" (server_args.py@0.5.13.post1), so the running cap divides by 3; the state shapes are
    0.5.8's (configs/qwen3_next.py@0.5.13.post1). Qwen3-Next's config has no mamba_ssm_dtype, so 0.5.9 on keep
    float32 (configs/mamba_utils.py@0.5.9 `mamba2_state_dtype`): the numbers of test_the_mamba_state_pool_from_the_gpu,
    19,316,736 B a slot."""
    p = select_gpus("H100").device.cuda_total_bytes - 0.75 * GiB
    rest_gib = (p * 0.85 - 37 * GiB) / 2**30
    slots = int((rest_gib * 0.9 / 1.9 * 2**30) // 19_316_736)
    kv_tokens = int((rest_gib - slots * 19_316_736 / 2**30) * 2**30) // 12_288
    for version in ("0.5.9", "0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13.post1"):
        pool = _qwen3_next(version)
        assert (pool.mamba_slots, sum(pool.mamba_state_bytes), pool.tokens) == (slots, 19_316_736, kv_tokens), version
        assert pool.max_running_requests == slots // 3


def test_the_mamba_state_pool_in_0_5_14_and_0_5_15_extra_buffer():
    """0.5.14 turns --mamba-radix-cache-strategy "auto" into extra_buffer for Qwen3-Next (overlap schedule on,
    --linear-attn-backend triton: `_handle_mamba_radix_cache`, server_args.py@0.5.14; the same test in
    arg_groups/overrides.py@0.5.15.post1 `_mamba_radix_cache_resolution`). The slots are the ratio branch's as before
    (`handle_max_mamba_cache`, model_runner_kv_cache_mixin.py@0.5.14 and @0.5.15.post1 the same text,
    ``int(mamba_budget_bytes // per_req)``) and the pool keeps size + 1 slots (mem_cache/memory_pool.py@0.5.14,
    @0.5.15.post1); the running cap divides by
    MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO 3 + MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP 2 = 5
    (`_calculate_mamba_ratio`, `_resolve_max_num_reqs`). Hand numbers, H100, fraction 0.85, 37 GiB of weights, TP 4:
    a slot (8,192 / 4 x 3 x 2 + 32 / 4 x 128 x 128 x 4) x 36 = 19,316,736 B, the KV cell 1 x 256 x 2 x 2 x 12 = 12,288 B
    (test_the_mamba_state_pool_from_the_gpu)."""
    p = select_gpus("H100").device.cuda_total_bytes - 0.75 * GiB
    rest_gib = (p * 0.85 - 37 * GiB) / 2**30
    slots = int((rest_gib * 0.9 / 1.9 * 2**30) // 19_316_736)
    kv_tokens = int((rest_gib - slots * 19_316_736 / 2**30) * 2**30) // 12_288
    for version in ("0.5.14", "0.5.15.post1"):
        pool = _qwen3_next(version)
        assert (pool.mamba_slots, sum(pool.mamba_state_bytes), pool.tokens) == (slots, 19_316_736, kv_tokens)
        assert pool.max_running_requests == min(4096, kv_tokens // 2, slots // 5) == slots // 5
    assert slots // 5 < slots // 3  # the boundary: 0.5.13 divides by 3
    assert _qwen3_next("0.5.13.post1").max_running_requests == slots // 3
    with pytest.raises(KvplanError, match="kv_cache_configurator"):
        _qwen3_next("0.5.16")
    # on ROCm "auto" still becomes extra_buffer, which `_validate_mamba_extra_buffer` asserts is CUDA/MUSA/NPU only
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking", source="bundled")
    for version, refused in (("0.5.13", False), ("0.5.14", True), ("0.5.15", True)):
        try:
            size_pool(model.arch, select_gpus("MI300X").device, Settings(tensor_parallel_size=4), rules_for(version),
                      37 * GiB, mem_fraction_static=0.85)
            assert not refused, version
        except KvplanError as error:
            assert refused and "extra_buffer needs CUDA" in str(error), (version, error)


def test_the_ssm_dtype_is_the_configs_from_0_5_9():
    """0.5.9 on take the SSM state's dtype from the config's mamba_ssm_dtype (configs/mamba_utils.py@0.5.9); 0.5.8 from
    --mamba-ssm-dtype, float32. Qwen3-Next at TP 4 with mamba_ssm_dtype bfloat16: temporal 8 x 128 x 128 x 2 B =
    262,144 B, conv 12,288 B, x 36 layers = 9,879,552 B a slot (float32: 19,316,736). A value SGLang does not map
    keeps float32 (it warns)."""
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking", source="bundled")

    def with_ssm(dtype):
        layers = tuple(dataclasses.replace(s, config_mamba_ssm_dtype=dtype) if s.kind == "mamba" else s
                       for s in model.arch.layers)
        arch = dataclasses.replace(model.arch, layers=layers)
        return lambda v: size_pool(arch, select_gpus("H100").device, Settings(tensor_parallel_size=4), rules_for(v),
                                   37 * GiB, mem_fraction_static=0.85)

    assert sum(with_ssm("bfloat16")("0.5.9").mamba_state_bytes) == 9_879_552
    assert sum(with_ssm("bfloat16")("0.5.8").mamba_state_bytes) == 19_316_736
    assert sum(with_ssm("float64")("0.5.9").mamba_state_bytes) == 19_316_736


def test_sg017_qwen3_5_state_pool_line():
    """sg017 (profiles/reports, SGLang 0.5.9, Qwen3.5-397B-A17B at TP 2) printed "Mamba Cache is allocated.
    max_mamba_cache_size: 82, conv_state size: 0.13GB, ssm_state size: 7.29GB". One slot on one GPU
    (Qwen3_5TextConfig(Qwen3NextConfig).mamba2_cache_params, configs/qwen3_next.py@0.5.9; the config: 45 GDN layers,
    16 key heads and 64 value heads of 128, conv kernel 4, mamba_ssm_dtype float32): conv (64 x 128 + 2 x 16 x 128 =
    12,288) / 2 x 3 x 2 B x 45 = 1,658,880 B; temporal 64 / 2 x 128 x 128 x 4 B x 45 = 94,371,840 B. The pool holds
    82 + 1 slots (MambaPool): 83 x 1,658,880 / 2^30 = 0.128 -> "0.13GB", 83 x 94,371,840 / 2^30 = 7.295 -> "7.29"
    (SGLang's :.2f of 7.2949...)."""
    model = load_model("Qwen/Qwen3.5-397B-A17B", source="bundled")
    pool = size_pool(model.arch, select_gpus("2xH100").device,
                     Settings(tensor_parallel_size=2, language_model_only=True), rules_for("0.5.9"), 60 * GiB,
                     mem_fraction_static=0.85)
    assert pool.mamba_state_bytes == (1_658_880, 94_371_840)
    conv_gib, ssm_gib = (83 * b / GiB for b in pool.mamba_state_bytes)
    assert (f"{conv_gib:.2f}", f"{ssm_gib:.2f}") == ("0.13", "7.29")
    assert pool.cell_bytes == 15 * 1 * 256 * 2 * 2  # 15 full-attention layers, 2 KV heads / TP 2, bf16: 15,360


def test_nsa_pool_in_0_5_9_and_0_5_10():
    """0.5.9 passes the buffer's dim from the model runner (`calculate_mla_kv_cache_dim`,
    model_runner_kv_cache_mixin.py@0.5.9): FP8 with the default flashmla backends keeps 0.5.8's 656 B a layer, and the
    cell (`get_cell_size_per_token`), page 64 and "auto" dtype rule are 0.5.8's: on a B200 (FP8) the cell is
    (512 + 64) x 61 x 1 + 61 x (128 + 4) = 43,188 B, the buffers 61 x (656 + 132) = 48,068 B. 0.5.10 gives FP8 on
    compute capability >= 10 the trtllm backends (server_args.py@0.5.10.post1 `_set_default_nsa_backends`), which keep
    kv_lora_rank + rope: buffers 61 x (576 + 132) = 43,188 B; FP8 on an H200 (given: flashmla) keeps 48,068 B; bf16
    on an H200: 61 x (576 x 2 + 132) = 78,324 B both."""
    p = select_gpus("B200").device.cuda_total_bytes - 0.75 * GiB
    for version, buffers in (("0.5.9", 48_068), ("0.5.10.post1", 43_188)):
        pool = _v32(version, mem_fraction_static=0.85, dp_attention_size=8)
        assert (pool.cell_bytes, pool.buffer_bytes_per_token, pool.page_size) == (43_188, buffers, 64), version
        assert pool.tokens == int(p * 0.85 - 90 * GiB) // 43_188 // 64 * 64
    h200 = _v32("0.5.10", gpu="H200", weights=80 * GiB, mem_fraction_static=0.85, dp_attention_size=8)
    assert (h200.cell_bytes, h200.buffer_bytes_per_token) == (78_324, 78_324)
    model = load_model("deepseek-ai/DeepSeek-V3.2", source="bundled")
    fp8 = size_pool(model.arch, select_gpus("H200").device, Settings(tensor_parallel_size=8, kv_cache_dtype="fp8_e4m3"),
                    rules_for("0.5.10"), 80 * GiB, mla_ranks=(512, 64), mem_fraction_static=0.85, dp_attention_size=8)
    assert (fp8.cell_bytes, fp8.buffer_bytes_per_token) == (43_188, 48_068)


def test_check_log_judges_sg017s_state_line_at_its_printed_slots():
    """sg017 (SGLang 0.5.9, Qwen3.5-397B at TP 2): the Mamba pool line's sizes at its printed 82 slots, (82 + 1) x
    1,658,880 B = 0.13 GB conv and (82 + 1) x 94,371,840 B = 7.29 GB SSM (test_sg017_qwen3_5_state_pool_line), not
    gated. Were the config's mamba_ssm_dtype bfloat16, 0.5.9 would keep the SSM state in 2 B: 3.65 GB, a miss."""
    from kvplan.gate.enginelog import judge_sglang

    rows = [json.loads(line) for line in
            (REPORTS_DIR / "sglang-startup-reports.jsonl").read_text().splitlines() if line.strip()]
    quote = next(r for r in rows if r["case_id"] == "sg017")["quote"].replace(" / ", "\n")
    model = load_model("Qwen/Qwen3.5-397B-A17B", source="bundled")
    judged = judge_sglang(quote, "sg017", 0.005, "all", None, "2xRTX4090", "0.5.9", 2, None, resolved=model)
    state = {c.quantity: c for c in judged.page_math.comparisons if c.quantity.startswith("Mamba")}
    assert [(c.reported, c.predicted, c.within, c.gated) for c in state.values()] == [
        (0.13, 0.13, True, False), (7.29, 7.29, True, False)]
    layers = tuple(dataclasses.replace(s, config_mamba_ssm_dtype="bfloat16") if s.kind == "mamba" else s
                   for s in model.arch.layers)
    bf16 = dataclasses.replace(model, arch=dataclasses.replace(model.arch, layers=layers))
    judged = judge_sglang(quote, "sg017", 0.005, "all", None, "2xRTX4090", "0.5.9", 2, None, resolved=bf16)
    ssm = next(c for c in judged.page_math.comparisons if c.quantity == "Mamba ssm_state GB")
    assert (ssm.predicted, ssm.within) == (3.65, False)  # 83 x 47,185,920 B = 3.647 GiB
