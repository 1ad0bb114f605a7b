"""TensorRT-LLM's dummy prefill in a mixture-of-experts model (kvplan/trtllm/moe.py): the fused MoE's CUTLASS workspace
(`cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_kernels.cu@000dea2` ``getWorkspaceDeviceBufferSizes``, plus
``src_to_dest_map`` in `cpp/tensorrt_llm/thop/moeOp.cpp@01503f5`) and the layer around it, priced by hand from bundled
configs, and against the one public log that prints the term (report tr001)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvplan.deploy import load_model
from kvplan.trtllm.budget import moe_activation
from kvplan.trtllm.moe import fused_moe_workspace_bytes, moe_layer_bytes, moe_shape

GiB = 1 << 30
DATA = Path(__file__).parent / "data"


def test_gpt_oss_120b_dummy_prefill_by_hand():
    """openai/gpt-oss-120b (bundled config: hidden 2880, intermediate_size 2880 = one expert, 128 experts, 4 per
    token, MXFP4 experts so bf16 activations: a = g = 2 B), TP 1, max_num_tokens 8192: rows 8192, M = 4 x 8192 = 32,768.

    permuted_data = fc2_result = fc1_result = 32,768 x 2880 x 2 = 188,743,680 B; glu_inter = 2 x that = 377,487,360
    inputs = 188,743,680, outputs = 377,487,360
    + 3 x M x 4 = 393,216 (permuted rows, selected experts, final scales)
    + 128 x 8192 x 4 = 4,194,304 (blocked_row_to_unpermuted_row)
    + 129 x 8 = 1,032 -> 1,280 aligned to 256 (expert_first_token_offset)
    + 2 x 128 x 8 = 2,048 (alpha pointer arrays)
    workspace = 393,216 + 4,194,304 + 1,280 + 188,743,680 + 377,487,360 + 2,048 = 570,821,888
    + src_to_dest_map 32,768 x 4 = 131,072                                             -> 570,952,960 B
    layer: input + residual 2 x 8192 x 2880 x 2 = 94,371,840; output 8192 x 2880 x 2 = 47,185,920;
           router 8192 x 128 x 4 + 2 x 8192 x 4 x 4 = 4,194,304 + 262,144 = 4,456,448
    total = 94,371,840 + 47,185,920 + 4,456,448 + 570,952,960 = 716,967,168 B (0.668 GiB)"""
    model = load_model("openai/gpt-oss-120b", source="bundled")
    shape = moe_shape(model.arch, model.config.config)
    assert (shape.hidden, shape.expert_intermediate, shape.experts, shape.top_k) == (2880, 2880, 128, 4)
    assert (shape.activation_bytes, shape.shared_intermediate, shape.dense_intermediate) == (2, 0, 0)
    assert fused_moe_workspace_bytes(shape, 8192, 1) == 570_952_960
    activation, how = moe_activation(model.arch, model.config.config, 1, 8192)
    assert activation.bytes == 716_967_168
    assert "4 of 128 experts" in how


def test_tr001_prints_the_dummy_prefills_activation():
    """tr001's log (1.1.0rc3, gpt-oss-120b, TP 1, max_num_tokens 8192) prints 'Memory dynamically allocated during
    inference (inside torch) in memory usage profiling: 0.85 GiB'. kvplan's term, 716,967,168 B = 0.668 GiB, is 0.18
    GiB short: 0.18 / 119.70 GiB (the log's device total) = 0.15% of the GPU. What is missing is not read (the
    attention op's workspace is the likeliest: it is allocated in the forward and kept), so the test pins the gap
    rather than hiding it."""
    text = (DATA / "trtllm-1.1.0rc3-gpt-oss-120b-dgx-spark.log").read_text()
    printed = float(re.search(r"Memory dynamically allocated during inference \(inside torch\) in memory usage "
                              r"profiling: ([\d.]+) GiB", text).group(1))
    assert printed == 0.85
    gap_gib = printed - 716_967_168 / GiB
    assert 0.17 < gap_gib < 0.19
    assert round(100 * gap_gib / 119.70, 2) == 0.15


def test_qwen3_30b_a3b_and_the_tensor_parallel_split():
    """Qwen/Qwen3-30B-A3B (hidden 2048, moe_intermediate_size 768, 128 experts, 8 per token, bf16), 8192 tokens:
    M = 65,536.

    permuted_data = fc2_result = 65,536 x 2048 x 2 = 268,435,456; fc1_result = 65,536 x 768 x 2 = 100,663,296;
    glu_inter = 201,326,592 -> inputs = outputs = 268,435,456 (the [M, hidden] GEMM-2 output is the larger)
    + 3 x 65,536 x 4 = 786,432 + 128 x 8192 x 4 = 4,194,304 + 1,280 + 2,048 -> workspace 541,854,976
    + src_to_dest_map 262,144                                           -> 542,117,120
    layer: 2 x 8192 x 2048 x 2 = 67,108,864 + 8192 x 2048 x 2 = 33,554,432 + router 8192 x 128 x 4 + 2 x 8192 x 8
           x 4 = 4,718,592 -> 105,381,888; total 647,499,008 B.
    At TP 4 the expert width is 192 a rank: glu_inter 2 x 65,536 x 192 x 2 = 50,331,648, still below the [M, hidden]
    buffers, so the same bytes: the workspace is set by hidden here, not by the split."""
    model = load_model("Qwen/Qwen3-30B-A3B", source="bundled")
    shape = moe_shape(model.arch, model.config.config)
    assert fused_moe_workspace_bytes(shape, 8192, 1) == 542_117_120
    assert moe_layer_bytes(shape, 8192, 1, 2) == 647_499_008
    assert moe_layer_bytes(shape, 8192, 4, 2) == 647_499_008


def test_deepseek_v3_fp8_block_scales_shared_expert_and_dense_layers():
    """deepseek-ai/DeepSeek-V3 (hidden 7168, moe_intermediate_size 2048, 256 experts, 8 per token, 1 shared expert,
    first_k_dense_replace 3 with intermediate_size 18432, FP8 with weight_block_size: bf16 in, a = g = 2), TP 8,
    8192 tokens: M = 65,536, expert width 256 a rank.

    FP8 block scales: inputs = max(65,536 x 7168 x 2, 65,536 x 256 x 2, 65,536 x 7168 x 2) = 939,524,096;
                      outputs = 2 x 65,536 x 256 x 2 = 67,108,864
    + 786,432 + 256 x 8192 x 4 = 8,388,608 + 257 x 8 = 2,056 -> 2,304 + 2 x 256 x 8 = 4,096 -> workspace 1,015,814,400
    + src_to_dest_map 262,144 -> 1,016,076,544
    layer: 2 x 8192 x 7168 x 2 = 234,881,024 + 8192 x 7168 x 2 = 117,440,512 + router 8192 x 256 x 4 + 2 x 8192 x 8
           x 4 = 8,912,896 + shared expert 8192 x (3 x 2048 / 8 + 7168) x 2 = 130,023,424 -> 491,257,856
    MoE layer = 1,507,334,400 B; a dense layer 8192 x (3 x 18432 / 8 + 3 x 7168) x 2 = 465,567,744 is smaller."""
    model = load_model("deepseek-ai/DeepSeek-V3", source="bundled")
    shape = moe_shape(model.arch, model.config.config)
    assert shape.fp8_block_scales and shape.shared_intermediate == 2048 and shape.dense_intermediate == 18432
    assert fused_moe_workspace_bytes(shape, 8192, 8) == 1_016_076_544
    activation, how = moe_activation(model.arch, model.config.config, 8, 8192)
    assert activation.bytes == 1_507_334_400
    assert "above a dense layer's 465,567,744 B" in how


def test_nvfp4_rows_under_attention_dp():
    """Qwen3-30B-A3B's shape with an NVFP4 (ModelOpt) checkpoint: the rows enter the op as 4 bits (a = 0.5), GEMM
    outputs stay bf16 (g = 2). Two attention-DP ranks of 8192 tokens: 16,384 rows, M = 131,072.

    permuted_data 131,072 x 2048 x 0.5 = 134,217,728; fc2_result 131,072 x 2048 x 2 = 536,870,912 -> inputs = outputs
    = 536,870,912; + 3 x 131,072 x 4 = 1,572,864 + 128 x 16,384 x 4 = 8,388,608 + 1,280 + 2,048 -> 1,083,706,624
    + src_to_dest_map 524,288 -> 1,084,230,912
    layer: the other rank's rows all-gathered 8192 x 2048 x 0.5 = 8,388,608; input + residual 67,108,864; the op's
    output [16,384, 2048] x 2 = 67,108,864; router 8192 x 128 x 4 + 2 x 16,384 x 8 x 4 = 5,242,880
    total = 147,849,216 + 1,084,230,912 = 1,232,080,128 B"""
    model = load_model("Qwen/Qwen3-30B-A3B", source="bundled")
    config = model.config.config | {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    shape = moe_shape(model.arch, config)
    assert shape.activation_bytes == 0.5 and not shape.fp8_block_scales
    assert moe_layer_bytes(shape, 8192, 1, 2, dp=2) == 1_232_080_128


def test_size_prices_an_moe_model_and_keeps_the_override():
    """`kvplan size MOE --engine trtllm` needs no --dummy-activation-gib now; the flag still overrides; a multimodal
    MoE model (Kimi-K2.5, its encoder's dummy input not read) still asks for it; a hostile routing field, or a --set
    that changes the routing, is one line, exit 2."""
    from helpers.harness import invoke

    r = invoke("size", "openai/gpt-oss-120b", "--gpu", "H100", "--engine", "trtllm", "--json")
    assert r.code == 0, r.stderr
    pool = json.loads(r.stdout)["engines"][0]
    terms = {t["name"]: t for t in pool["memory_terms"]}
    assert terms["dummy prefill activation"]["bytes"] == 716_967_168  # test_gpt_oss_120b_dummy_prefill_by_hand
    # the budget: (CUDA total - weights - activation - context - graphs) x 0.9, the other terms as printed
    rest = (terms["CUDA total"]["bytes"] - terms["weights"]["bytes"] - 716_967_168
            - terms["CUDA context and communicators"]["bytes"] - terms["CUDA graphs"]["bytes"])
    assert terms["x free_gpu_memory_fraction 0.9"]["bytes"] == int(rest * 0.9)
    given = json.loads(invoke("size", "openai/gpt-oss-120b", "--gpu", "H100", "--engine", "trtllm",
                              "--dummy-activation-gib", "0.85", "--json").stdout)["engines"][0]
    given_terms = {t["name"]: t for t in given["memory_terms"]}
    assert given_terms["dummy prefill activation"]["bytes"] == round(0.85 * GiB)
    assert given_terms["dummy prefill activation"]["how"] == "given"
    kimi = invoke("size", "moonshotai/Kimi-K2.5", "--gpu", "8xH200", "--engine", "trtllm")
    assert kimi.code == 2 and "multimodal" in kimi.one_line_error() and "--dummy-activation-gib" in kimi.one_line_error()
    bad = invoke("size", "Qwen/Qwen3-30B-A3B", "--gpu", "H100", "--engine", "trtllm", "--set", "num_experts_per_tok=-3")
    assert bad.code == 2 and "invalid num_experts_per_tok" in bad.one_line_error(), bad.stderr
    # --set patches the architecture, not the raw config the routing is read from: refused, unless the term is given
    changed = ("size", "Qwen/Qwen3-30B-A3B", "--gpu", "H100", "--engine", "trtllm", "--set", "num_experts_per_tok=4")
    r = invoke(*changed)
    assert r.code == 2 and "which --set changed" in r.one_line_error()
    assert invoke(*changed, "--dummy-activation-gib", "0.5").code == 0
