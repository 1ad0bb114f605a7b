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

    def __str__(self) -> str:
        return self.name


# Canonical name -> bytes per element. Aliases map onto these.
_KV_DTYPES: dict[str, KVDtype] = {
    "bfloat16": KVDtype("bfloat16", 2),
    "float16": KVDtype("float16", 2),
    "float32": KVDtype("float32", 4),
    "fp8": KVDtype("fp8", 1),
    "fp8_e4m3": KVDtype("fp8_e4m3", 1),
    "fp8_e5m2": KVDtype("fp8_e5m2", 1),
    "fp8_inc": KVDtype("fp8_inc", 1),
    "fp8_ds_mla": KVDtype("fp8_ds_mla", 1, mla_token_bytes=656),
    "int8": KVDtype("int8", 1),
    # 4-bit caches: half a byte per element plus one fp8 scale per 16 elements (nvfp4's
    # block layout); vLLM 0.33 packs them into uint8 pages of this size.
    "nvfp4": KVDtype("nvfp4", 0.5 + 1 / 16),
    "int4": KVDtype("int4", 0.5),
}

_KV_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "fp4": "nvfp4",
    "nvfp4_kv": "nvfp4",
}

KV_DTYPE_CHOICES = ("auto", *sorted(_KV_DTYPES), *sorted(_KV_ALIASES))

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
    # vLLM 0.33 family names such as nvfp4_e2m1 or fp8_per_token_head: size by prefix.
    for prefix in ("nvfp4", "fp8", "int8", "int4"):
        if key.startswith(prefix):
            return KVDtype(key, _KV_DTYPES[prefix].bytes_per_element)
    raise KvplanError(
        f"unknown KV cache dtype {name!r}",
        "choose one of auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, fp8_ds_mla, nvfp4",
    )
