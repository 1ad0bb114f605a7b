"""The dummy prefill's activation in a mixture-of-experts model: TensorRT-LLM's fused MoE (CUTLASS backend) over
``max_num_tokens`` rows, from its source.

The default backend is CUTLASS (``MoeConfig.backend ... Field(default='CUTLASS')``, `llmapi/llm_args.py`, index id
1090804222). ``CutlassFusedMoE.forward`` (`_torch/modules/fused_moe/fused_moe_cutlass.py@000a01d`) runs the layer's
rows in one chunk (``moe_max_num_tokens`` defaults to ``max_num_tokens``, times the world size under attention DP,
whose ranks' rows are all-gathered first) through ``torch.ops.trtllm.fused_moe``. The C++ op
(`cpp/tensorrt_llm/thop/moeOp.cpp@01503f5` ``FusedMoeRunner::runMoe``) allocates, as torch tensors (so in the torch
peak the profile reads):

- ``output``: [rows, hidden] in the output dtype;
- one workspace of ``getWorkspaceSize(...)`` + ``src_to_dest_map`` (``experts_per_token x rows x 4`` B), each piece
  aligned to 256 B (``calculateTotalWorkspaceSize``).

``getWorkspaceSize`` is ``CutlassMoeFCRunner::getWorkspaceDeviceBufferSizes``
(`cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_kernels.cu@000dea2`), with ``M = experts_per_token x rows``,
``I`` the expert intermediate size per rank (``fc2_expert_weights.sizes()[2]``: / TP, the MoE's default split,
``moe_tp_size = tp``, ``moe_ep_size = 1`` in `tensorrt_llm/mapping.py`, index id 3760030498) and ``E`` the experts
on the rank:

    permuted_data  = M x hidden x a        a: the activation element (bf16 2; FP8 per-tensor 1; NVFP4 0.5)
    fc1_result     = M x I x a
    fc2_result     = M x hidden x g        g: the unfused GEMM output (the model dtype, 2)
    glu_inter      = 2 x M x I x g         (a gated activation: SwiGLU)
    inputs  = max(permuted_data, fc2_result, fc1_result)   outputs = max(glu_inter, fc2_result, fc1_result)
    FP8 block scales (DeepSeek-style ``weight_block_size``): inputs = max(permuted_data, fc1_result, M x hidden x g),
                     outputs = 2 x M x I x g
    + permuted_row_to_unpermuted_row, permuted_token_selected_experts, permuted_token_final_scales: M x 4 B each
    + blocked_row_to_unpermuted_row: E x rows x 4 B;   expert_first_token_offset: (E + 1) x 8 B
    + alpha_scale_ptr_array_fc1/fc2: E x 8 B each

Not priced, none of them a multiple of hidden x rows: ``blocked_expert_counts`` and its cumsum (E x
ceil(rows / computeNumTokensPerBlock(...)) x 4 B each, at most E x rows x 4 B: the block size is a kernel heuristic);
the TMA warp-specialized and CUTLASS GEMM workspaces (``TmaWarpSpecializedGroupedGemmInput::workspaceSize(E)``,
``getMaxWorkspaceSize(E)``: kernel-configuration queries, by expert count, not by rows); NVFP4's activation scale
factors (about M x hidden / 16 B); the FP8 block-scale GEMM's own workspace (``deepseek_fc_workspace``, from the
block-scale GEMM runner, not read); LoRA and AWQ buffers (off).

Around the op the layer holds the hidden states it was given, the residual and the op's output ([rows, hidden] each:
kvplan's dense forward term's "3 x hidden"), the router's logits ([rows, experts], priced at 4 B: DeepSeek-V3's gate
is float32; a bf16 router is half) and the routing's top-k ids and scales ([rows, k] x 4 B each). A shared expert is a
``GatedMLP`` on the same rows (`_torch/models/modeling_deepseekv3.py`: run beside the routed experts on an auxiliary
stream): ``rows x (3 x shared width / TP + hidden) x dtype`` alive with them. A shared expert no config field sizes
(Llama 4's, ``intermediate_size`` wide) is not priced.

Other MoE backends (TRTLLM-gen, DeepGEMM, Triton, WIDEEP's all-to-all buffers) allocate otherwise and are not
priced: this is the CUTLASS default's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError
from kvplan.model.arch import Architecture, parse_architecture, text_config

#: ``tensorrt_llm::common::kCudaMemAlign``: every workspace piece is rounded up to it (``alignSize``).
CUDA_MEM_ALIGN = 256
#: Routing fields for experts per token, as configs spell them (kvplan/vllm/twin.py reads the same).
_TOP_K_FIELDS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token", "top_k_experts")
#: An upper bound on one field kvplan multiplies (hostile configs).
_FIELD_LIMIT = 1 << 24


@dataclass(frozen=True)
class MoeShape:
    """What the fused MoE's workspace is sized by, on one rank."""

    hidden: int
    expert_intermediate: int  # one expert's, whole (divided by TP on the rank)
    experts: int  # routed experts, all ranks
    top_k: int
    shared_intermediate: int  # the shared experts' width, whole (0: none)
    dense_intermediate: int  # a dense layer's MLP width beside the MoE layers (0: every layer is MoE)
    activation_bytes: float  # a: the fused MoE's input element
    gemm_output_bytes: int  # g: the unfused GEMM output's element (the model dtype)
    fp8_block_scales: bool
    scheme: str  # the activation's type, in words


