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
from collections.abc import Callable
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.dtypes import KVDtype
from kvplan.model.layers import MLA, LayerSpec, RequestContext, SlidingMLA
from kvplan.units import cdiv
from kvplan.vllm.platforms import CUDA, Platform
from kvplan.vllm.rules import VllmRules

# Attention block sizes were rounded to multiples of this when raised for recurrent state
# before vLLM aligned them to the attention backend's kernel block (see `hybrid_block_size`).
ATTENTION_BLOCK_ALIGNMENT = 16




def hybrid_block_size(state_page: int, attention_bytes_per_token: float, block_size: int, platform: Platform,
                      rules: VllmRules, mla: bool = False, head_size: int = 0, blackwell: bool = False,
                      checkpoint_alignment: int = 1) -> int:
    """The attention block size that makes one attention page hold a whole state page:
    ``A * cdiv(state_page, A * attention_page_per_token)``, where the alignment A is

    - 16 up to 0.11.0 (`HybridAttentionMambaModelConfig`);
    - 0.11.1-0.19: 64 for MLA (FlashMLA), 128 for CUTLASS MLA (Blackwell), 32 for head size
      256 on Blackwell, else 16 (`models/config.py`);
    - 0.20+: ``max(the attention backend's kernel block, --block-size)``, at least 128 for MLA
      hybrids from 0.27.1, a multiple of the state mixers' prefill checkpoint alignment in "align" mode
      (``checkpoint_alignment``, 0.33+: `capacity.checkpoint_block_alignment`), then rounded to the kernel block
      (`Platform._align_hybrid_block_size`).
    """
    per_token = int(math.ceil(attention_bytes_per_token))
    if rules.hybrid_block_alignment == "kernel":
        align = max(platform.kernel_block, block_size)
        if mla and rules.mla_hybrid_block_min_128:
            align = max(align, 128)
        align = math.lcm(align, checkpoint_alignment)
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
    # A packed group's layers of several specs (one block table, pages side by side), as (spec, layers); empty:
    # ``num_layers`` layers of ``spec``.
    members: tuple[tuple[LayerSpec, int], ...] = ()

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def layers(self) -> tuple[tuple[LayerSpec, int], ...]:
        return self.members or ((self.spec, self.num_layers),)


@dataclass(frozen=True)
class KVLayout:
    """How one device's KV memory is cut into blocks."""

    groups: tuple[KVGroup, ...]
    page_bytes: int  # one layer's block (the largest, for uniform-type layouts)
    block_bytes: int  # memory one block id takes across the layers it spans
    dtype: KVDtype
    # Uniform-type layouts keep one block table for all their specs (vLLM: one group).
    shared_block_table: bool = False
    # Packed groups (`_packed_layout`): each its own block table and block size, a block id holding the widest
    # group's pages.
    packed: bool = False

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
        if self.packed:  # every group's blocks are whole blocks of the pool (_max_memory_usage_bytes_from_groups)
            return self.block_bytes * sum(self._group_blocks(num_tokens, ctx))
        total = 0
        for g, blocks in zip(self.groups, self._group_blocks(num_tokens, ctx)):
            layers = g.num_layers + (g.padding_layers if count_padding else 0)
            page = g.spec.page_bytes(g.block_size, self.dtype) if self.shared_block_table else self.page_bytes
            total += layers * blocks * page
        return total

    def shared_prefix_blocks(self, prefix_tokens: int) -> int:
        """Blocks prefix caching shares between requests: only full blocks of full-attention
        groups (sliding windows move on; recurrent state is per request)."""
        shared = [prefix_tokens // g.block_size for g in self.groups
                  if g.spec.kind in ("full_attention", "mla", "compressed_mla", "compressed_indexer")]
        if not shared:
            return 0
        return max(shared) if self.shared_block_table else sum(shared)

    def kv_bytes_per_token(self) -> float:
        """Bytes per token if every token were kept in every attention layer (the headline)."""
        return sum(spec.bytes_per_token(self.dtype) * n for g in self.groups for spec, n in g.layers)


def build_layout(
    specs: list[LayerSpec],
    dtype: KVDtype,
    block_size: int,
    rules: VllmRules,
    hybrid_allocator: bool = True,
    platform: Platform = CUDA,
    blackwell: bool = False,
    checkpoint_alignment: int = 1,
) -> KVLayout:
    """Group one device's layer specs the way vLLM's KV-cache manager does. ``checkpoint_alignment``: the
    tokens a hybrid block must be a multiple of for the state mixers' prefill checkpoints (`hybrid_block_size`)."""
    if not specs:
        raise KvplanError("this pipeline stage has no KV-holding layers")
    if any(s.fixed_block_size for s in specs):  # DeepSeek-V4 (its releases checked in capacity.dsv4_cache)
        if not (rules.hybrid_allocator and hybrid_allocator):
            raise KvplanError("DeepSeek-V4 without the hybrid KV-cache manager is not modelled (vLLM then promotes "
                              "its windows to full blocks of 256)", "drop --disable-hybrid-kv-cache-manager")
        return _packed_layout(specs, dtype, block_size)
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
                                       blackwell=blackwell, checkpoint_alignment=checkpoint_alignment)

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


