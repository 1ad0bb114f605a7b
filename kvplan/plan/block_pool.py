"""vLLM V1's block pool as the simulator keeps it: the free queue, ref counts and the prefix-cache map.
Pure. Follows `v1/core/block_pool.py` and `kv_cache_utils.FreeKVCacheBlockQueue` (read in 0.32.0; the
release-dependent part is `uncached_first`, docs/vllm-accounting.md section 9):

- Block 0 is the null block; blocks 1..usable start in the free queue in id order.
- New blocks come from the head of the queue. A block popped for reuse loses its cache entry then
  (eviction is lazy: cached blocks in the queue still count as free).
- A hit takes its block out of the queue wherever it sits (`touch`) and adds a reference.
- A request's blocks are freed in reverse order (its last block first). A block whose last reference
  goes back to the queue: at the tail if it is cached (FIFO over release: LRU), at the head if it holds
  no hash, so uncached blocks are reused first (`free_blocks`, 0.23+; up to 0.22 every block went to
  the tail).
- The map keeps every block registered under a hash: a request whose prompt is all cached recomputes
  its last block into a new block with the same hash, and both stay cached; a lookup takes the first
  one registered (`BlockHashToBlockMap.get_one_block`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence


class BlockPool:
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
