"""Weight bytes from parameter counts and the checkpoint's quantization scheme.

Pure arithmetic. The config reader (`arch.py`) counts parameters by role; this module
prices each role. Quantized linear layers carry their scales: GPTQ/AWQ int4 stores one
fp16 scale and one packed int4 zero point per ``group_size`` inputs; MXFP4 one e8m0 scale
per 32 values; NVFP4 one fp8 (e4m3) scale per 16 values plus per-tensor fp32 scales; fp8
block quantization one fp32 scale per 128x128 block. Embeddings, the LM head, norms,
routers and multimodal towers stay in the model dtype unless the scheme says otherwise.

MXFP4 mixture-of-experts weights are priced as vLLM lays them out for the kernel it picks
on the GPU (padding and scale copies, :func:`mxfp4_expert_bytes`), not as the checkpoint
stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by role, for the layers vLLM loads (MTP draft layers excluded)."""

    embedding: int = 0
    lm_head: int = 0
    attention: int = 0  # q/k/v/o projections (or MLA's low-rank projections)
    mlp: int = 0  # dense MLP layers
    experts: int = 0  # routed experts of MoE layers (sharded over every GPU of the deployment)
    recurrent: int = 0  # Mamba / linear-attention projections
    other: int = 0  # norms, routers, conv kernels, biases: never quantized
    # Multimodal towers (vision / audio encoders and their projectors): loaded unless every
    # modality's limit is 0 (`--language-model-only`); kept in the model dtype.
    towers: int = 0
    # Shared experts of MoE layers: priced as experts, but tensor-parallel like a dense MLP.
    shared_experts: int = 0

    @property
    def total(self) -> int:
        return (
            self.embedding + self.lm_head + self.attention + self.mlp + self.experts + self.recurrent + self.other
            + self.towers + self.shared_experts
        )


