"""A plain copy of vLLM V1's block pool (an OrderedDict free queue, dict maps): the reference that
kvplan.plan.block_pool.BlockPool, kept in flat lists for speed, is checked against operation for operation
(tests/plan/test_simulate_equivalence.py). The rules: kvplan/plan/block_pool.py."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence


class ReferenceBlockPool:
    def __init__(self, usable: int, caching: bool = True, uncached_first: bool = True):
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, usable + 1))
        self.ref = [0] * (usable + 1)
        self.key_of: dict[int, Hashable] = {}
        self.blocks_of: dict[Hashable, dict[int, None]] = {}  # hash -> its blocks, first registered first
        self.caching = caching
        self.uncached_first = uncached_first

    @property
    def num_free(self) -> int:
        return len(self.free)

    def cached(self, key: Hashable) -> int | None:
        blocks = self.blocks_of.get(key)
        return next(iter(blocks)) if blocks else None

    def longest_hit(self, keys: Iterable[Hashable]) -> list[int]:
        """`find_longest_cache_hit` for one full-attention group: cached blocks from the start,
        stopping at the first miss (``keys``: the hashes the lookup may use, in order)."""
        hits: list[int] = []
        for key in keys:
            block = self.cached(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def take(self) -> int:
        """A new block from the head of the queue (evicting its cache entry)."""
        block, _ = self.free.popitem(last=False)
        key = self.key_of.pop(block, None)
        if key is not None:
            blocks = self.blocks_of[key]
            del blocks[block]
            if not blocks:
                del self.blocks_of[key]
        self.ref[block] = 1
        return block

    def touch(self, block: int) -> None:
        if self.ref[block] == 0:
            del self.free[block]
        self.ref[block] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Free a request's blocks (in table order): its tail is evicted before its prefix."""
        first: list[int] = []
        last: list[int] = []
        for block in reversed(blocks):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                (first if self.uncached_first and block not in self.key_of else last).append(block)
        for block in reversed(first):  # prepend_n: the list at the head, in list order
            self.free[block] = None
            self.free.move_to_end(block, last=False)
        for block in last:
            self.free[block] = None

    def cache(self, block: int, key: Hashable) -> None:
        if self.caching and block not in self.key_of:
            self.key_of[block] = key
            self.blocks_of.setdefault(key, {})[block] = None

    def free_queue(self) -> list[int]:
        """The free queue from head (evicted first) to tail."""
        return list(self.free)
