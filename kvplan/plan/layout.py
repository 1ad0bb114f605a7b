"""From per-rank layer specs to vLLM's KV-cache groups, pages and block counts. Pure.

Follows `vllm/v1/core/kv_cache_utils.py` (0.11.0 unless noted; quotes in
docs/vllm-accounting.md section 4):

- One spec for every layer: a single group, ``num_blocks = avail // page // num_layers``.
- One *type* with different sizes (``UniformTypeKVCacheSpecs``: e.g. MLA plus
  DeepSeek-V3.2's indexer): a single group whose block spans every layer's page,
  ``num_blocks = avail // sum(pages)``.
- Several types (hybrid allocator): ``group_size`` = the fewest layers of any type (0.12+:
  the most, when ``max < 1.25 * min``; 1.5 from 0.18); each type is dealt round-robin into
  ``cdiv(count, group_size)`` groups, short groups padded ("Add N padding layers"); all
  groups share ``group_size`` tensors of one page size: ``num_blocks = avail // page //
  group_size``. Page sizes must match: attention + recurrent-state models raise the attention
  block size until a page holds a state page (:func:`hybrid_block_size`) and pad the state
  page; 0.12+ also unifies attention pages by scaling the smaller pages' block size
  (``unify_kv_cache_spec_page_size``).
- Without the hybrid allocator (before 0.9.2, ``--disable-hybrid-kv-cache-manager``, Llama 4's
  chunked attention before 0.14) sliding/chunked layers are sized as full ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.dtypes import KVDtype
from kvplan.model.layers import MLA, LayerSpec, RequestContext
from kvplan.units import cdiv
from kvplan.vllm.platforms import CUDA, Platform
from kvplan.vllm.rules import VllmRules

# Attention block sizes were rounded to multiples of this when raised for recurrent state
# before vLLM aligned them to the attention backend's kernel block (see `hybrid_block_size`).
ATTENTION_BLOCK_ALIGNMENT = 16




def hybrid_block_size(state_page: int, attention_bytes_per_token: float, block_size: int, platform: Platform,
                      rules: VllmRules, mla: bool = False, head_size: int = 0, blackwell: bool = False) -> int:
    """The attention block size that makes one attention page hold a whole state page:
    ``A * cdiv(state_page, A * attention_page_per_token)``, where the alignment A is

    - 16 up to 0.11.0 (`HybridAttentionMambaModelConfig`);
    - 0.11.1-0.19: 64 for MLA (FlashMLA), 128 for CUTLASS MLA (Blackwell), 32 for head size
      256 on Blackwell, else 16 (`models/config.py`);
    - 0.20+: ``max(the attention backend's kernel block, --block-size)``, at least 128 for MLA
      hybrids from 0.27.1, then rounded to the kernel block (`Platform._align_hybrid_block_size`).
    """
    per_token = int(math.ceil(attention_bytes_per_token))
    if rules.hybrid_block_alignment == "kernel":
        align = max(platform.kernel_block, block_size)
        if mla and rules.mla_hybrid_block_min_128:
            align = max(align, 128)
        needed = align * cdiv(state_page, align * per_token)
        needed = platform.kernel_block * cdiv(needed, platform.kernel_block)
    else:
        align = ATTENTION_BLOCK_ALIGNMENT
        if rules.hybrid_block_alignment == "model":
            if mla:
                align = 128 if blackwell else 64
            elif head_size == 256 and blackwell:
                align = 32
        needed = align * cdiv(state_page, align * per_token)
    return max(block_size, needed)


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group: ``num_layers`` real layers of one spec (plus padding)."""

    spec: LayerSpec
    num_layers: int
    padding_layers: int
    block_size: int

    @property
    def kind(self) -> str:
        return self.spec.kind


@dataclass(frozen=True)
class KVLayout:
    """How one device's KV memory is cut into blocks."""

    groups: tuple[KVGroup, ...]
    page_bytes: int  # one layer's block (the largest, for uniform-type layouts)
    block_bytes: int  # memory one block id takes across the layers it spans
    dtype: KVDtype
    # Uniform-type layouts keep one block table for all their specs (vLLM: one group).
    shared_block_table: bool = False

    @property
    def num_kv_groups(self) -> int:
        """vLLM's ``len(kv_cache_config.kv_cache_groups)``."""
        return 1 if self.shared_block_table else len(self.groups)

    @property
    def min_block_size(self) -> int:
        return min(g.block_size for g in self.groups)

    @property
    def attention_block_size(self) -> int:
        sizes = [g.block_size for g in self.groups if g.spec.grows_with_tokens]
        return min(sizes) if sizes else self.min_block_size

    @property
    def padding_layers(self) -> int:
        return sum(g.padding_layers for g in self.groups)

    @property
    def group_size(self) -> int:
        return self.groups[0].num_layers + self.groups[0].padding_layers

    def num_blocks(self, available_bytes: int) -> int:
        return max(0, int(available_bytes // self.block_bytes))

    def _group_blocks(self, num_tokens: int, ctx: RequestContext) -> list[int]:
        return [g.spec.blocks_for_request(num_tokens, g.block_size, ctx) for g in self.groups]

    def blocks_per_request(self, num_tokens: int, ctx: RequestContext) -> int:
        """Block ids one request of ``num_tokens`` holds, summed over groups."""
        blocks = self._group_blocks(num_tokens, ctx)
        return max(blocks) if self.shared_block_table else sum(blocks)

    def max_len_bytes(self, num_tokens: int, ctx: RequestContext, count_padding: bool) -> int:
        """`check_enough_kv_cache_memory`: KV one request of ``num_tokens`` needs, summed per
        layer (0.14+ counts the padding layers of hybrid groups too)."""
        total = 0
        for g, blocks in zip(self.groups, self._group_blocks(num_tokens, ctx)):
            layers = g.num_layers + (g.padding_layers if count_padding else 0)
            page = g.spec.page_bytes(g.block_size, self.dtype) if self.shared_block_table else self.page_bytes
            total += layers * blocks * page
        return total

    def shared_prefix_blocks(self, prefix_tokens: int) -> int:
        """Blocks prefix caching shares between requests: only full blocks of full-attention
        groups (sliding windows move on; recurrent state is per request)."""
        shared = [prefix_tokens // g.block_size for g in self.groups if g.spec.kind in ("full_attention", "mla")]
        if not shared:
            return 0
        return max(shared) if self.shared_block_table else sum(shared)

    def kv_bytes_per_token(self) -> float:
        """Bytes per token if every token were kept in every attention layer (the headline)."""
        return sum(g.spec.bytes_per_token(self.dtype) * g.num_layers for g in self.groups)


def build_layout(
    specs: list[LayerSpec],
    dtype: KVDtype,
    block_size: int,
    rules: VllmRules,
    hybrid_allocator: bool = True,
    platform: Platform = CUDA,
    blackwell: bool = False,
) -> KVLayout:
    """Group one device's layer specs the way vLLM's KV-cache manager does."""
    if not specs:
        raise KvplanError("this pipeline stage has no KV-holding layers")
    if not (rules.hybrid_allocator and hybrid_allocator):
        specs = [s.without_hybrid_allocator() for s in specs]

    # Hybrid attention + recurrent state: raise the attention block size until one
    # attention page holds at least one state page, then pad the state pages to match.
    attention = [s for s in specs if s.grows_with_tokens]
    states = [s for s in specs if not s.grows_with_tokens]
    if states and attention:
        state_page = max(s.page_bytes(block_size, dtype) for s in states)
        # vLLM sizes the attention page from the model config's head size and KV heads,
        # i.e. the first attention layer's shape.
        first = attention[0]
        block_size = hybrid_block_size(state_page, first.bytes_per_token(dtype), block_size, platform, rules,
                                       mla=isinstance(first, MLA), head_size=getattr(first, "head_size", 0),
                                       blackwell=blackwell)

    by_spec: dict[LayerSpec, int] = {}
    for spec in specs:
        by_spec[spec] = by_spec.get(spec, 0) + 1

    if len(by_spec) == 1:
        spec, count = next(iter(by_spec.items()))
        page = spec.page_bytes(block_size, dtype)
        return KVLayout((KVGroup(spec, count, 0, block_size),), page, page * count, dtype)

    if len({s.uniform_type_key() for s in by_spec}) == 1:
        groups = tuple(KVGroup(spec, count, 0, block_size) for spec, count in by_spec.items())
        pages = [spec.page_bytes(block_size, dtype) * count for spec, count in by_spec.items()]
        return KVLayout(groups, max(s.page_bytes(block_size, dtype) for s in by_spec), sum(pages), dtype,
                        shared_block_table=True)

    pages = {spec: spec.page_bytes(block_size, dtype) for spec in by_spec}
    page = max(pages.values())
    attention_pages = {p for s, p in pages.items() if s.grows_with_tokens}
    if len(attention_pages) > 1:
        if not rules.unify_page_size:
            raise KvplanError(
                "attention layers with different page sizes need vLLM >= 0.12 (page-size unification)"
            )
        if any(page % p for p in attention_pages):
            raise KvplanError("attention page sizes do not divide each other; vLLM cannot unify them")

    counts = list(by_spec.values())
    group_size = min(counts)
    factor = rules.group_size_close_factor
    if factor is not None and max(counts) < factor * min(counts):
        group_size = max(counts)

    groups: list[KVGroup] = []
    for spec, count in by_spec.items():
        # unify_kv_cache_spec_page_size: a smaller attention page gets a larger block size.
        spec_block = block_size * (page // pages[spec]) if spec.grows_with_tokens else block_size
        num_groups = cdiv(count, group_size)
        for g in range(num_groups):  # vLLM deals the layers round-robin: layers[g::num_groups]
            real = len(range(g, count, num_groups))
            groups.append(KVGroup(spec, real, group_size - real, spec_block))
    return KVLayout(tuple(groups), page, page * group_size, dtype)


def with_tp(specs: list[LayerSpec], tp: int) -> list[LayerSpec]:
    """The slice of each layer one tensor-parallel rank holds."""
    return [spec.per_rank(tp) for spec in specs]
