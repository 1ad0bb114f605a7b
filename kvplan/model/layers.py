"""One small spec class per kind of KV-holding layer, as vLLM's `kv_cache_interface.py`.

An :class:`~kvplan.model.arch.Architecture` is a list of these. Each spec is *logical*
(whole-model head counts); :meth:`per_rank` gives the slice one tensor-parallel rank holds,
and everything after that (page size, blocks a request pins) is per device, exactly as
vLLM computes it on each worker. Nothing downstream asks which model it is.

Sources (vLLM, `vllm/v1/kv_cache_interface.py` at v0.11.0 unless noted):
- ``AttentionSpec.page_size_bytes = 2 * block_size * num_kv_heads * head_size * dtype``;
  0.19+ writes the 2 as ``head_size + head_size_v``.
- ``FullAttentionSpec.max_memory_usage_bytes = cdiv(max_model_len, block_size) * page``.
- ``SlidingWindowSpec``: ``(cdiv(min(window - 1 + max_num_batched_tokens, max_model_len),
  block_size) + 1) * page`` (the +1: the window need not start on a block boundary).
- ``ChunkedLocalAttentionSpec``: ``cdiv(min(chunk + max_num_batched_tokens, max_model_len),
  block_size) * page``.
- ``MLAAttentionSpec``: one latent "head" of ``kv_lora_rank + qk_rope_head_dim``, no factor
  2, replicated on every TP rank (`model_executor/layers/mla.py`).
- ``MambaSpec``: one state slot per request whose page is the sum of its state tensors
  (`model_executor/layers/mamba/mamba_utils.py`, ``MambaStateShapeCalculator``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from kvplan.errors import KvplanError
from kvplan.model.dtypes import KVDtype
from kvplan.units import cdiv


@dataclass(frozen=True)
class RequestContext:
    """What, besides its length, decides the blocks one request pins (set by the vLLM rules).

    ``inflight_tokens``: tokens scheduled but not yet retired, which sliding-window and
    chunked layers keep on top of their window (vLLM's ``max_in_flight_tokens``:
    ``max_num_batched_tokens`` times the batches in flight, 2 with async scheduling).
    ``mamba_align``: vLLM's ``mamba_cache_mode == "align"`` (prefix caching on a model with
    recurrent state), where one recurrent layer holds 2 state pages per request plus its
    prefill checkpoints (``MambaSpec.max_memory_usage_bytes``); otherwise 1.
    """

    inflight_tokens: int
    mamba_align: bool = False
    # vLLM 0.26-0.27 "all" mode for models that support it: a state page per block.
    mamba_all: bool = False
    # Variants whose mixer adds a prefill checkpoint page in align mode, by release/device.
    checkpoint_variants: frozenset = frozenset()
    # Decode context parallel: a block of a sharded attention layer holds block_size x dcp
    # tokens (`AttentionSpec.max_num_blocks_per_req`, `resolve_dcp_kv_block_size`).
    kv_shards: int = 1
    # Speculative decoding: state blocks a recurrent layer keeps per request for the drafted tokens
    # (`MambaSpec.num_speculative_blocks` = K, counted by `max_memory_usage_bytes` where the release does).
    speculative_blocks: int = 0


def _kv_heads_per_rank(total_kv_heads: int, tp: int) -> int:
    """vLLM's ``ModelConfig.get_num_kv_heads``: ``max(1, total // tp)``.

    Models assert ``total % tp == 0`` or ``tp % total == 0``; in the second case each KV
    head is replicated on ``tp // total`` ranks (`models/llama.py`).
    """
    if total_kv_heads % tp != 0 and tp % total_kv_heads != 0:
        raise KvplanError(
            f"tensor parallel size {tp} does not divide the {total_kv_heads} KV heads "
            f"(nor do they divide it)",
            "vLLM requires kv_heads % tp == 0 or tp % kv_heads == 0",
        )
    return max(1, total_kv_heads // tp)


def _require_positive(spec: object, *names: str) -> None:
    """A spec's sizes are whole numbers > 0 (a zero or negative size is a broken config)."""
    for name in names:
        value = getattr(spec, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise KvplanError(f"invalid {name} of a {spec.kind} layer: {value!r} (must be a whole number > 0)")


@dataclass(frozen=True)
class LayerSpec:
    """Base class: a layer that keeps per-request state in vLLM's KV cache."""

    kind: ClassVar[str] = "layer"
    # True for specs whose memory grows with the tokens a request holds.
    grows_with_tokens: ClassVar[bool] = True

    def per_rank(self, tp: int) -> LayerSpec:
        raise NotImplementedError

    def bytes_per_token(self, dtype: KVDtype) -> float:
        """KV bytes one token costs in this layer (0 for fixed-size state)."""
        raise NotImplementedError

    def page_bytes(self, block_size: int, dtype: KVDtype) -> int:
        """Bytes of one block of this layer (vLLM's ``page_size_bytes``): ``block_size`` tokens."""
        return int(math.ceil(block_size * self.bytes_per_token(dtype)))

    def blocks_for_request(self, num_tokens: int, block_size: int, ctx: RequestContext) -> int:
        """Blocks one request holding ``num_tokens`` pins in this layer, by vLLM's rule
        (every token kept, unless a kind keeps fewer)."""
        return cdiv(num_tokens, block_size * ctx.kv_shards)

    def describe(self) -> str:
        raise NotImplementedError

    @property
    def fixed_block_size(self) -> int | None:
        """A block size of the layer's own, whatever the cache's (DeepSeek-V4's windows and states); None: the
        cache's."""
        return None

    def uniform_type_key(self) -> tuple:
        """Layers whose keys are equal share one KV group when a model has no other kind
        (``UniformTypeKVCacheSpecs.is_uniform_type``, v1/kv_cache_interface.py@0.32.0: full
        attention of any size, MLA of any size, one window, one chunk). A kind without a rule has
        no grouping vLLM would give it: kvplan refuses to guess."""
        raise NotImplementedError(f"{type(self).__name__} has no KV grouping rule")

    def without_hybrid_allocator(self) -> LayerSpec:
        """What the layer becomes when vLLM's hybrid KV-cache manager is off: windows and chunks
        are kept as full attention (``unify_hybrid_kv_cache_specs``, v1/core/kv_cache_utils.py);
        other kinds stay themselves."""
        return self


@dataclass(frozen=True)
class FullAttention(LayerSpec):
    """Full causal attention (MHA, GQA, MQA): KV grows with every token."""

    kind: ClassVar[str] = "full_attention"
    num_kv_heads: int
    head_size: int
    head_size_v: int | None = None  # differs from head_size in a few models

    def __post_init__(self) -> None:
        _require_positive(self, "num_kv_heads", "head_size", "head_size_v", "window", "chunk")

    @property
    def value_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v

    def per_rank(self, tp: int) -> FullAttention:
        return replace(self, num_kv_heads=_kv_heads_per_rank(self.num_kv_heads, tp))

    def bytes_per_token(self, dtype: KVDtype) -> float:
        per_head = (self.head_size + self.value_size) * dtype.bytes_per_element + 2 * dtype.head_scale_bytes
        return self.num_kv_heads * per_head

    def describe(self) -> str:
        sizes = f"{self.head_size}" if self.head_size_v in (None, self.head_size) else f"{self.head_size} (V {self.head_size_v})"
        return f"{self.num_kv_heads} KV heads x {sizes}"

    def uniform_type_key(self) -> tuple:
        return ("full",)

    def without_hybrid_allocator(self) -> LayerSpec:
        return FullAttention(self.num_kv_heads, self.head_size, self.head_size_v)


@dataclass(frozen=True)
class SlidingWindow(FullAttention):
    """Sliding-window attention: a request keeps only its last ``window`` tokens' KV."""

    kind: ClassVar[str] = "sliding_window"
    window: int = 0

    def blocks_for_request(self, num_tokens: int, block_size: int, ctx: RequestContext) -> int:
        # vLLM keeps the last window-1 computed tokens plus the tokens in flight.
        kept = min(self.window - 1 + ctx.inflight_tokens, num_tokens)
        return cdiv(kept, block_size) + 1

    def describe(self) -> str:
        return f"{super().describe()}, window {self.window:,}"

    def uniform_type_key(self) -> tuple:
        return ("sliding", self.window)


@dataclass(frozen=True)
class ChunkedLocal(FullAttention):
    """Chunked local attention (Llama 4's RoPE layers): attends within fixed chunks."""

    kind: ClassVar[str] = "chunked_local"
    chunk: int = 0

    def blocks_for_request(self, num_tokens: int, block_size: int, ctx: RequestContext) -> int:
        return cdiv(min(self.chunk + ctx.inflight_tokens, num_tokens), block_size)

    def describe(self) -> str:
        return f"{super().describe()}, chunk {self.chunk:,}"

    def uniform_type_key(self) -> tuple:
        return ("chunked", self.chunk)


@dataclass(frozen=True)
class MLA(LayerSpec):
    """Multi-head latent attention (DeepSeek V2/V3, Kimi K2): one compressed latent.

    Stores ``kv_lora_rank + qk_rope_head_dim`` values per token, with no K/V factor 2,
    and the latent is replicated on every tensor-parallel rank.
    """

    kind: ClassVar[str] = "mla"
    latent_size: int  # kv_lora_rank + qk_rope_head_dim

    def __post_init__(self) -> None:
        _require_positive(self, "latent_size")

    def per_rank(self, tp: int) -> MLA:
        return self  # replicated, not sharded

    def bytes_per_token(self, dtype: KVDtype) -> float:
        if dtype.mla_token_bytes is not None:
            return dtype.mla_token_bytes
        return self.latent_size * dtype.bytes_per_element

    def describe(self) -> str:
        return f"latent {self.latent_size}"

    def uniform_type_key(self) -> tuple:
        return ("mla",)  # the indexer's keys too (MLAIndexer)


@dataclass(frozen=True)
class MLAIndexer(MLA):
    """DeepSeek-V3.2's sparse-attention indexer keys: a second MLA-type cache per layer,
    always uint8: ``index_head_dim + index_head_dim // 128 * 4`` bytes per token
    (fp8 values plus one fp32 scale per 128), `models/deepseek_v2.py` (0.11.0)."""

    kind: ClassVar[str] = "mla_indexer"

    def bytes_per_token(self, dtype: KVDtype) -> float:
        return self.latent_size + self.latent_size // 128 * 4

    def describe(self) -> str:
        return f"indexer keys {self.latent_size}"


@dataclass(frozen=True)
class OwnDtype(LayerSpec):
    """A layer whose cache has a dtype of its own, not the cache's: a drafter's layers under the speculative
    config's ``kv_cache_dtype`` (vLLM builds the drafter under a copy of the cache config with that dtype,
    `SpecDecodeBaseProposer._create_draft_vllm_config`, v1/spec_decode/llm_base_proposer.py@0.32.0). Everything
    but the dtype is the wrapped layer's; an unequal page makes vLLM keep it in a uniform-type group."""

    spec: LayerSpec
    dtype: KVDtype

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.spec.kind

    @property
    def grows_with_tokens(self) -> bool:  # type: ignore[override]
        return self.spec.grows_with_tokens

    @property
    def fixed_block_size(self) -> int | None:
        return self.spec.fixed_block_size

    def per_rank(self, tp: int) -> OwnDtype:
        return OwnDtype(self.spec.per_rank(tp), self.dtype)

    def bytes_per_token(self, dtype: KVDtype) -> float:
        return self.spec.bytes_per_token(self.dtype)

    def page_bytes(self, block_size: int, dtype: KVDtype) -> int:
        return self.spec.page_bytes(block_size, self.dtype)

    def blocks_for_request(self, num_tokens: int, block_size: int, ctx: RequestContext) -> int:
        return self.spec.blocks_for_request(num_tokens, block_size, ctx)

    def describe(self) -> str:
        return f"{self.spec.describe()}, {self.dtype.name}"

    def uniform_type_key(self) -> tuple:
        return self.spec.uniform_type_key()

    def without_hybrid_allocator(self) -> LayerSpec:
        return OwnDtype(self.spec.without_hybrid_allocator(), self.dtype)


# --- DeepSeek-V4: compressed attention, its sliding window and compressor states ------------------
#
# A DeepSeek-V4 layer holds up to five caches, each replicated on every rank (one KV head, max_tp_shards 1), in
# vLLM's fp8_ds_mla layout: 448 fp8 NoPE bytes + 64 bf16 RoPE values + 8 UE8M0 scale bytes = 584 B a stored
# state, pages rounded up to 576 B (models/deepseek_v4/attention.py, compressor.py,
# v1/attention/backends/mla/sparse_swa.py, v1/kv_cache_interface.py `_apply_alignment_padding`, all @0.32.0).
# Three carry their own block size (the sliding window 64, the compressor states 4 / 8), so the model's groups
# are packed by vLLM's `_get_packed_kv_cache_groups` (kvplan.plan.layout).

DSV4_STATE_BYTES = 584
DSV4_PAGE_ALIGN = 576


def _aligned(num_bytes: int) -> int:
    return cdiv(num_bytes, DSV4_PAGE_ALIGN) * DSV4_PAGE_ALIGN


@dataclass(frozen=True)
class CompressedMLA(LayerSpec):
    """A DeepSeek-V4 compressed-attention cache: one packed state per ``tokens_per_state`` tokens (the layer's
    compress ratio, 4 or 128) of ``state_bytes``, in blocks of the cache's block size (256)."""

    kind: ClassVar[str] = "compressed_mla"
    tokens_per_state: int
    head_size: int = 512  # the values a state stands for (vLLM's spec head_size)
    state_bytes: int = DSV4_STATE_BYTES

    def __post_init__(self) -> None:
        _require_positive(self, "tokens_per_state", "head_size", "state_bytes")

    def per_rank(self, tp: int) -> CompressedMLA:
        return self  # replicated

    def bytes_per_token(self, dtype: KVDtype) -> float:
        return self.state_bytes / self.tokens_per_state

    def page_bytes(self, block_size: int, dtype: KVDtype) -> int:
        return _aligned(block_size // self.tokens_per_state * self.state_bytes)

    def describe(self) -> str:
        return f"compressed 1:{self.tokens_per_state}, {self.state_bytes} B a state"

    def uniform_type_key(self) -> tuple:
        return ("mla",)


@dataclass(frozen=True)
class CompressedIndexer(CompressedMLA):
    """A C4 layer's indexer keys: ``index_head_dim`` fp8 values and a 4-byte scale per 128 (132 B) a state of 4
    tokens (`DeepseekV4Indexer`, attention.py@0.32.0)."""

    kind: ClassVar[str] = "compressed_indexer"

    def describe(self) -> str:
        return f"indexer keys 1:{self.tokens_per_state}, {self.state_bytes} B a state"


@dataclass(frozen=True)
class SlidingMLA(LayerSpec):
    """A DeepSeek-V4 sliding-window cache (every layer): ``window`` tokens of ``token_bytes`` each, in blocks of
    its own ``own_block_size`` whatever the cache's (`DeepseekV4SWACache`: 64)."""

    kind: ClassVar[str] = "sliding_mla"
    window: int
    own_block_size: int = 64
    head_size: int = 512  # vLLM's spec head_size: the values a token's row stands for
    token_bytes: int = DSV4_STATE_BYTES

    def __post_init__(self) -> None:
        _require_positive(self, "window", "own_block_size", "head_size", "token_bytes")

    def per_rank(self, tp: int) -> SlidingMLA:
        return self

    def bytes_per_token(self, dtype: KVDtype) -> float:
        # Bounded by the window (128 tokens, a compressor's 8): a fixed cost a request pays (its blocks), not one
        # that grows with its context, so the per-token figures leave it out, as they do a recurrent state.
        return 0.0

    def page_bytes(self, block_size: int, dtype: KVDtype) -> int:
        return _aligned(block_size * self.token_bytes)

    def blocks_for_request(self, num_tokens: int, block_size: int, ctx: RequestContext) -> int:
        # SlidingWindowSpec.max_admission_blocks_per_request: the window less one plus the tokens in flight.
        return cdiv(min(self.window - 1 + ctx.inflight_tokens, num_tokens), block_size) + 1

    @property
    def fixed_block_size(self) -> int | None:
        return self.own_block_size

    def describe(self) -> str:
        return f"window {self.window:,}, {self.token_bytes:,} B a token, blocks of {self.own_block_size}"

    def uniform_type_key(self) -> tuple:
        return ("sliding", self.window, self.own_block_size)


@dataclass(frozen=True)
class CompressorState(SlidingMLA):
    """A compressor's running state (`CompressorStateCache`, compressor.py@0.32.0): float32 rows of
    ``2 x coff x head_dim`` over a window of ``coff x ratio`` tokens (coff 2 for ratio 4, else 1), blocks of 4
    (ratio 4) or 8 (ratio 128)."""

    kind: ClassVar[str] = "compressor_state"

    def describe(self) -> str:
        return f"compressor state, window {self.window}, {self.token_bytes:,} B a token, blocks of {self.own_block_size}"


# --- Recurrent state (Mamba, linear attention): one slot per request ------------------


@dataclass(frozen=True)
class StateShapes:
    """Per-rank state tensors of one recurrent layer: shapes and element bytes."""

    shapes: tuple[tuple[int, ...], ...]
    element_bytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(math.prod(s) * b for s, b in zip(self.shapes, self.element_bytes))


def _divide(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise KvplanError(f"tensor parallel size {tp} does not divide {what} ({total})")
    return total // tp


@dataclass(frozen=True)
class MambaState(LayerSpec):
    """A recurrent layer's fixed-size state (conv + SSM / linear-attention state).

    ``variant`` names vLLM's shape calculator; the dims are whole-model values and
    :meth:`shapes` divides them per rank as `MambaStateShapeCalculator` does.
    """

    kind: ClassVar[str] = "mamba"
    grows_with_tokens: ClassVar[bool] = False
    variant: str  # one of VARIANTS
    dims: tuple[tuple[str, int], ...]
    conv_bytes: int = 2  # conv state element size (model dtype by default)
    ssm_bytes: int = 2  # temporal/SSM state element size, as the newest release resolves it
    tp: int = 1
    # How older releases resolve "auto" (kvplan.model.families): policy and the config's value.
    ssm_policy: str = "conv"
    ssm_hint: str | None = None
    all_mode_capable: bool = False  # the family gets Mamba cache mode "all" in 0.26-0.27
    # The config's ``mamba_ssm_dtype`` as spelled (text_config's first), whatever the family: a fact of the checkpoint
    # that SGLang 0.5.9+ reads for every Mamba2-style state (configs/mamba_utils.py@0.5.9 `mamba2_state_dtype`);
    # vLLM's planning does not use it (it reads ``ssm_hint`` by family). None: the config has none.
    config_mamba_ssm_dtype: str | None = None
    # Speculative decoding's K: the conv state keeps K more columns where the mixer verifies drafted tokens
    # (``conv_kernel - 1 + num_spec``, mamba_utils.py; which variants, by release: VllmRules).
    spec_tokens: int = 0

    VARIANTS: ClassVar[tuple[str, ...]] = (
        "mamba1", "mamba2", "gated_delta_net", "kda", "linear_attention", "short_conv")
    # Variants whose temporal state follows --mamba-ssm-cache-dtype.
    SSM_DTYPE_VARIANTS: ClassVar[tuple[str, ...]] = ("mamba1", "mamba2", "gated_delta_net", "kda")

    def __post_init__(self) -> None:
        if self.variant not in self.VARIANTS:
            raise KvplanError(f"unknown recurrent state variant {self.variant!r}")
        for name, value in self.dims:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise KvplanError(f"invalid {name} of a {self.variant} layer: {value!r} (must be a whole number > 0)")

    def per_rank(self, tp: int) -> MambaState:
        shaped = replace(self, tp=tp)
        shaped.shapes()  # validate divisibility now, with a clear error
        return shaped

    def with_spec_tokens(self, k: int, variants: frozenset) -> MambaState:
        """The state with K drafted tokens, where the release's ``variants`` widen their conv state by them."""
        return replace(self, spec_tokens=k) if self.variant in variants else self

    def shapes(self) -> StateShapes:
        d, tp = dict(self.dims), self.tp
        if self.spec_tokens:
            d["d_conv"] = d["d_conv"] + self.spec_tokens  # the conv state keeps d_conv - 1 + K columns
        if self.variant == "mamba1":
            # conv (d_inner/tp, d_conv-1), ssm (d_inner/tp, d_state)
            d_inner = _divide(d["d_inner"], tp, "mamba d_inner")
            conv, ssm = (d_inner, d["d_conv"] - 1), (d_inner, d["d_state"])
        elif self.variant == "mamba2":
            # Groups are replicated when they don't divide by tp: extra_groups_for_head_shards
            # adds tp - n_groups of them (mamba_utils.py).
            n_groups = d["n_groups"]
            if n_groups % tp:
                n_groups = n_groups + (tp - n_groups)
            conv_dim = d["intermediate"] + 2 * n_groups * d["d_state"]
            conv = (_divide(conv_dim, tp, "mamba2 conv dim"), d["d_conv"] - 1)
            ssm = (_divide(d["n_heads"], tp, "mamba heads"), d["head_dim"], d["d_state"])
        elif self.variant == "gated_delta_net":
            conv_dim = 2 * d["k_heads"] * d["k_dim"] + d["v_heads"] * d["v_dim"]
            conv = (_divide(conv_dim, tp, "linear-attention conv dim"), d["d_conv"] - 1)
            ssm = (_divide(d["v_heads"], tp, "linear value heads"), d["k_dim"], d["v_dim"])
        elif self.variant == "kda":
            # Kimi Delta Attention (`MambaStateShapeCalculator.kda_state_shape`): conv over
            # q, k, v projections; recurrent state (heads/tp, head_dim, head_dim).
            conv_dim = d["heads"] * d["head_dim"] + 2 * d["k_heads"] * d["k_dim"]
            conv = (_divide(conv_dim, tp, "KDA conv dim"), d["d_conv"] - 1)
            ssm = (_divide(d["heads"], tp, "KDA heads"), d["head_dim"], d["head_dim"])
        elif self.variant == "linear_attention":
            # MiniMax lightning attention: (heads/tp, head_dim, head_dim), no conv state.
            heads = _divide(d["n_heads"], tp, "linear-attention heads")
            return StateShapes(((heads, d["head_dim"], d["head_dim"]),), (self.ssm_bytes,))
        elif self.variant == "short_conv":
            # LFM2: conv state (hidden/tp, L_cache-1) only.
            hidden = _divide(d["hidden"], tp, "short-conv hidden size")
            return StateShapes(((hidden, d["d_conv"] - 1),), (self.conv_bytes,))
        else:  # pragma: no cover - __post_init__ admits only VARIANTS
            raise KvplanError(f"unknown recurrent state variant {self.variant!r}")
        return StateShapes((conv, ssm), (self.conv_bytes, self.ssm_bytes))

    def state_bytes(self) -> int:
        return self.shapes().total_bytes

    def bytes_per_token(self, dtype: KVDtype) -> float:
        return 0.0

    def page_bytes(self, block_size: int, dtype: KVDtype) -> int:
        return self.state_bytes()

    def blocks_for_request(self, num_tokens: int, block_size: int, ctx: RequestContext) -> int:
        if ctx.mamba_all and self.all_mode_capable:  # 0.26-0.27: a page per block, plus the drafted tokens' (0.22+)
            return cdiv(num_tokens, block_size) + ctx.speculative_blocks
        if ctx.mamba_align or (ctx.mamba_all and not self.all_mode_capable):
            # 2 pages, plus the mixer's prefill checkpoint where it exports one (Mamba-2:
            # `mamba_mixer2.py::get_kv_cache_spec`, num_prefill_checkpoint_blocks=1).
            return 2 + (1 if self.variant in ctx.checkpoint_variants else 0) + ctx.speculative_blocks
        return 1 + ctx.speculative_blocks

    def describe(self) -> str:
        return f"{self.variant} state {self.state_bytes():,} B/request"

    def uniform_type_key(self) -> tuple:
        return ("state", self)  # each state shape is its own type