def _field(cfg: Mapping[str, Any], *names: str) -> int:
    for name in names:
        value = cfg.get(name)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int) and 0 <= value <= _FIELD_LIMIT:
            return value
        raise KvplanError(f"invalid {name} in config: {value!r}", f"fix it with --set {name}=N")
    return 0


def _activation_element(config: Mapping[str, Any], model_bytes: int) -> tuple[float, bool, str]:
    """The fused MoE's input element, from the checkpoint's quantization (``CutlassFusedMoE.forward_chunk``
    quantizes the rows before the op for FP8 per-tensor and NVFP4; FP8 block scales and weight-only schemes keep the
    model dtype): (bytes, FP8 block scales, words)."""
    qc = config.get("quantization_config") or text_config(dict(config)).get("quantization_config")
    if not isinstance(qc, dict):
        return model_bytes, False, "unquantized: the model dtype"
    method = str(qc.get("quant_method", "")).lower()
    algo = str(qc.get("quant_algo", "")).upper()
    groups = qc.get("config_groups") or {}
    bits = next((((g or {}).get("weights") or {}).get("num_bits") for g in groups.values() if isinstance(g, dict)),
                None) if isinstance(groups, dict) else None
    kind = next((str(((g or {}).get("input_activations") or {}).get("type", "")) for g in groups.values()
                 if isinstance(g, dict)), "") if isinstance(groups, dict) else ""
    if method == "fp8" and qc.get("weight_block_size"):
        return model_bytes, True, "FP8 block scales: the model dtype in, FP8 GEMMs"
    if (method.startswith("modelopt") and "FP4" in algo) or (method == "compressed-tensors" and bits == 4
                                                            and kind == "float"):
        return 0.5, False, "NVFP4: rows quantized to 4 bits before the op"
    if method in ("fp8", "fbgemm_fp8") or (method.startswith("modelopt") and algo == "FP8"):
        return 1, False, "FP8 per tensor: rows quantized to FP8 before the op"
    return model_bytes, False, f"{method or 'quantized'} weights, activations in the model dtype"


