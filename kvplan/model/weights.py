"""Weight bytes from parameter counts and the checkpoint's quantization scheme.

Pure arithmetic. The config reader (`arch.py`) counts parameters by role; this module
prices each role. Quantized linear layers carry their scales: GPTQ/AWQ int4 stores one
fp16 scale and one packed int4 zero point per ``group_size`` inputs; MXFP4 one e8m0 scale
per 32 values; fp8 block quantization one fp32 scale per 128x128 block. Embeddings, the LM
head, norms and routers stay in the model dtype unless the scheme says otherwise.
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
    experts: int = 0  # routed + shared experts of MoE layers
    recurrent: int = 0  # Mamba / linear-attention projections
    other: int = 0  # norms, routers, conv kernels, biases: never quantized

    @property
    def total(self) -> int:
        return (
            self.embedding + self.lm_head + self.attention + self.mlp + self.experts + self.recurrent + self.other
        )

    @property
    def linear(self) -> int:
        """The parameters a weight-quantization scheme would quantize."""
        return self.attention + self.mlp + self.experts + self.recurrent


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its linear layers (``quantization_config``)."""

    method: str  # none | fp8 | gptq | awq | compressed-tensors | mxfp4 | bitsandbytes | ...
    bytes_per_param: float  # for quantized linear weights, scales included
    # Roles left in the model dtype (e.g. gpt-oss keeps attention unquantized).
    unquantized_roles: frozenset[str] = field(default_factory=frozenset)
    quantize_lm_head: bool = False
    note: str = ""


NO_QUANTIZATION = Quantization("none", 0.0)


def int_group_bytes(bits: int, group_size: int) -> float:
    """Bytes per weight for group-quantized integers (GPTQ/AWQ): value + fp16 scale + zero."""
    if group_size <= 0:  # per-channel: scales are negligible per weight
        return bits / 8
    return bits / 8 + 2 / group_size + (bits / 8) / group_size


def weight_bytes(params: ParamCounts, model_dtype_bytes: int, quant: Quantization) -> int:
    """Bytes the loaded weights occupy, summed over the whole model (all ranks)."""
    if quant.method == "none":
        return params.total * model_dtype_bytes
    roles = {"attention": params.attention, "mlp": params.mlp, "experts": params.experts, "recurrent": params.recurrent}
    quantized = sum(n for role, n in roles.items() if role not in quant.unquantized_roles)
    unquantized_linear = params.linear - quantized
    lm_head_bytes = params.lm_head * (quant.bytes_per_param if quant.quantize_lm_head else model_dtype_bytes)
    return int(
        quantized * quant.bytes_per_param
        + (unquantized_linear + params.embedding + params.other) * model_dtype_bytes
        + lm_head_bytes
    )
