"""TensorRT-LLM's page math: the bytes a token costs and the tokens a KV budget buys, as its source computes them
(docs/engines-trtllm-rules.md sections 1.4-1.5).

    cell (manager)   = sum over attention layers of ceil(kv_heads / tp) x head_dim x 2 (K, V) x dtype bytes
                       (MLA: (kv_lora_rank + qk_rope_head_dim) x 1 x dtype, on every rank)
                       `KVCacheManager.get_cache_bytes_per_token`, `_torch/pyexecutor/resource_manager.py@b35ac1b`
    cell (estimator) = layers x (kv_heads x head_dim // tp) x 2 x (1 if FP8 KV else 2)
                       `KVCacheManager.get_cache_size_per_token`, same file: what the profiled budget is divided by
    max_tokens       = int(budget) // cell (estimator)            `_util.py@b35ac1b` `configure_kv_cache_capacity`
    blocks           = ceil(max_tokens / tokens_per_block)        `resource_manager.py@b35ac1b` `calculate_max_num_blocks`
    pool             = blocks x tokens_per_block tokens, blocks x tokens_per_block x cell (manager) bytes
                       ("Allocated X GiB for max tokens in paged KV cache (N)", `kvCacheManager.cpp@b35ac1b`)

A TensorRT engine (the C++ runtime, `kvCacheManager.cpp` `calculateMaxNumBlocks`) takes
``max_tokens = int(fraction x available / cell)`` from the free memory it measured ("available"), then the same
blocks. TensorRT-LLM pools every attention layer for the whole sequence unless ``max_attention_window`` is given
(variable sliding windows, VSWA, not modelled here), so a sliding-window layer costs what a full one does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.arch import Architecture
from kvplan.model.dtypes import kv_dtype
from kvplan.model.layers import MLA, FullAttention
from kvplan.units import GiB, cdiv

#: KV dtype names TensorRT-LLM's ``kv_cache_config.dtype`` / ``--kv_cache_dtype`` takes that kvplan prices.
_DTYPES = {"auto", "fp8", "float16", "bfloat16", "fp16", "bf16", "float32"}


@dataclass(frozen=True)
class TrtllmCell:
    """The bytes one token of KV costs on one GPU."""

    manager_bytes: int  # the pool's buffers (what "Allocated X GiB" counts)
    estimator_bytes: int  # what the profiled budget is divided by ("kv size is K")
    dtype: str
    dtype_how: str
    sliding_as_full: bool  # the model has sliding-window layers, pooled here for the whole sequence
    layers: int


def kv_cache_dtype(arch: Architecture, given: str | None) -> tuple[str, str]:
    """The pool's dtype and why: "auto" is the checkpoint's KV quantization (a ModelOpt ``kv_cache_quant_algo``),
    else the model dtype (`_util.py@b35ac1b` `_create_kv_cache_manager`; `validate_and_set_kv_cache_quant`)."""
    name = (given or "auto").strip().lower()
    if name not in _DTYPES:
        raise KvplanError(f"kvplan does not price TensorRT-LLM's KV cache dtype {given!r}",
                          f"use one of {', '.join(sorted(_DTYPES))}")
    if name != "auto":
        return ("fp8" if name == "fp8" else kv_dtype(name).name), "given"
    if arch.checkpoint_kv_dtype == "fp8":
        return "fp8", "auto: the checkpoint's KV quantization"
    model = arch.model_dtype if arch.model_dtype in ("bfloat16", "float16", "float32") else "bfloat16"
    return model, "auto: the model dtype"


def cell_of(arch: Architecture, tp: int = 1, given_dtype: str | None = None, attention_dp: bool = False) -> TrtllmCell:
    """TensorRT-LLM's bytes a token for ``arch`` at tensor parallel ``tp`` (attention DP: heads not split)."""
    if tp < 1:
        raise KvplanError(f"invalid tensor parallel size {tp}")
    split = 1 if attention_dp else tp
    dtype, how = kv_cache_dtype(arch, given_dtype)
    manager_element = kv_dtype(dtype).bytes_per_element
    estimator_element = 1 if dtype == "fp8" else 2  # `get_cache_size_per_token`: 1 for FP8 KV, else 2
    other = sorted({s.kind for s in arch.layers if not isinstance(s, (FullAttention, MLA))})
    if other:
        raise KvplanError(f"kvplan does not size TensorRT-LLM's pool for {', '.join(other)} layers (it sizes attention "
                          "and MLA layers only)")
    manager = estimator = 0
    for spec in arch.layers:
        if isinstance(spec, MLA):
            manager += round(spec.latent_size * manager_element)
            estimator += spec.latent_size * estimator_element
            continue
        heads = cdiv(spec.num_kv_heads, split)  # resource_manager.py: (num_kv_heads + tp_size - 1) // tp_size
        manager += round(heads * (spec.head_size + spec.value_size) * manager_element)
        estimator += (spec.num_kv_heads * spec.head_size // split) * 2 * estimator_element
    sliding = any(s.kind != "full_attention" and isinstance(s, FullAttention) for s in arch.layers)
    return TrtllmCell(manager_bytes=manager, estimator_bytes=estimator, dtype=dtype, dtype_how=how,
                      sliding_as_full=sliding, layers=len(arch.layers))


def blocks_for(max_tokens: int, tokens_per_block: int) -> int:
    """``math.ceil(max_tokens / tokens_per_block)``: the block count rounds up (`calculate_max_num_blocks`)."""
    return cdiv(max(0, int(max_tokens)), tokens_per_block)


def pool_from_budget(budget_bytes: float, cell: TrtllmCell, tokens_per_block: int) -> int:
    """The pool's tokens from the PyTorch backend's profiled budget ("Estimated max memory in KV cache")."""
    return blocks_for(int(budget_bytes) // cell.estimator_bytes, tokens_per_block) * tokens_per_block


def pool_from_max_tokens(max_tokens: int, tokens_per_block: int) -> int:
    """The pool's tokens from a token budget (spring-2025's "Estimated max tokens", or a given max_tokens)."""
    return blocks_for(max_tokens, tokens_per_block) * tokens_per_block


def pool_from_engine_free(available_bytes: float, fraction: float, cell: TrtllmCell, tokens_per_block: int) -> int:
    """A TensorRT engine's pool: ``maxTokens = SizeType32(fraction x available / cell)``, then the blocks
    (`kvCacheManager.cpp` `calculateMaxNumBlocks`)."""
    return blocks_for(int(fraction * available_bytes / cell.manager_bytes), tokens_per_block) * tokens_per_block


def pool_gib(tokens: int, cell: TrtllmCell) -> float:
    """What "Allocated X GiB ... (N)" prints for N tokens (one pool: N x the manager's bytes a token)."""
    return tokens * cell.manager_bytes / GiB


def tokens_in_printed_gib(gib: float, cell: TrtllmCell, tokens_per_block: int, decimals: int = 2) -> tuple[int, int, int]:
    """The block-multiple token counts whose pool prints as ``gib`` (to ``decimals``): (nearest, low, high).
    The printed GiB is the pool's bytes rounded, so these bound the printed "(N)"."""
    half = 0.5 * 10 ** -decimals
    per_block = tokens_per_block * cell.manager_bytes
    nearest = round(gib * GiB / per_block) * tokens_per_block
    low = cdiv(max(0, round((gib - half) * GiB)), per_block) * tokens_per_block
    high = int((gib + half) * GiB) // per_block * tokens_per_block
    return nearest, low, high


__all__ = ["TrtllmCell", "blocks_for", "cell_of", "kv_cache_dtype", "pool_from_budget", "pool_from_engine_free",
           "pool_from_max_tokens", "pool_gib", "tokens_in_printed_gib"]