def moe_shape(arch: Architecture, config: Mapping[str, Any]) -> MoeShape:
    """The MoE layer's sizes from the config (the language model's part of a multimodal one)."""
    text = text_config(dict(config))
    top_k = _field(text, *_TOP_K_FIELDS)
    if top_k < 1 or not arch.num_experts or not arch.expert_intermediate_size:
        raise KvplanError("kvplan cannot read this MoE model's routing (experts per token) from its config",
                          "give the activation with --dummy-activation-gib")
    shared = _field(text, "shared_expert_intermediate_size", "shared_intermediate_size")
    shared += _field(text, "n_shared_experts", "num_shared_experts") * arch.expert_intermediate_size
    dense = _field(text, "intermediate_size_mlp", "intermediate_size") if arch.params.mlp else 0
    # ``--set`` patches the architecture, not the raw config read here: the config, read afresh, must give the
    # architecture's own routed width (kvplan/model/arch.py ``mlp_activation_width``) and experts.
    plain = parse_architecture(dict(config), allow_unverified=not arch.layout_verified)
    if (plain.mlp_activation_width, plain.num_experts, plain.hidden_size) != (
            arch.mlp_activation_width, arch.num_experts, arch.hidden_size):
        raise KvplanError("kvplan prices TensorRT-LLM's MoE dummy prefill from the config's routing, which --set changed",
                          "give the activation with --dummy-activation-gib")
    element, block, scheme = _activation_element(config, arch.model_dtype_bytes)
    return MoeShape(hidden=arch.hidden_size, expert_intermediate=arch.expert_intermediate_size,
                    experts=arch.num_experts, top_k=top_k, shared_intermediate=shared, dense_intermediate=dense,
                    activation_bytes=element, gemm_output_bytes=arch.model_dtype_bytes, fp8_block_scales=block,
                    scheme=scheme)


def _aligned(size: float) -> int:
    return -(-int(size) // CUDA_MEM_ALIGN) * CUDA_MEM_ALIGN


def fused_moe_workspace_bytes(shape: MoeShape, rows: int, tp: int) -> int:
    """``FusedMoeRunner::getWorkspaceInfo``'s torch workspace for ``rows`` rows (the module docstring's sum)."""
    m = shape.top_k * rows
    inter = shape.expert_intermediate // tp
    experts = shape.experts
    a, g = shape.activation_bytes, shape.gemm_output_bytes
    permuted_data, fc1_result = m * shape.hidden * a, m * inter * a
    fc2_result, glu_inter = m * shape.hidden * g, 2 * m * inter * g
    if shape.fp8_block_scales:
        inputs, outputs = max(permuted_data, fc1_result, m * shape.hidden * g), 2 * m * inter * g
    else:
        inputs, outputs = max(permuted_data, fc2_result, fc1_result), max(glu_inter, fc2_result, fc1_result)
    pieces = [m * 4, m * 4, experts * rows * 4, (experts + 1) * 8, m * 4, inputs, outputs, experts * 8, experts * 8]
    workspace = sum(_aligned(p) for p in pieces)
    src_to_dest_map = m * 4
    return _aligned(workspace) + _aligned(src_to_dest_map)


def moe_layer_bytes(shape: MoeShape, tokens: int, tp: int, dtype_bytes: int, dp: int = 1) -> int:
    """The torch bytes alive at an MoE layer's peak for ``tokens`` tokens a rank: the fused MoE's workspace and output,
    the layer's hidden states, the router's logits and top-k, a shared expert beside it. ``dp``: the attention-DP
    ranks whose rows are all-gathered into the MoE (1 without attention DP)."""
    rows = tokens * dp
    gathered = (rows - tokens) * shape.hidden * shape.activation_bytes  # the all-gathered rows of the other ranks
    hidden_states = 2 * tokens * shape.hidden * dtype_bytes  # the layer's input and residual
    output = rows * shape.hidden * dtype_bytes  # the op's [rows, hidden] (reduce-scattered back under DP)
    router = tokens * shape.experts * 4 + 2 * rows * shape.top_k * 4
    shared = tokens * (3 * shape.shared_intermediate // tp + shape.hidden) * dtype_bytes if shape.shared_intermediate else 0
    return int(hidden_states + gathered + output + router + shared) + fused_moe_workspace_bytes(shape, rows, tp)


def dense_layer_bytes(shape: MoeShape, tokens: int, tp: int, dtype_bytes: int) -> int:
    """A dense layer beside the MoE layers (DeepSeek's first layers, Llama 4's interleaved ones): kvplan's forward
    term (``T x (3 x MLP width + 3 x hidden) x dtype``, GatedMLP's shapes, kvplan/trtllm/budget.py)."""
    if not shape.dense_intermediate:
        return 0
    return tokens * (3 * (shape.dense_intermediate // tp) + 3 * shape.hidden) * dtype_bytes


__all__ = ["CUDA_MEM_ALIGN", "MoeShape", "dense_layer_bytes", "fused_moe_workspace_bytes", "moe_layer_bytes",
           "moe_shape"]