def approximate_gcd(values: list[int], lower_bound: int) -> int:
    """`_approximate_gcd` (v1/core/kv_cache_utils.py@0.32.0): the chunk d >= ``lower_bound`` that rounds the
    values up to multiples of d with the least padding (ties: the larger d)."""
    best, best_pad = max(1, lower_bound), None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def _packed_layout(specs: list[LayerSpec], dtype: KVDtype, block_size: int) -> KVLayout:
    """`_get_packed_kv_cache_groups` (v1/core/kv_cache_utils.py@0.32.0, the same from 0.29), for layers whose
    block sizes differ (DeepSeek-V4's windows and compressor states; its backends lay the cache out block
    outermost). Specs of one block size and type form a bucket (one uniform-type spec); a bucket with as many
    layers of each of its page sizes is *balanced* (a repeating pattern), and the balanced ones are split into
    groups of ``approximate_gcd`` pattern repeats (at least the largest mixed-page balanced bucket's), dealt
    round-robin; the others stay whole. Every group has its own block table; a block id spans the widest group's
    pages: ``num_blocks = avail // max(group page bytes)`` (`_get_kv_cache_bytes_per_block`). Sliding buckets
    are split further to fit that block only when nothing is balanced (`is_state_bucket`)."""
    buckets: dict[tuple, list[LayerSpec]] = {}
    for spec in specs:  # greedy in registration order: the first bucket of the same block size and type
        own = spec.fixed_block_size or block_size
        buckets.setdefault((own, spec.uniform_type_key()), []).append(spec)
    shaped = []  # (block, {page: [spec per layer]}, balanced, most layers of one page)
    for (own, _), layers in buckets.items():
        by_page: dict[int, list[LayerSpec]] = {}
        for spec in layers:
            by_page.setdefault(spec.page_bytes(own, dtype), []).append(spec)
        counts = [len(v) for v in by_page.values()]
        shaped.append((own, by_page, len(set(counts)) == 1, max(counts)))
    floor = max((most for _, by_page, balanced, most in shaped if balanced and len(by_page) > 1), default=0)
    repeats = approximate_gcd([most for *_, balanced, most in shaped if balanced], floor) if floor else None

    def split(balanced: bool, most: int) -> int:
        return cdiv(most, repeats) if balanced and repeats else 1

    def state_bucket(by_page: dict[int, list[LayerSpec]]) -> bool:
        return repeats is None and isinstance(next(iter(by_page.values()))[0], SlidingMLA)

    def widest(by_page: dict[int, list[LayerSpec]], n: int) -> int:
        return sum(cdiv(len(v), n) * page for page, v in by_page.items())

    anchor = max(widest(by_page, sum(map(len, by_page.values())) if state_bucket(by_page) else split(balanced, most))
                 for _, by_page, balanced, most in shaped)
    groups: list[KVGroup] = []
    for own, by_page, balanced, most in shaped:
        n = split(balanced, most)
        if anchor and state_bucket(by_page):
            first_page = next(iter(by_page))
            n = max(n, cdiv(sum(map(len, by_page.values())), max(anchor // first_page, 1)))
        repeats_of = list(zip(*by_page.values())) if n > 1 else [tuple(s for v in by_page.values() for s in v)]
        for i in range(n):
            layers = [s for repeat in repeats_of[i::n] for s in repeat]
            members: dict[LayerSpec, int] = {}
            for spec in layers:
                members[spec] = members.get(spec, 0) + 1
            groups.append(KVGroup(layers[0], len(layers), 0, own, tuple(members.items())))
    group_bytes = [sum(spec.page_bytes(g.block_size, dtype) * k for spec, k in g.layers) for g in groups]
    page = max(spec.page_bytes(g.block_size, dtype) for g in groups for spec, _ in g.layers)
    return KVLayout(tuple(groups), page, max(group_bytes), dtype, packed=True)


def map_distinct(fn: Callable[[LayerSpec], LayerSpec], specs: list[LayerSpec]) -> list[LayerSpec]:
    """``[fn(spec) for spec in specs]``, with ``fn`` called once per distinct spec (specs are frozen, so equal ones
    map alike). Why: a model's layers repeat a few shapes, and `fit`'s search builds thousands of layouts (94 layers
    each for Qwen3-235B-A22B: 426,572 copies of a spec for one model's test, 11.0 s, against 2.5 s)."""
    mapped: dict[LayerSpec, LayerSpec] = {}
    for spec in specs:
        if spec not in mapped:
            mapped[spec] = fn(spec)
    return [mapped[spec] for spec in specs]


def with_tp(specs: list[LayerSpec], tp: int) -> list[LayerSpec]:
    """The slice of each layer one tensor-parallel rank holds."""
    return map_distinct(lambda spec: spec.per_rank(tp), specs)
