"""What vLLM's hybrid KV cache caches and hits: full-attention, sliding-window and chunked-local groups
sharing one block pool. Pure.

Follows vLLM 0.32.0: `v1/core/kv_cache_coordinator.py` (HybridKVCacheCoordinator),
`v1/core/single_type_kv_cache_manager.py` (FullAttentionManager, SlidingWindowManager,
ChunkedLocalAttentionManager), `v1/core/kv_cache_manager.py` (`allocate_slots`) and `v1/core/block_pool.py`.

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
- **The hit every group agrees on.** Full attention first (its longest run of cached blocks from the start),
  then each other spec no further than that: a sliding window needs ``cdiv(window - 1, B)`` cached blocks in a
  row ending at the hit (scanned from the right), or every block from the start of a shorter one; a chunked
  group needs the blocks of the last chunk. Any spec that shortens the hit makes the others look again, until
  none does (one pass when there are two specs, full attention one of them); full-attention hits are cut to it.
- **Admission** (`full_sequence_must_fit`) reserves a sliding-window group at most
  ``cdiv(min(window - 1 + max_in_flight_tokens, max_model_len), B) + 1`` blocks (chunked: ``cdiv(min(chunk +
  max_in_flight_tokens, max_model_len), B)``: `max_admission_blocks_per_request`).

Not modelled (refused by `HybridGroups.of_layout`): recurrent-state groups (Mamba / linear attention: their
"align" mode keeps a state block only at chunk ends the scheduler aligns for it, `_mamba_block_aligned_split`,
with copy-on-write partial hits and prefill checkpoint pages), groups of different block sizes (hashes finer
than a group's block, `resolve_block_hashes`), DeepSeek-V4's packed groups, EAGLE's dropped block, a KV
connector, async scheduling's tokens in flight (blocks are freed on the processed-token basis: one step later).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.plan.block_pool import BlockPool
from kvplan.units import cdiv

FULL, SLIDING, CHUNKED = "full", "sliding", "chunked"

#: kvplan's layer kinds (kvplan.model.layers) as vLLM's managers treat them.
MANAGER_OF_KIND = {"full_attention": FULL, "mla": FULL, "mla_indexer": FULL, "sliding_window": SLIDING,
                   "chunked_local": CHUNKED}


@dataclass(frozen=True)
class CacheGroup:
    """One KV cache group: ``full`` attention, a ``sliding`` window of ``span`` tokens, or ``chunked`` local
    attention in chunks of ``span`` tokens."""

    kind: str
    span: int = 0

    def __post_init__(self) -> None:
        if self.kind not in (FULL, SLIDING, CHUNKED):
            raise KvplanError(f"unknown KV cache group kind {self.kind!r}")
        if self.kind != FULL and self.span < 1:
            raise KvplanError(f"a {self.kind} group needs a window / chunk of >= 1 token")


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
            what = "full attention" if g.kind == FULL else f"{g.kind} {g.span:,}"
            parts.append(f"{n} x {what}" if n > 1 else what)
        return " + ".join(parts)

    @classmethod
    def of_capacity(cls, cap) -> HybridGroups:
        """The groups of a kvplan.plan.capacity.Capacity (its limiting stage's layout, its max_model_len and
        tokens in flight); a KvplanError for what is not modelled."""
        return cls.of_layout(cap.layout, cap.max_model_len, cap.request_context.inflight_tokens)

    @classmethod
    def of_layout(cls, layout, max_model_len: int, max_in_flight_tokens: int,
                  retention_interval: int | None = 0) -> HybridGroups:
        """The groups of a kvplan.plan.layout.KVLayout; a KvplanError for what is not modelled (see the module
        doc), naming it."""
        if layout.packed:
            raise KvplanError("the prefix cache of DeepSeek-V4's packed KV groups (windows and compressor states of "
                              "their own block sizes) is not modelled")
        specs = list(layout.groups)
        if layout.shared_block_table:  # one group, one block table, one spec type (UniformTypeKVCacheSpecs)
            specs = specs[:1]
        groups, missing = [], set()
        for g in specs:
            manager = MANAGER_OF_KIND.get(g.spec.kind)
            if manager is None:
                missing.add(g.spec.kind)
                continue
            span = getattr(g.spec, "window", 0) if manager == SLIDING else getattr(g.spec, "chunk", 0)
            groups.append(CacheGroup(manager, span if manager != FULL else 0))
        if missing:
            state = {"mamba"} & missing
            why = (" (vLLM 0.32 keeps a recurrent state block only where a chunk of the prompt ends on a block, "
                   "at its replay boundary and shared-prefix junctions, with copy-on-write partial hits)" if state
                   else "")
            raise KvplanError(f"the prefix cache of {', '.join(sorted(missing))} KV groups is not modelled{why}; "
                              "kvplan would otherwise give full attention's hits, which this model does not get")
        sizes = {g.block_size for g in specs}
        if len(sizes) > 1:
            raise KvplanError(f"KV groups of different block sizes ({', '.join(map(str, sorted(sizes)))}): their "
                              "prefix cache (hashes finer than a group's block) is not modelled")
        return cls(tuple(groups), sizes.pop(), max_model_len, max_in_flight_tokens, retention_interval)


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
        cap_tokens = hg.max_in_flight_tokens
        self.cap: list[int | None] = [
            cdiv(min(g.span - 1 + cap_tokens, hg.max_model_len), B) + 1 if g.kind == SLIDING
            else cdiv(min(g.span + cap_tokens, hg.max_model_len), B) if g.kind == CHUNKED else None
            for g in hg.groups]
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
        return 0

    def blocks_to_allocate(self, tables: list[list[int]] | None, num_tokens: int, hits: list[list[int]],
                           computed: int, capped: bool = False) -> int:
        """`KVCacheCoordinator.get_num_blocks_to_allocate` summed over the groups: new blocks, plus hits that sit
        in the free queue (touching them takes them out of it). ``tables``: a running request's (no hits then);
        None for one being admitted. ``capped``: the full-sequence admission check's per-group cap."""
        B, ref, total = self.B, self.pool.ref, 0
        for g in range(len(self.kinds)):
            required = cdiv(num_tokens, B)
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
            tables.append([0] * skipped + kept)
        return tables

    def remove_skipped(self, tables: list[list[int]], computed: int) -> int:
        """`remove_skipped_blocks`: each window / chunk group frees the blocks before the next token's window,
        from the last one back to the first null (`_remove_blocks_in_range`). Returns how many it freed."""
        count = 0
        for g in self.moving:
            table = tables[g]
            skipped = self.skipped_tokens(g, computed)
            if skipped <= 0:
                continue
            freed = []
            for i in range(min(skipped // self.B, len(table)) - 1, -1, -1):
                if not table[i]:
                    break
                freed.append(table[i])
                table[i] = 0
            if freed:
                self.pool.release(freed[::-1])  # (release frees its list last block first)
                count += len(freed)
        return count

    def allocate(self, tables: list[list[int]], num_tokens: int) -> int:
        """`allocate_new_blocks`, group by group, from the head of the free queue. Returns how many it took."""
        need, count = cdiv(num_tokens, self.B), 0
        for table in tables:
            if need > len(table):
                count += need - len(table)
                table += self.pool.take(need - len(table))
        return count

    def mask(self, g: int, start: int, end: int, boundaries: Sequence[int]) -> list[bool] | None:
        """`SlidingWindowManager.reachable_block_mask` for blocks ``start..end-1`` (no EAGLE, alignment = the
        block): None caches them all."""
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

    def cache(self, tables: list[list[int]], num_cached: list[int], num_tokens: int, keys, boundaries) -> None:
        """`cache_blocks`: each group offers its newly full blocks (``keys(start, stop)``: their hash ids), a
        window group only those of its mask; ``num_cached`` advances."""
        full = num_tokens // self.B
        pool = self.pool
        for g, table in enumerate(tables):
            start = num_cached[g]
            if start >= full:
                continue
            mask = self.mask(g, start, full, boundaries)
            ids = keys(start, full)
            blocks, names = [], []
            for i in range(start, full):
                if table[i] and (mask is None or mask[i - start]):
                    blocks.append(table[i])
                    names.append((g, ids[i - start]))
            pool.cache(blocks, names)
            num_cached[g] = full

    def free(self, tables: list[list[int]]) -> None:
        """`KVCacheCoordinator.free`: group by group, each table's last block first."""
        for table in tables:
            self.pool.release([b for b in table if b])
