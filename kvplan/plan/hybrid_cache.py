"""What vLLM's hybrid KV cache caches and hits: full-attention, sliding-window, chunked-local and recurrent-state
(Mamba / linear attention in "align" mode) groups sharing one block pool. Pure.

Follows vLLM 0.32.0: `v1/core/kv_cache_coordinator.py` (HybridKVCacheCoordinator),
`v1/core/single_type_kv_cache_manager.py` (FullAttentionManager, SlidingWindowManager,
ChunkedLocalAttentionManager, MambaManager), `v1/core/kv_cache_manager.py` (`allocate_slots`),
`v1/core/block_pool.py` and `v1/core/sched/scheduler.py` (`_mamba_block_aligned_split`).

- **Groups.** Every group has its own block table and takes its own blocks from the one pool (block 0 is
  the null block): a request holding ``n`` tokens pins ``cdiv(n, B)`` blocks in a full-attention group and
  in a sliding-window group only the blocks its window still needs. Groups of one spec (one window) are
  looked up together (`SpecGroup`): a block position hits only when every one of them has it cached.
- **Blocks that slide out.** Before each allocation (`allocate_slots`, running requests every step) a
  sliding-window group frees the blocks wholly before the window of the next token (``computed - window + 1``
  tokens skipped, `get_num_skipped_tokens`) and puts the null block in their place; a chunked-local group
  frees the blocks of the chunks before the current one. A hit's skipped blocks are nulls, never touched.
- **What a sliding-window group caches.** `reachable_block_mask` with vLLM's default
  ``prefix_cache_retention_interval`` 0 (`CacheConfig`): only the ``cdiv(window - 1, B)`` blocks ending at
  the request's replay boundary (its prompt less one token, aligned down to the block) and at a shared-prefix
  junction (a longer prefix the full-attention groups hit than the window groups could: `get_computed_blocks`'
  ``shared_prefix_boundary``). Its other blocks hold no hash: freed, they go to the head of the free queue.
  ``None`` caches every block; a positive interval also keeps a window tail once per interval.
- **Recurrent state, "align" mode** (`MambaManager` with ``mamba_cache_mode == "align"``, the hybrids' mode
  when prefix caching is on; the attention block size is raised until a page holds a state page, and every
  group then has that block size, so the hash block is the block and no partial hit exists). Block ``i`` of
  a state group's table holds the state after ``(i + 1) * B`` tokens. `allocate_new_blocks` gives a request
  one block, at index ``cdiv(tokens, B) - 1``, whenever its tokens need a new index, nulls before it, and
  remembers the block it copies the state from (`last_state_block_idx`); `get_num_blocks_to_allocate`
  counts at most that 1 (plus a hit sitting in the free queue), admission's full-sequence check included.
  `remove_skipped_blocks` frees every state before the last computed token's block (`get_num_skipped_tokens`
  = computed - 1), nulls passed over, and the copied-from state once past its block: a request holds at most
  2 state blocks. `cache_blocks` offers a full state block like a window's (`reachable_block_mask`: at the
  default interval 0 only the block ending on the replay boundary or the junction, one block each; None
  every block, a positive interval one per segment); a state block is non-null there only when a prefill
  chunk ended on that block, which is why the scheduler cuts chunks (`_mamba_block_aligned_split`,
  :func:`mamba_aligned_chunk`): a chunk short of the prefill's end ends on a block boundary, and none runs past
  ``(num_tokens - 1) // B * B`` (the replay boundary's state) or the block-floored junction. The hit
  (`find_longest_cache_hit`) is the last cached state at or before the other groups' hit, scanned from the
  right, nulls before it. A state hashed in this step (`cached_blocks_this_step`, re-registered by each
  `cache_blocks` whose computed tokens, rounded down to the block, end on the replay boundary:
  `_cache_partial_tail_block`) cannot be hit until the next step: admission fails (`get_num_blocks_to_allocate`
  returns more than the pool).
- **Mamba-2's prefill checkpoint page** (0.32+: `MambaMixer2.get_kv_cache_spec`,
  model_executor/layers/mamba/mamba_mixer2.py, ``num_prefill_checkpoint_blocks=1``, alignment 1). A chunk
  ``start..end`` that reaches the prefill's end (``max(prompt, num_tokens - 1)``), starts on a block, and has
  the checkpoint position ``(end - 1) // B * B`` (`get_mamba_prefill_checkpoint_position`) at least a block past
  its start (`is_mamba_prefill_checkpoint_valid`) exports that state from inside itself (the worker's
  `compute_mamba_prefill_checkpoints`), so the split (:func:`mamba_aligned_chunk`) no longer stops at the replay
  boundary or the next block boundary (a junction still stops it). The manager (`_needs_internal_checkpoint`,
  when the request holds no block at ``cdiv(end, B) - 2``) then counts and takes 2 new blocks in that chunk
  (`get_num_blocks_to_allocate`'s cap 1 + 1, admission's full-sequence check included; `allocate_new_blocks`:
  nulls up to the checkpoint's index, then the checkpoint's block and the running state's): with a hit, a
  request holds 3 state blocks until its first decode step retires the hit's and the checkpoint's.
  `_cache_partial_tail_block` keeps the checkpoint's block cached (the block mask has already hashed it) when
  it is the prompt's replay boundary, a retention segment's end or the junction, and takes the hash off it
  otherwise (a resumed request's). With a retention interval other than 0 the coordinator passes
  ``prefill_end`` 0 (v1/core/kv_cache_coordinator.py), so any chunk may carry one; the split is unchanged.
  What a hit can end on is unchanged: the replay boundary's state, a junction's, or a retained one.
- **Qwen GDN's prefill checkpoint page** (0.33+, FlashInfer's GDN prefill, the auto choice on Hopper:
  `QwenGatedDeltaNet.get_kv_cache_spec`, model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py@0.33.0 and
  @0.34.0) is Mamba-2's rule with one more condition: ``(position - start) % grid == 0``
  (`is_mamba_prefill_checkpoint_valid`, v1/kv_cache_interface.py@0.33.0), the grid being
  `get_mamba_prefill_checkpoint_grid`: the Mamba block size unless ``--prefix-match-unit`` is set (kvplan has no
  such setting). With every group on one block size (else refused below) the hash block is the block, so a chunk
  that starts on a block and a checkpoint position on one are a whole number of grids apart: the condition always
  holds. What GDN changes is the block itself, a multiple of 64 tokens in "align" mode
  (`capacity.checkpoint_block_alignment`).
- **The hit every group agrees on.** Full attention first (its longest run of cached blocks from the start),
  then each other spec no further than that: a sliding window needs ``cdiv(window - 1, B)`` cached blocks in a
  row ending at the hit (scanned from the right), or every block from the start of a shorter one; a chunked
  group needs the blocks of the last chunk; a state group its last cached state. Any spec that shortens the
  hit makes the others look again, until none does (one pass when there are two specs, full attention one of
  them); full-attention hits are cut to it.
- **Admission** (`full_sequence_must_fit`) reserves a sliding-window group at most
  ``cdiv(min(window - 1 + max_in_flight_tokens, max_model_len), B) + 1`` blocks (chunked: ``cdiv(min(chunk +
  max_in_flight_tokens, max_model_len), B)``: `max_admission_blocks_per_request`), a state group 1.

Not modelled (refused by `HybridGroups.of_layout`): recurrent state outside "align" mode (0.26-0.27's "all"),
state groups with and without a checkpoint page together, or with speculative decoding's state blocks; groups
of different block sizes (hashes finer than a group's block, `resolve_block_hashes`, and with them the state
groups' copy-on-write partial hits); DeepSeek-V4's packed groups, EAGLE's dropped block, a KV connector, async
scheduling's tokens in flight (blocks are freed on the processed-token basis: one step later),
`long_prefill_token_threshold`, `enable_mamba_shared_prefix_checkpoint`.
The state-group rules were read at 0.32.0 and are applied to every release with "align" mode, GDN's checkpoint
page (0.33+ only) included (0.33.0 differs: `_cache_partial_tail_block` no longer re-registers a state already
keyed at the replay boundary, so it is not deferred as cached in this step; not followed).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.plan.block_pool import BlockPool
from kvplan.units import cdiv

FULL, SLIDING, CHUNKED, MAMBA = "full", "sliding", "chunked", "mamba"

#: kvplan's layer kinds (kvplan.model.layers) as vLLM's managers treat them.
MANAGER_OF_KIND = {"full_attention": FULL, "mla": FULL, "mla_indexer": FULL, "sliding_window": SLIDING,
                   "chunked_local": CHUNKED}


@dataclass(frozen=True)
class CacheGroup:
    """One KV cache group: ``full`` attention, a ``sliding`` window of ``span`` tokens, ``chunked`` local
    attention in chunks of ``span`` tokens, or ``mamba``: recurrent state in "align" mode (no span);
    ``checkpoint``: its mixer exports the prompt's boundary state inside the last prefill chunk into an extra
    page (Mamba-2, `MambaSpec.num_prefill_checkpoint_blocks` 1, alignment 1)."""

    kind: str
    span: int = 0
    checkpoint: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (FULL, SLIDING, CHUNKED, MAMBA):
            raise KvplanError(f"unknown KV cache group kind {self.kind!r}")
        if self.kind not in (FULL, MAMBA) and self.span < 1:
            raise KvplanError(f"a {self.kind} group needs a window / chunk of >= 1 token")
        if self.checkpoint and self.kind != MAMBA:
            raise KvplanError("only a recurrent-state group has a prefill checkpoint page")


@dataclass(frozen=True)
class HybridGroups:
    """A model's KV cache groups, in vLLM's order, all of ``block_size`` tokens a block.

    ``max_in_flight_tokens``: `VllmConfig.max_in_flight_tokens` (batches in flight x max_num_batched_tokens),
    the admission cap of window groups; ``retention_interval``: `CacheConfig.prefix_cache_retention_interval`
    (0, vLLM's default: window tails at replay boundaries and junctions only; None: every block)."""

    groups: tuple[CacheGroup, ...]
    block_size: int
    max_model_len: int
    max_in_flight_tokens: int
    retention_interval: int | None = 0

    def __post_init__(self) -> None:
        if not self.groups or self.block_size < 1 or self.max_model_len < 1 or self.max_in_flight_tokens < 1:
            raise KvplanError("hybrid KV cache groups need >= 1 group, a block size, max_model_len and "
                              "max_in_flight_tokens >= 1")
        r = self.retention_interval
        if r is not None and (r < 0 or r % self.block_size):
            raise KvplanError(f"invalid prefix_cache_retention_interval {r}",
                              f"vLLM takes 0 or a multiple of the block size ({self.block_size})")

    @property
    def full_attention_only(self) -> bool:
        """One group of full attention: the plain simulator's pool (kvplan.plan.simulate)."""
        return len(self.groups) == 1 and self.groups[0].kind == FULL

    def describe(self) -> str:
        parts = []
        for g in dict.fromkeys(self.groups):
            n = self.groups.count(g)
            what = ("full attention" if g.kind == FULL
                    else "recurrent state (align, checkpoint page)" if g.kind == MAMBA and g.checkpoint
                    else "recurrent state (align)" if g.kind == MAMBA else f"{g.kind} {g.span:,}")
            parts.append(f"{n} x {what}" if n > 1 else what)
        return " + ".join(parts)

    @property
    def has_mamba(self) -> bool:
        """A recurrent-state group: the scheduler cuts prefill chunks for it (`mamba_aligned_chunk`)."""
        return any(g.kind == MAMBA for g in self.groups)

    @property
    def mamba_checkpoint(self) -> bool:
        """Every recurrent-state group has a prefill checkpoint page: the scheduler's
        ``mamba_has_prefill_checkpoint_blocks`` (v1/core/sched/scheduler.py@0.32.0), which lets the prompt's
        last chunk run past its replay boundary."""
        states = [g for g in self.groups if g.kind == MAMBA]
        return bool(states) and all(g.checkpoint for g in states)

    @classmethod
    def of_capacity(cls, cap) -> HybridGroups:
        """The groups of a kvplan.plan.capacity.Capacity (its limiting stage's layout, its max_model_len and
        tokens in flight, its Mamba cache mode); a KvplanError for what is not modelled."""
        ctx = cap.request_context
        return cls.of_layout(cap.layout, cap.max_model_len, ctx.inflight_tokens, mamba_align=ctx.mamba_align,
                             checkpoint_variants=ctx.checkpoint_variants, speculative_blocks=ctx.speculative_blocks)

    @classmethod
    def of_layout(cls, layout, max_model_len: int, max_in_flight_tokens: int,
                  retention_interval: int | None = 0, mamba_align: bool = False,
                  checkpoint_variants: frozenset = frozenset(), speculative_blocks: int = 0) -> HybridGroups:
        """The groups of a kvplan.plan.layout.KVLayout; a KvplanError for what is not modelled (see the module
        doc), naming it. A recurrent-state group is modelled in "align" mode (``mamba_align``) only, without
        the prefill checkpoint page its mixer may add (``checkpoint_variants``: kvplan.model.layers
        RequestContext) and without speculative blocks."""
        if layout.packed:
            raise KvplanError("the prefix cache of DeepSeek-V4's packed KV groups (windows and compressor states of "
                              "their own block sizes) is not modelled")
        specs = list(layout.groups)
        if layout.shared_block_table:  # one group, one block table, one spec type (UniformTypeKVCacheSpecs)
            specs = specs[:1]
        groups, missing = [], set()
        for g in specs:
            if g.spec.kind == MAMBA:
                why = _unmodelled_state(g.spec, mamba_align, checkpoint_variants, speculative_blocks)
                if why:
                    raise KvplanError(f"the prefix cache of mamba KV groups ({g.spec.variant}) {why} is not modelled; "
                                      "kvplan would otherwise give full attention's hits, which this model does not "
                                      "get")
                groups.append(CacheGroup(MAMBA, checkpoint=g.spec.variant in checkpoint_variants))
                continue
            manager = MANAGER_OF_KIND.get(g.spec.kind)
            if manager is None:
                missing.add(g.spec.kind)
                continue
            span = getattr(g.spec, "window", 0) if manager == SLIDING else getattr(g.spec, "chunk", 0)
            groups.append(CacheGroup(manager, span if manager != FULL else 0))
        if missing:
            raise KvplanError(f"the prefix cache of {', '.join(sorted(missing))} KV groups is not modelled; "
                              "kvplan would otherwise give full attention's hits, which this model does not get")
        if len({g.checkpoint for g in groups if g.kind == MAMBA}) > 1:
            raise KvplanError("recurrent-state groups with and without a prefill checkpoint page: their prefix cache "
                              "(the scheduler then splits as without one, the managers reserve it) is not modelled")
        sizes = {g.block_size for g in specs}
        if len(sizes) > 1:
            raise KvplanError(f"KV groups of different block sizes ({', '.join(map(str, sorted(sizes)))}): their "
                              "prefix cache (hashes finer than a group's block) is not modelled")
        return cls(tuple(groups), sizes.pop(), max_model_len, max_in_flight_tokens, retention_interval)


#: Mixers whose prefill checkpoint page kvplan models: Mamba-2's (`MambaMixer2.get_kv_cache_spec`,
#: model_executor/layers/mamba/mamba_mixer2.py@0.32.0: ``num_prefill_checkpoint_blocks=1,
#: prefill_checkpoint_alignment=1``) and Qwen GDN's (qwen_gdn_linear_attn.py@0.33.0: alignment the prefix-cache
#: grid, which one block size makes Mamba-2's rule: see the module doc).
MODELLED_CHECKPOINTS = frozenset({"mamba2", "gated_delta_net"})


def checkpoint_position(num_tokens: int, block_size: int) -> int:
    """`get_mamba_prefill_checkpoint_position` (v1/kv_cache_interface.py@0.32.0), no EAGLE, the hash block the
    block: the last block boundary before the last token (one token is left to recompute on a resend)."""
    return max((num_tokens - 1) // block_size * block_size, 0)


def checkpoint_valid(start: int, end: int, position: int, block_size: int) -> bool:
    """`is_mamba_prefill_checkpoint_valid` (v1/kv_cache_interface.py@0.32.0) with the hash block and the state
    block both ``block_size`` and Mamba-2's alignment 1: whether a chunk of tokens ``start..end`` can export
    the state at ``position`` from inside itself: it starts on a block, the position lies inside it at least a
    block past its start, and the position's block (``cdiv(end, B) - 2``) is past the initial state's."""
    B = block_size
    return (start % B == 0 and cdiv(end, B) - 2 > (start - 1) // B and start + B <= position
            and start < position < end)


def _unmodelled_state(spec, mamba_align: bool, checkpoint_variants: frozenset, speculative_blocks: int) -> str:
    """Why a recurrent-state group's prefix cache is not modelled ('' when it is)."""
    if not mamba_align:
        return "outside mamba_cache_mode 'align' (vLLM's 'all' mode caches a state at every block)"
    if spec.variant in checkpoint_variants and spec.variant not in MODELLED_CHECKPOINTS:
        return "with a prefill checkpoint page kvplan has not read"
    if speculative_blocks:
        return "with speculative decoding's extra state blocks"
    return ""


def mamba_aligned_chunk(start: int, num_new_tokens: int, prompt: int, num_tokens: int, block_size: int,
                        max_prefill_tokens: int, junction: int = 0, checkpoint: bool = False) -> int:
    """`Scheduler._mamba_block_aligned_split` (v1/core/sched/scheduler.py@0.32.0) with the hash block equal to
    the block, no EAGLE, no junction checkpoint: the tokens a prefill chunk from ``start`` may schedule of
    ``num_new_tokens`` so that it ends where a state must be cached. A chunk that stops before the prefill's
    end stops on a block boundary (down to 0 tokens when the budget holds no whole block and a block fits
    ``max_prefill_tokens``); no chunk runs past the next block boundary when it starts mid-block, past the last
    block-aligned position before the last token (``(num_tokens - 1) // B * B``: the replay boundary's
    state), or past the block-floored shared-prefix junction.

    ``checkpoint`` (every state group has a prefill checkpoint page: Mamba-2): a chunk that reaches the
    prefill's end and can export the state at ``checkpoint_position(prefill_end)`` from inside itself
    (`checkpoint_valid`) is not cut at the replay boundary nor at the next block boundary; the junction still
    cuts it."""
    B = block_size
    prefill_end = max(prompt, num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    last_cache_position = checkpoint_position(num_tokens, B)
    end = start + num_new_tokens
    internal = (checkpoint and end >= prefill_end
                and checkpoint_valid(start, end, checkpoint_position(prefill_end, B), B))
    if internal:
        last_cache_position = 0
    if end < prefill_end:
        aligned_end = end // B * B
        if aligned_end > start or max_prefill_tokens >= B:
            end = aligned_end
    stops = (
        (start // B + 1) * B if start % B and not internal else 0,
        last_cache_position,
        start + (junction - start) // B * B if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


class _StateTable(list):
    """A recurrent-state group's block table (a list, 0 the null block) and what `MambaManager` keeps beside
    it in align mode: the index of the state block the last allocation copied from (``last_state``,
    `last_state_block_idx`), the blocks already retired (`_num_retired_blocks`), whether it has allocated
    (`_allocated_block_reqs`) and the prefill checkpoint of its last allocation (`_checkpoints`: the state
    position and the block it is exported into; None: none)."""

    __slots__ = ("last_state", "retired", "allocated", "checkpoint")

    def __init__(self, blocks=()):
        super().__init__(blocks)
        self.last_state: int | None = None
        self.retired = 0
        self.allocated = False
        self.checkpoint: tuple[int, int] | None = None


class HybridCache:
    """The per-group rules over one BlockPool, as `allocate_slots` and the coordinator apply them. A request's
    state is its block tables (one list per group, 0 the null block) and how many leading blocks of each it
    offered the cache; the caller keeps both. Pool keys are ``(group, block hash id)`` (vLLM's
    BlockHashWithGroupId)."""

    def __init__(self, hg: HybridGroups, pool: BlockPool):
        self.hg, self.pool, self.B = hg, pool, hg.block_size
        B = self.B
        self.kinds = [g.kind for g in hg.groups]
        self.spans = [g.span for g in hg.groups]
        # Blocks in a row a window hit needs (`_contiguous_blocks_for_hit`, no EAGLE).
        self.need = [cdiv(g.span - 1, B) if g.kind == SLIDING else 0 for g in hg.groups]
        self.moving = [g for g, group in enumerate(hg.groups) if group.kind != FULL]  # groups that let blocks go
        self.stateless = MAMBA not in self.kinds  # (a running request's new blocks are then one count a group)
        cap_tokens = hg.max_in_flight_tokens
        # (A state group's: the running state block and the one it was copied from, plus the prefill
        # checkpoint's, the 2 + 1 pages of `MambaSpec.max_memory_usage_bytes` in align mode; admission itself
        # reserves 1, or 2 with a checkpoint, `blocks_to_allocate`.)
        self.cap: list[int | None] = [
            cdiv(min(g.span - 1 + cap_tokens, hg.max_model_len), B) + 1 if g.kind == SLIDING
            else cdiv(min(g.span + cap_tokens, hg.max_model_len), B) if g.kind == CHUNKED
            else 2 + g.checkpoint if g.kind == MAMBA else None
            for g in hg.groups]
        self.checkpoints = [g.checkpoint for g in hg.groups]
        # Hashes a state group cached in this step (`MambaManager.cached_blocks_this_step`): a hit ending on one
        # waits for the next step (`new_step`).
        self.cached_this_step: set = set()
        self.states = [g for g, group in enumerate(hg.groups) if group.kind == MAMBA]
        self.has_state = bool(self.states)
        # Spec groups (`verify_and_split_kv_cache_groups`): equal specs looked up together, full attention first.
        specs: dict[CacheGroup, list[int]] = {}
        for i, g in enumerate(hg.groups):
            specs.setdefault(g, []).append(i)
        self.specs = sorted(specs.items(), key=lambda item: item[0].kind != FULL)
        self.simple = len(self.specs) == 2 and self.specs[0][0].kind == FULL

    # ------------------------------------------------------------------ lookups

    def _found(self, key: Hashable, gids: list[int]) -> list[int] | None:
        """`get_cached_block`: the block of each group, or None when one of them misses."""
        first = self.pool.first
        out = []
        for g in gids:
            block = first.get((g, key))
            if block is None:
                return None
            out.append(block)
        return out

    def _spec_hit(self, spec: CacheGroup, gids: list[int], keys: Sequence[Hashable], max_length: int):
        """One spec's `find_longest_cache_hit`: its groups' hit blocks (0 for skipped ones) and the hit length."""
        B, n = self.B, max_length // self.B
        found = self._found
        if spec.kind == FULL:
            tables: list[list[int]] = [[] for _ in gids]
            for key in keys[:n]:
                blocks = found(key, gids)
                if blocks is None:
                    break
                for t, b in zip(tables, blocks):
                    t.append(b)
            return tables, len(tables[0]) * B
        if spec.kind == MAMBA:  # `MambaManager.find_longest_cache_hit`: the last cached state, nulls before it
            for i in range(n - 1, -1, -1):
                blocks = found(keys[i], gids)
                if blocks is not None:
                    return [[0] * i + [b] for b in blocks], (i + 1) * B
            return [[] for _ in gids], 0
        if spec.kind == CHUNKED:
            start = (max_length // spec.span * spec.span) // B if max_length > 0 else 0
            tables = [[0] * start for _ in gids]
            for i in range(start, n):
                blocks = found(keys[i], gids)
                if blocks is None:
                    break
                for t, b in zip(tables, blocks):
                    t.append(b)
            return tables, len(tables[0]) * B
        need = cdiv(spec.span - 1, B)
        tables = [[0] * n for _ in gids]
        run, matched = 0, False
        for i in range(n - 1, -1, -1):  # from the right: the first `need` cached blocks in a row
            blocks = found(keys[i], gids)
            if blocks is None:
                run = 0
                continue
            for t, b in zip(tables, blocks):
                t[i] = b
            run += 1
            if run >= need:
                for t in tables:
                    del t[i + run:]
                matched = True
                break
        if not matched:  # fewer than `need` from the very start: all of them are the window
            for t in tables:
                del t[run:]
        return tables, len(tables[0]) * B

    def lookup(self, keys: Sequence[Hashable], max_length: int) -> tuple[list[list[int]], int, int]:
        """`HybridKVCacheCoordinator.find_longest_cache_hit` + `get_computed_blocks`: each group's hit blocks,
        the hit length every group agrees on, and the shared-prefix junction (the longest one spec hit when
        longer than the agreed hit, else 0)."""
        G = len(self.kinds)
        hits: list[list[int] | None] = [None] * G
        lengths = [0] * G
        hit_length, longest = max_length, 0
        while True:
            curr = hit_length
            for spec, gids in self.specs:
                if spec.kind == FULL and hits[gids[0]] is not None:  # downward-closed: looked up once
                    curr = min(curr, lengths[gids[0]])
                    continue
                tables, curr = self._spec_hit(spec, gids, keys, curr)
                for g, t in zip(gids, tables):
                    hits[g], lengths[g] = t, curr
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if self.simple:
                break
        out = [t if t is not None else [] for t in hits]
        for g, kind in enumerate(self.kinds):
            if kind == FULL:
                del out[g][cdiv(hit_length, self.B):]
        return out, hit_length, (longest if longest > hit_length else 0)

    # ------------------------------------------------------------------ allocation

    def skipped_tokens(self, g: int, computed: int) -> int:
        """`get_num_skipped_tokens`: tokens before the window (chunk) of the next token."""
        kind = self.kinds[g]
        if kind == SLIDING:
            return max(0, computed - self.spans[g] + 1)
        if kind == CHUNKED:
            return computed // self.spans[g] * self.spans[g]
        if kind == MAMBA:  # only the last computed token's state is needed
            return max(0, computed - 1)
        return 0

    def new_step(self) -> None:
        """`KVCacheManager.new_step_starts`: the states cached in the last step may be hit from now on."""
        self.cached_this_step.clear()

    def checkpoint_at(self, table: Sequence[int], start: int, end: int, prefill_end: int) -> int:
        """`MambaManager._needs_internal_checkpoint` on the position `get_num_blocks_to_allocate` keys it on
        (v1/core/single_type_kv_cache_manager.py@0.32.0): the state position a chunk of tokens ``start..end``
        reaching the prefill's end exports from inside itself, into block ``cdiv(end, B) - 2`` when the
        request holds no block there yet; 0 for none. (Keyed on the chunk's end, where the scheduler's split
        keys on the prefill's end: they differ only for a resumed request.) Outside the default retention every
        chunk publishes a state, so any chunk may carry one (`KVCacheCoordinator.get_num_blocks_to_allocate`
        passes ``prefill_end`` 0, v1/core/kv_cache_coordinator.py@0.32.0), the split still the prefill end's."""
        B = self.B
        if self.hg.retention_interval != 0:
            prefill_end = 0
        position, index = checkpoint_position(end, B), cdiv(end, B) - 2
        if end < prefill_end or index < 0 or not checkpoint_valid(start, end, position, B):
            return 0
        return position if index >= len(table) or not table[index] else 0

    def blocks_to_allocate(self, tables: list[list[int]] | None, num_tokens: int, hits: list[list[int]],
                           computed: int, capped: bool = False, *, prefill_end: int, kv_only: bool = False) -> int:
        """`KVCacheCoordinator.get_num_blocks_to_allocate` summed over the groups: new blocks, plus hits that sit
        in the free queue (touching them takes them out of it). ``tables``: a running request's (no hits then);
        None for one being admitted. ``capped``: the full-sequence admission check's per-group cap.
        ``prefill_end``: the request's ``max(num_prompt_tokens, num_tokens - 1)`` (a checkpoint needs a chunk
        reaching it). ``kv_only``: the blocks alone, not the refusal of a hit on a state cached in this step."""
        B, ref, total = self.B, self.pool.ref, 0
        if tables is not None and not capped and self.stateless:  # a running request: the loop below, inline
            required = cdiv(num_tokens, B)
            return sum(required - n for n in map(len, tables) if n < required)
        for g in range(len(self.kinds)):
            required = cdiv(num_tokens, B)
            if self.kinds[g] == MAMBA:  # `MambaManager.get_num_blocks_to_allocate`, align mode: one new block,
                hit = hits[g] if tables is None else ()  # two with a checkpoint in the chunk
                if hit and self.cached_this_step and not kv_only and self.pool.key_of[hit[-1]] in self.cached_this_step:
                    return 1 << 62  # a state cached in this step: admitted in the next one
                table = tables[g] if tables is not None else ()  # (at admission vLLM's table is still empty)
                new = required - len(hit) - len(table)
                cap = 1 + bool(self.checkpoints[g] and self.checkpoint_at(table, computed, num_tokens, prefill_end))
                total += min(new, cap) + sum(1 for b in hit if b and not ref[b])
                continue
            if capped and self.cap[g] is not None:
                required = min(required, self.cap[g])
            if tables is not None:
                total += max(required - len(tables[g]), 0)
                continue
            skipped = self.skipped_tokens(g, computed) // B
            total += max(required - max(skipped, len(hits[g])), 0)
            total += sum(1 for b in hits[g][skipped:] if b and not ref[b])
        return total

    def add_hits(self, hits: list[list[int]], hit_length: int) -> list[list[int]]:
        """`add_local_computed_blocks`: the new request's tables, its skipped hits as nulls, the rest touched."""
        tables = []
        for g, blocks in enumerate(hits):
            skipped = self.skipped_tokens(g, hit_length) // self.B
            kept = blocks[skipped:]
            self.pool.touch([b for b in kept if b])
            table = [0] * skipped + kept
            tables.append(_StateTable(table) if self.kinds[g] == MAMBA else table)
        return tables

    def remove_skipped(self, tables: list[list[int]], computed: int) -> int:
        """`remove_skipped_blocks`: each window / chunk group frees the blocks before the next token's window,
        from the last one back to the first null (`_remove_blocks_in_range`). Returns how many it freed."""
        count, B, kinds, spans = 0, self.B, self.kinds, self.spans
        for g in self.moving:
            table = tables[g]
            kind = kinds[g]
            if kind == MAMBA:
                count += self._retire_states(table, computed)
                continue
            # `skipped_tokens` inline (every running request, every group, every step), then its whole blocks
            skipped = computed - spans[g] + 1 if kind == SLIDING else computed // spans[g] * spans[g]
            top = min(skipped // B, len(table))
            if top <= 0 or not table[top - 1]:  # nothing newly out of the window (most steps)
                continue
            freed = []
            for i in range(top - 1, -1, -1):
                if not table[i]:
                    break
                freed.append(table[i])
                table[i] = 0
            if freed:
                self.pool.release(freed[::-1])  # (release frees its list last block first)
                count += len(freed)
        return count

    def releasable(self, tables: list[list[int]], computed: int) -> int:
        """How many blocks `remove_skipped(tables, computed)` would free, none freed."""
        count, B, kinds, spans = 0, self.B, self.kinds, self.spans
        for g in self.moving:
            table = tables[g]
            if kinds[g] == MAMBA:
                _, below, copied = self._states_to_retire(table, computed)
                count += len(below) + (copied is not None)
                continue
            skipped = computed - spans[g] + 1 if kinds[g] == SLIDING else computed // spans[g] * spans[g]
            i = min(skipped // B, len(table)) - 1
            while i >= 0 and table[i]:
                count += 1
                i -= 1
        return count

    def next_removal(self, tables: list[list[int]], computed: int) -> float:
        """The fewest computed tokens (at least ``computed``) at which `remove_skipped` may free a block of these
        tables, as long as they do not change (inf: never). It frees when the top of a window group's skipped blocks
        (``min(skipped // B, len)``, which only grows with the tokens) reaches a held block: here the first held one
        above the top now, so a chunk's jump past it makes the answer early, never late. A state group's: when
        `_retire_states` would next free one (`_next_state_retirement`)."""
        B, out = self.B, math.inf
        for g in self.moving:
            table, span = tables[g], self.spans[g]
            if self.kinds[g] == MAMBA:
                out = min(out, self._next_state_retirement(table))
                continue
            skipped = computed - span + 1 if self.kinds[g] == SLIDING else computed // span * span
            top = max(skipped // B, 0)
            held = top if top < len(table) and table[top] else next(
                (i for i in range(top, len(table)) if table[i]), None)
            if held is None:
                continue
            need = (held + 1) * B  # skipped tokens that put block ``held`` under the top
            out = min(out, need + span - 1 if self.kinds[g] == SLIDING else cdiv(need, span) * span)
        return max(out, computed)

    def _next_state_retirement(self, table: _StateTable) -> float:
        """The fewest computed tokens at which `_retire_states` frees a block of this table while it does not
        change (inf: never): the first held block ``i`` from ``retired`` on once ``(computed - 1) // B > i``, the
        state the last allocation copied from (``s``) once ``cdiv(computed, B) - 1 > s``."""
        B = self.B
        held = next((i for i in range(table.retired, len(table)) if table[i]), None)
        out = math.inf if held is None else (held + 1) * B + 1
        s = table.last_state
        if s is not None and s < len(table) and table[s]:
            out = min(out, (s + 1) * B + 1)
        return out

    def _retire_states(self, table: _StateTable, computed: int) -> int:
        """`MambaManager.remove_skipped_blocks`, align mode: the states before the last computed token's block
        freed (nulls passed over, from where the last call stopped), then the state the last allocation copied
        from, once the request is past its block. Returns how many it freed."""
        retired, below, copied = self._states_to_retire(table, computed)
        freed = [table[i] for i in below]
        for i in below:
            table[i] = 0
        if freed:
            self.pool.release(freed[::-1])
        table.retired = retired
        if copied is None:
            return len(freed)
        self.pool.release([table[copied]])
        table[copied] = 0
        return len(freed) + 1

    def _states_to_retire(self, table: _StateTable, computed: int) -> tuple[int, list[int], int | None]:
        """What `_retire_states` frees, nothing freed: the table's new ``retired``, the indices of the held states
        before it from ``retired`` on (the last first), and the index of the state the last allocation copied from
        when it goes too (else None)."""
        last = min((computed - 1) // self.B, len(table)) if computed > 1 else 0
        below = [i for i in range(last - 1, table.retired - 1, -1) if table[i]]
        s = table.last_state
        past = s is not None and s < cdiv(computed, self.B) - 1 and table[s] and s not in below
        return max(table.retired, last), below, s if past else None

    def allocate(self, tables: list[list[int]], num_tokens: int, computed: int, prefill_end: int) -> int:
        """`allocate_new_blocks`, group by group, from the head of the free queue, for ``num_tokens`` in all of
        which ``computed`` are done (``prefill_end``: as `blocks_to_allocate`'s). Returns how many it took.
        A state group (align mode) takes one block for the state at the last token, nulls before it, and
        remembers the block it copies the state from; with a prefill checkpoint in the chunk (`checkpoint_at`)
        also the block before it, which the mixer exports the checkpoint's state into."""
        need, count = cdiv(num_tokens, self.B), 0
        if self.stateless:  # one take for every group, dealt out in group order: the same blocks as a take each
            wants = [need - len(table) for table in tables]
            count = sum(w for w in wants if w > 0)
            if count:
                got, at = self.pool.take(count), 0
                for table, want in zip(tables, wants):
                    if want > 0:
                        table += got[at:at + want]
                        at += want
            return count
        for g, table in enumerate(tables):
            if isinstance(table, _StateTable):
                count += self._allocate_states(g, table, need, computed, num_tokens, prefill_end)
                continue
            if need > len(table):
                count += need - len(table)
                table += self.pool.take(need - len(table))
        return count

    def _allocate_states(self, g: int, table: _StateTable, need: int, computed: int, num_tokens: int,
                         prefill_end: int) -> int:
        """`MambaManager.allocate_new_blocks`, align mode, no speculative blocks (the checkpoint recorded by its
        `get_num_blocks_to_allocate` for the same chunk)."""
        position = self.checkpoint_at(table, computed, num_tokens, prefill_end) if self.checkpoints[g] else 0
        table.checkpoint = (position, need - 2) if position else None
        if need <= len(table) and not position:
            table.allocated = True
            return 0
        if table.allocated or table:
            table.last_state = len(table) - 1
        if len(table) < need - 1:  # nulls before the new state block (and the checkpoint's)
            table += [0] * (need - 1 - bool(position) - len(table))
        table.allocated = True
        new = max(need - len(table), 0)
        table += self.pool.take(new)
        return new

    def mask(self, g: int, start: int, end: int, boundaries: Sequence[int]) -> list[bool] | None:
        """`SlidingWindowManager.reachable_block_mask` for blocks ``start..end-1`` (no EAGLE, alignment = the
        block): None caches them all."""
        if self.kinds[g] == MAMBA:
            return self._state_mask(start, end, boundaries)
        if self.kinds[g] != SLIDING:
            return None
        B, need, r = self.B, self.need[g], self.hg.retention_interval
        segment = B if r is None else (r or None)
        out = [False] * (end - start)
        if segment is not None:
            per = segment // B
            if need >= per:
                return None
            for i in range(start, end):
                if i % per >= per - need:
                    out[i - start] = True
        if r is not None:
            for boundary in boundaries:
                stop = boundary // B
                for j in range(max(start, stop - need), min(end, stop)):
                    out[j - start] = True
        return out

    def _state_mask(self, start: int, end: int, boundaries: Sequence[int]) -> list[bool] | None:
        """`MambaManager.reachable_block_mask`: the one state block ending on each retention segment (none at
        the default interval 0) and on each boundary."""
        B, r = self.B, self.hg.retention_interval
        if r is None:
            return None
        out = [False] * (end - start)
        if r:
            per = r // B
            if per <= 1:
                return None
            for i in range((start + per) // per * per - 1 - start, len(out), per):
                out[i] = True
        for boundary in boundaries:
            block = boundary // B - 1
            if start <= block < end:
                out[block - start] = True
        return out

    def cache(self, tables: list[list[int]], num_cached: list[int], num_tokens: int, keys, boundaries) -> None:
        """`cache_blocks`: each group offers its newly full blocks (``keys(start, stop)``: their hash ids), a
        window or state group only those of its mask; ``num_cached`` advances. ``boundaries``: the prompt's
        replay boundary (its length less one token) first, then the shared-prefix junction if any."""
        full = num_tokens // self.B
        pool = self.pool
        ids_from, ids = -1, ()  # the hash ids of blocks ``ids_from`` to ``full`` (the groups mostly start together)
        for g, table in enumerate(tables):
            start = num_cached[g]
            blocks: list[int] = []
            if start < full:
                mask = self.mask(g, start, full, boundaries)
                if start != ids_from:
                    ids_from, ids = start, keys(start, full)
                names = []
                for i in range(start, full):
                    if table[i] and (mask is None or mask[i - start]):
                        blocks.append(table[i])
                        names.append((g, ids[i - start]))
                pool.cache(blocks, names)
                num_cached[g] = full
            if self.kinds[g] == MAMBA and pool.caching:  # (`MambaManager.cache_blocks`: the tail, then the step's)
                if table.checkpoint is not None:
                    self._cache_checkpoint(g, table, keys, boundaries)
                else:
                    self._recache_replay_state(g, table, full * self.B, boundaries[0])
                key_of = pool.key_of
                self.cached_this_step.update(key_of[b] for b in blocks if key_of[b] is not None)

    def _recache_replay_state(self, g: int, table: list[int], aligned: int, replay: int) -> None:
        """`MambaManager._cache_partial_tail_block` with the hash block equal to the block and no checkpoint in
        the chunk: while the computed tokens, rounded down to the block (`HybridKVCacheCoordinator.
        _align_cacheable`), end on the prompt's replay boundary and the request still holds the state there,
        every `cache_blocks` re-registers it, so it counts as cached in this step again."""
        if aligned <= 0 or aligned != replay // self.B * self.B:
            return
        index = aligned // self.B - 1
        if index < len(table) and table[index]:
            self.cached_this_step.add(self.pool.key_of[table[index]])

    def _cache_checkpoint(self, g: int, table: _StateTable, keys, boundaries: Sequence[int]) -> None:
        """`MambaManager._cache_partial_tail_block` with a checkpoint in the chunk (hash block = block): the
        checkpoint's block keeps (or gets, replacing any other hash) the hash of the state it holds when that
        state is the prompt's replay boundary's, a retention segment's or the shared-prefix junction's; any
        other checkpoint is transient: the hash is taken off its block (`_maybe_evict_cached_block`)."""
        position, index = table.checkpoint
        block, pool = table[index], self.pool
        junction = boundaries[1] if len(boundaries) > 1 else 0
        if (position != checkpoint_position(boundaries[0] + 1, self.B) and not self._retained_state(index)
                and position != junction):
            if block:
                pool.forget(block)
            return
        if not block:  # (`cache_partial_block` caches no null block)
            return
        key = (g, keys(index, index + 1)[0])
        if pool.key_of[block] == key:  # already cached at this position (`block_hash_num_tokens`)
            return
        pool.forget(block)
        pool.cache([block], [key])
        self.cached_this_step.add(key)

    def _retained_state(self, index: int) -> bool:
        """`MambaManager.reachable_block_mask` for the one block ``index``, no boundaries: whether the retention
        interval keeps its state (never at the default 0, always when dense)."""
        r = self.hg.retention_interval
        if r is None:
            return True
        per = r // self.B
        return bool(r) and (per <= 1 or index % per == per - 1)

    def free(self, tables: list[list[int]]) -> None:
        """`KVCacheCoordinator.free`: group by group, each table's last block first."""
        for table in tables:
            self.pool.release([b for b in table if b])
