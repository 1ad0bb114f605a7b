"""KV-cache and weight dtypes: names users type, bytes vLLM allocates.

vLLM stores every fp8 variant as one byte (`torch.uint8`, `vllm/utils/torch_utils.py`
`STR_DTYPE_TO_TORCH_DTYPE`); ``auto`` means the model's activation dtype, and from
0.19.1 the checkpoint's own KV scheme when it declares one
(`resolve_kv_cache_dtype_string`). ``fp8_ds_mla`` is DeepSeek-V3.2's packed MLA layout:
656 bytes per token per layer (512 fp8 latent + 4 fp32 scales + 64 bf16 rope dims),
`vllm/v1/attention/backends/mla/flashmla_sparse.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError


@dataclass(frozen=True)
class KVDtype:
    """A KV-cache element type as vLLM sizes it."""

    name: str
    bytes_per_element: float
    # Packed layouts whose size is not elements x bytes (fp8_ds_mla): bytes per token per layer.
    mla_token_bytes: int | None = None
    # Per-token-head quantization keeps one fp32 scale per head for K and one for V
    # (``AttentionSpec.page_size_bytes@0.20``: 2 x block x heads x 4 B).
    head_scale_bytes: int = 0

    def __str__(self) -> str:
        return self.name


# Canonical name -> bytes per element. Aliases map onto these.
_KV_DTYPES: dict[str, KVDtype] = {
    "bfloat16": KVDtype("bfloat16", 2),
    "float16": KVDtype("float16", 2),
    "fp8": KVDtype("fp8", 1),
    "fp8_e4m3": KVDtype("fp8_e4m3", 1),
    "fp8_e5m2": KVDtype("fp8_e5m2", 1),
    "fp8_inc": KVDtype("fp8_inc", 1),
    "fp8_ds_mla": KVDtype("fp8_ds_mla", 1, mla_token_bytes=656),
    "nvfp4_ds_mla": KVDtype("nvfp4_ds_mla", 0.5, mla_token_bytes=352),
    "fp8_per_token_head": KVDtype("fp8_per_token_head", 1, head_scale_bytes=4),
    "int8_per_token_head": KVDtype("int8_per_token_head", 1, head_scale_bytes=4),
    # 4-bit caches (vLLM 0.33): nvfp4 holds h/2 bytes of values plus h/16 bytes of fp8 block
    # scales per head vector; int4 per-token-head h/2 bytes plus a 4-byte scale.
    "nvfp4": KVDtype("nvfp4", 0.5 + 1 / 16),
    "int4_per_token_head": KVDtype("int4_per_token_head", 0.5, head_scale_bytes=4),
}

_KV_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "fp4": "nvfp4",
    "nvfp4_kv": "nvfp4",
}

KV_DTYPE_CHOICES = ("auto", *_KV_DTYPES)

# Weight dtypes as config.json's torch_dtype / dtype spells them.
WEIGHT_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
}


def kv_dtype(name: str) -> KVDtype:
    """Look up a concrete KV dtype (not ``auto``) by any of its names."""
    key = name.strip().lower()
    key = _KV_ALIASES.get(key, key)
    if key in _KV_DTYPES:
        return _KV_DTYPES[key]
    if key == "nvfp4_4over6":  # same page as nvfp4 (vLLM 0.33)
        return KVDtype(key, _KV_DTYPES["nvfp4"].bytes_per_element)
    raise KvplanError(f"unknown KV cache dtype {name!r}", f"choose one of {', '.join(KV_DTYPE_CHOICES)}")
