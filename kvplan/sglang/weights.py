"""What SGLang holds beside the checkpoint's own tensors once the weights load (part of its "Load weight end ... mem
usage"), for the deployments kvplan has read it for.

MLA's absorbed copies: `DeepseekV2ForCausalLM.post_load_weights` (models/deepseek_v2.py@0.5.3, @0.5.3.post1, the
entry classes DeepseekV2/V3/V32ForCausalLM; the same on CUDA in models/deepseek_common/deepseek_weight_loader.py
`post_load_weights`@0.5.23) splits each loaded layer's kv_b_proj (kv_lora_rank -> heads x
(qk_nope_head_dim + v_head_dim)) into ``w_kc`` and ``w_vc``, new tensors (``.contiguous()`` of a transposed split)
beside kv_b_proj, which stays (the prefill MHA path uses it). On CUDA an FP8 kv_b_proj in 128 x 128 blocks is first
dequantized to bf16 (``block_quant_dequant(..., torch.bfloat16)``), so the copies are 2 bytes a parameter; FP8
without 128 x 128 blocks is requantized per tensor (``block_quant_to_tensor_quant`` /
``channel_quant_to_tensor_quant``: 1 byte); an unquantized, AWQ or int8 kv_b_proj gives 16-bit copies. Other
quantization methods (not read) are priced at 16 bits too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The architectures whose post_load_weights makes w_kc / w_vc (models/deepseek_v2.py@0.5.3 `EntryClass`).
ABSORBING_ARCHS = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"})


def absorbed_kv_b_bytes(config: Mapping[str, Any], attention_tp: int) -> int:
    """Bytes of w_kc + w_vc on one GPU: every loaded layer's kv_b_proj parameters for the heads of its attention
    rank (all heads under DP attention), at the copies' bytes a parameter; 0 for another architecture or a config
    without MLA's fields. The NextN (MTP) layer is not loaded without speculative decoding, so not counted."""
    if not ABSORBING_ARCHS.intersection(config.get("architectures") or ()):
        return 0
    fields = [config.get(k) for k in ("num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                                      "qk_nope_head_dim", "v_head_dim")]
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in fields):
        return 0
    layers, heads, kv_lora, nope, v_head = fields
    per_layer = heads // max(1, attention_tp) * (nope + v_head) * kv_lora
    return layers * per_layer * _copy_bytes_per_param(config.get("quantization_config"))


def _copy_bytes_per_param(quant: Any) -> int:
    """1 for FP8 that post_load_weights requantizes per tensor, else 2 (bf16 from 128 x 128 FP8 blocks, or the
    16-bit weight itself)."""
    if not isinstance(quant, Mapping) or str(quant.get("quant_method", "")).lower() != "fp8":
        return 2
    return 2 if list(quant.get("weight_block_size") or ()) == [128, 128] else 1