@dataclass(frozen=True)
class ExpertShape:
    """The routed experts' matrices as the MoE kernel sees them (for layouts that pad)."""

    moe_layers: int
    experts: int
    hidden: int
    intermediate: int  # one expert's intermediate size (before tensor-parallel splitting)
    bias: bool = False  # gpt-oss: w13 / w2 biases per expert


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its linear layers (``quantization_config``)."""

    method: str  # none | fp8 | gptq | awq | compressed-tensors | mxfp4 | bitsandbytes | ...
    bytes_per_param: float  # for quantized linear weights, scales included
    # Roles left in the model dtype (e.g. gpt-oss keeps attention unquantized).
    unquantized_roles: frozenset[str] = field(default_factory=frozenset)
    quantize_lm_head: bool = False
    note: str = ""
    # Per role, the share of its parameters that is quantized when only some layers are
    # (an ``ignore`` / ``exclude_modules`` list naming some layers' modules); roles not
    # listed follow ``unquantized_roles``.
    quantized_share: tuple[tuple[str, float], ...] = ()
    # Per role, bytes per parameter where a role uses another scheme than the rest
    # (ModelOpt MIXED_PRECISION: fp8 linear attention beside nvfp4 experts).
    role_bytes: tuple[tuple[str, float], ...] = ()
    # MXFP4 experts: their shapes, priced per kernel by mxfp4_expert_bytes.
    expert_shape: ExpertShape | None = None


NO_QUANTIZATION = Quantization("none", 0.0)

# NVFP4 (ModelOpt `ModelOptNvFp4LinearMethod.create_weights`, compressed-tensors
# `CompressedTensorsW4A4Fp4`, vllm/model_executor/layers/quantization@0.32.0): the weight as
# packed uint8 [N, K/2], one float8_e4m3fn scale per 16 inputs [N, K/16], per-tensor fp32
# `weight_scale_2` / `input_scale` (negligible): 0.5 + 1/16 bytes a parameter.
NVFP4_BYTES = 0.5 + 1 / 16
# MXFP4 (`Mxfp4MoEMethod.create_weights`, quantization/mxfp4.py@0.11.0): packed uint8
# values and one uint8 (e8m0) scale per 32 values.
MXFP4_BYTES = 0.5 + 1 / 32


def int_group_bytes(bits: int, group_size: int, zero_points: bool = True) -> float:
    """Bytes per weight for group-quantized integers: value + fp16 scale, + a zero point per group where the
    checkpoint keeps one (GPTQ / AWQ always; compressed-tensors only when asymmetric: ``weight_zero_point`` is
    registered ``if not self.symmetric``, schemes/compressed_tensors_wNa16.py and
    compressed_tensors_moe/compressed_tensors_moe_wna16.py@0.32.0, CUDA backends)."""
    if group_size <= 0:  # per-channel: scales are negligible per weight
        return bits / 8
    return bits / 8 + 2 / group_size + ((bits / 8) / group_size if zero_points else 0.0)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


# The MoE kernel vLLM picks for MXFP4 weights, and how it lays them out
# (`get_mxfp4_backend` and `Mxfp4MoEMethod.create_weights` /
# `process_weights_after_loading`, vllm/model_executor/layers/quantization/mxfp4.py@0.11.0;
# the same rules live in fused_moe/oracle/mxfp4.py@0.32.0):
#   kernel            intermediate pad  hidden pad  scales kept  bias after loading
#   marlin            128               256         once         bf16   (GPUs below SM90)
#   triton            64                none        twice        fp32   (SM90 / SM12x)
#   flashinfer_sm100  256               256         once         bf16   (B200-class SM100)
#   rocm              256               256         twice        fp32   (ROCm, Triton kernels)
#   None              none              none        once         bf16   (the checkpoint's bytes)
# "twice": the Triton path swizzles the scales into new tensors (`_swizzle_mxfp4`) and
# deletes only the old w13_weight / w2_weight, so layer.w13_weight_scale / w2_weight_scale
# stay allocated beside the swizzled copies; it also casts both biases to float32.
# The intermediate size is padded per tensor-parallel shard (`intermediate_size_per_partition`).
MXFP4_KERNELS: dict[str | None, tuple[int, int, int, int]] = {
    # kernel: (intermediate multiple, hidden multiple, scale copies, bias bytes)
    "marlin": (128, 256, 1, 2),
    "triton": (64, 1, 2, 4),
    "flashinfer_sm100": (256, 256, 1, 2),
    "rocm": (256, 256, 2, 4),
    None: (1, 1, 1, 2),
}


def mxfp4_kernel_for(device: object | None, vllm_version: tuple[int, ...] | None = None) -> str | None:
    """vLLM's MXFP4 MoE backend on ``device`` (a kvplan Device; duck-typed: name, vendor).

    `get_mxfp4_backend` (mxfp4.py@0.11.0): SM100 with FlashInfer (in vLLM's images) ->
    FlashInfer BF16; SM90 and newer with the triton_kernels package -> Triton; otherwise
    (below SM90, or without triton_kernels) Marlin; ROCm -> Triton. Releases before 0.11
    ran Marlin on Hopper: https://github.com/vllm-project/vllm/issues/23278 (gpt-oss-120b on an
    H100, August 2025) logs "marlin_utils_fp4.py:196 ... leveraging the Marlin kernel", where
    0.11.0 (kv029/kv030) and 0.14.1 (https://github.com/vllm-project/vllm/issues/33155) log
    "mxfp4.py:165] Using Triton backend".
    """
    if device is None:
        return None
    vendor = str(getattr(device, "vendor", "nvidia")).lower()
    name = str(getattr(device, "name", "")).upper()
    if vendor in ("amd", "rocm"):
        return "rocm"
    if vendor != "nvidia":
        return None
    if name.startswith(("B200", "B100", "GB200", "B300", "GB300")):
        return "flashinfer_sm100"
    sm90_or_newer = name.startswith(("H100", "H200", "H800", "H20", "GH200", "RTX 50", "RTX PRO", "DGX SPARK",
                                     "GB10"))
    if not sm90_or_newer:
        return "marlin"
    if vllm_version is not None and tuple(vllm_version)[:2] < (0, 11):
        return "marlin"
    return "triton"


def mxfp4_expert_bytes(shape: ExpertShape, kernel: str | None, tp: int = 1) -> int:
    """Bytes of the MXFP4 routed experts as vLLM holds them, over all ``tp`` shards."""
    i_mult, h_mult, scale_copies, bias_bytes = MXFP4_KERNELS.get(kernel, MXFP4_KERNELS[None])
    inter = _round_up(max(shape.intermediate // max(tp, 1), 1), i_mult)
    hidden = _round_up(shape.hidden, h_mult)
    values = 2 * inter * hidden + hidden * inter  # w13 [2I, H] and w2 [H, I]
    per_expert = values // 2 + scale_copies * (values // 32)
    if shape.bias:
        per_expert += (2 * inter + hidden) * bias_bytes
    return shape.moe_layers * shape.experts * per_expert * max(tp, 1)


def weight_bytes(params: ParamCounts, model_dtype_bytes: int, quant: Quantization, *,
                 mxfp4_kernel: str | None = None, tp: int = 1) -> int:
    """Bytes the loaded weights occupy, summed over the whole model (all ranks)."""
    if quant.method == "none":
        return params.total * model_dtype_bytes
    total = routed_expert_bytes(params, model_dtype_bytes, quant, mxfp4_kernel=mxfp4_kernel, tp=tp)
    for role, n in (("attention", params.attention), ("mlp", params.mlp), ("shared_experts", params.shared_experts),
                    ("recurrent", params.recurrent)):
        total += _role_bytes(role, n, model_dtype_bytes, quant)
    lm_head_bytes = params.lm_head * (quant.bytes_per_param if quant.quantize_lm_head else model_dtype_bytes)
    return int(total + (params.embedding + params.other + params.towers) * model_dtype_bytes + lm_head_bytes)


def routed_expert_bytes(params: ParamCounts, model_dtype_bytes: int, quant: Quantization, *,
                        mxfp4_kernel: str | None = None, tp: int = 1) -> int:
    """The routed experts' part of ``weight_bytes``: what vLLM shards over every GPU of a
    data-parallel deployment (``FusedMoEParallelConfig``)."""
    if quant.method == "none":
        return params.experts * model_dtype_bytes
    if quant.expert_shape is not None:
        return mxfp4_expert_bytes(quant.expert_shape, mxfp4_kernel, tp)
    return int(_role_bytes("experts", params.experts, model_dtype_bytes, quant))


def attention_bytes(params: ParamCounts, model_dtype_bytes: int, quant: Quantization) -> int:
    """The attention projections' part of ``weight_bytes``, summed over the whole model (what SGLang's DP attention
    keeps whole on every rank of its attention group)."""
    if quant.method == "none":
        return params.attention * model_dtype_bytes
    return int(_role_bytes("attention", params.attention, model_dtype_bytes, quant))


def _role_bytes(role: str, n: int, model_dtype_bytes: int, quant: Quantization) -> float:
    """``n`` parameters of ``role`` as the checkpoint stores them: the quantized share at its bytes,
    the rest in the model dtype."""
    if role == "shared_experts" and role not in dict(quant.role_bytes):
        role = "experts"  # priced as the routed experts unless the checkpoint names them apart
    q = dict(quant.quantized_share).get(role, 0.0 if role in quant.unquantized_roles else 1.0)
    per_param = dict(quant.role_bytes).get(role, quant.bytes_per_param)
    return n * q * per_param + n * (1 - q) * model_dtype_bytes
