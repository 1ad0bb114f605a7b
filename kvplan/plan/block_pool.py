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

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import takewhile
from operator import is_not

_is_a_block = partial(is_not, None)  # a lookup found a block (not None)


class _PrefixMap:
    """The lookup both pools share: ``first`` maps a block's hash to the block vLLM's lookup returns for it (a
    block id, or a `Block`)."""

    first: dict
    dups: dict  # a hash several blocks hold -> those blocks, first registered first

    def _forget_one_of(self, key: Hashable, block) -> None:
        """Evict one of the blocks of a hash that several hold: a lookup then finds the next one."""
        blocks = self.dups[key]
        blocks.remove(block)
        self.first[key] = blocks[0]
        if len(blocks) == 1:
            del self.dups[key]

    def longest_hit(self, keys: Iterable[Hashable]) -> list:
        """Cached blocks from the start, stopping at the first miss (lookups and the stop in C: no Python
        step per block)."""
        return list(takewhile(_is_a_block, map(self.first.get, keys)))


class BlockPool(_PrefixMap):
    """The pool in flat lists indexed by block id, which the simulator's millions of block operations need
    (a third of the time of an OrderedDict-based one; tests/plan/test_simulate_equivalence.py drives this one
    and tests/helpers/reference_block_pool.py's plain copy with the same operations and compares them).

    - The free queue is a doubly linked list through ``nxt`` / ``prv``, with block 0 (the null block, never
      free) as its head-and-tail sentinel: ``nxt[0]`` is the head (evicted first), ``prv[0]`` the tail.
      Entries of blocks not in the queue are stale and never read.
    - ``key_of[block]`` is its hash (None: not cached); ``first[key]`` the block a lookup finds (the
      first registered); ``dups[key]`` all its blocks, first registered first, for a hash two blocks hold."""

    def __init__(self, usable: int, caching: bool = True, uncached_first: bool = True):
        n = usable + 1
        self.nxt = [*range(1, n), 0]
        self.prv = [usable, *range(0, usable)]
        self.num_free = usable
        self.ref = [0] * n
        self.key_of: list[Hashable | None] = [None] * n
        self.first: dict[Hashable, int] = {}
        self.dups: dict[Hashable, list[int]] = {}
        self.caching = caching
        self.uncached_first = uncached_first

    def cached(self, key: Hashable) -> int | None:
        return self.first.get(key)

    def take(self, count: int = 1) -> list[int]:
        """``count`` new blocks from the head of the queue (each evicting its cache entry)."""
        nxt, ref, key_of, first, dups = self.nxt, self.ref, self.key_of, self.first, self.dups
        out: list[int] = []
        block = 0
        for _ in range(count):
            block = nxt[block]
            out.append(block)
            key = key_of[block]
            if key is not None:  # evicted (inline: this runs for most blocks once the pool has filled)
                key_of[block] = None
                if dups and key in dups:
                    self._forget_one_of(key, block)
                else:
                    del first[key]
            ref[block] = 1
        head = nxt[block]  # the queue now starts after the last one taken
        nxt[0] = head
        self.prv[head] = 0
        self.num_free -= count
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Hits: each block leaves the queue (if it is in it) and gains a reference."""
        nxt, prv, ref = self.nxt, self.prv, self.ref
        unlinked = 0
        for block in blocks:
            if not ref[block]:
                before, after = prv[block], nxt[block]
                nxt[before] = after
                prv[after] = before
                unlinked += 1
            ref[block] += 1
        self.num_free -= unlinked

    def release(self, blocks: Sequence[int]) -> None:
        """Free a request's blocks (in table order): its tail is evicted before its prefix. A block left
        without references goes to the tail of the queue, or, holding no hash, to its head (uncached
        blocks reused first), those in the order they are freed (prepend_n)."""
        ref, key_of, nxt, prv = self.ref, self.key_of, self.nxt, self.prv
        uncached_first = self.uncached_first
        to_head: list[int] = []
        tail = prv[0]
        freed = 0
        for block in reversed(blocks):
            if ref[block] != 1:  # another request still holds it
                ref[block] -= 1
                continue
            ref[block] = 0
            freed += 1
            if key_of[block] is None and uncached_first:
                to_head.append(block)
            else:  # linked in at the tail at once
                nxt[tail] = block
                prv[block] = tail
                tail = block
        nxt[tail] = 0
        prv[0] = tail
        if to_head:
            before, after = 0, nxt[0]
            for block in to_head:
                nxt[before] = block
                prv[block] = before
                before = block
            nxt[before] = after
            prv[after] = before
        self.num_free += freed

    def cache(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """Register each block under its key (a block already cached keeps its hash)."""
        if not self.caching:
            return
        key_of, first = self.key_of, self.first
        for block, key in zip(blocks, keys):
            if key_of[block] is None:
                key_of[block] = key
                found = first.setdefault(key, block)
                if found != block:  # a second block with this hash: both stay cached, lookups find the first
                    self.dups.setdefault(key, [found]).append(block)

    def forget(self, block: int) -> None:
        """Take a block's hash out of the map, the block kept where it is (`BlockPool._maybe_evict_cached_block`,
        v1/core/block_pool.py@0.32.0: a Mamba-2 prefill checkpoint whose state is overwritten)."""
        key = self.key_of[block]
        if key is None:
            return
        self.key_of[block] = None
        if self.dups and key in self.dups:
            self._forget_one_of(key, block)
        else:
            del self.first[key]

    def free_queue(self) -> list[int]:
        """The free queue from head (evicted first) to tail."""
        out, block = [], self.nxt[0]
        while block:
            out.append(block)
            block = self.nxt[block]
        return out

    def free_among(self, blocks: Iterable[int]) -> int:
        """How many of ``blocks`` no request holds (free, cached: a hit on one takes it off the queue)."""
        ref = self.ref
        return [ref[b] for b in blocks].count(0)

    def leads_with_any(self, blocks: set[int], count: int) -> bool:
        """Whether one of the first ``count`` blocks of the free queue (the next ones taken) is in ``blocks``."""
        nxt = self.nxt
        block = nxt[0]
        for _ in range(count):
            if not block:
                return False
            if block in blocks:
                return True
            block = nxt[block]
        return False

    def ids(self, blocks: Iterable[int]) -> tuple[int, ...]:
        """The blocks' ids (a block table as the trace records it)."""
        return tuple(blocks)

    def state(self) -> PoolState:
        """What the pool holds between loads (every block free): `LinkedBlockPool.state`'s."""
        if self.num_free != len(self.nxt) - 1:
            raise ValueError("a pool's state is taken with every block free (between loads)")
        ids = self.free_queue()
        return PoolState(tuple(ids), tuple(self.key_of[i] for i in ids),
                         tuple((key, tuple(held)) for key, held in self.dups.items()))

    def restore(self, state: PoolState) -> None:
        """This new pool as ``state`` left it (`LinkedBlockPool.restore`'s; a hybrid pool's keys are all in its map)."""
        if len(state.free) != len(self.nxt) - 1:
            raise ValueError(f"a state of {len(state.free)} blocks given to a pool of {len(self.nxt) - 1}")
        nxt, prv, key_of = self.nxt, self.prv, self.key_of
        before = 0
        for i, key in zip(state.free, state.keys):
            if key is LinkedBlockPool.PRIVATE:
                raise ValueError("a state with PRIVATE blocks is LinkedBlockPool's")
            key_of[i] = key if self.caching else None
            nxt[before], prv[i] = i, before
            before = i
            if key_of[i] is not None:
                self.first.setdefault(key, i)
        nxt[before], prv[0] = 0, before
        for key, held in state.dups:  # a hash several blocks hold: the first registered is the one lookups find
            self.dups[key] = list(held)
            self.first[key] = held[0]

    def unlink(self) -> None:
        """(Nothing to break: see `LinkedBlockPool.unlink`.)"""


@dataclass(frozen=True)
class PoolState:
    """The prefix cache a load leaves on the engine for the next one (vLLM keeps it: `BlockPool` is the engine's for
    its whole life, v1/core/block_pool.py@0.32.0): every block free, ``free`` their ids in the free queue's order
    (head, evicted first, to tail), ``keys`` each one's hash (None: none; `LinkedBlockPool.PRIVATE`: its own
    request's), ``dups`` the hashes several blocks hold, first registered first. ``EMPTY_POOL``: a fresh pool."""

    free: tuple[int, ...] = ()
    keys: tuple[Hashable | None, ...] = ()
    dups: tuple[tuple[Hashable, tuple[int, ...]], ...] = ()


class Block:
    """One block of `LinkedBlockPool`, as vLLM's ``KVCacheBlock``: its id, its neighbours in the free queue
    (stale while it is held), its references and its hash (None: not cached)."""

    __slots__ = ("id", "prev", "next", "ref", "key")

    def __init__(self, block_id: int):
        self.id, self.ref, self.key = block_id, 0, None
        self.prev = self.next = self


class _Private:
    """`LinkedBlockPool.PRIVATE`'s type (one instance)."""

    def __repr__(self) -> str:
        return "PRIVATE"


class _Run:
    """Consecutive entries of `LinkedBlockPool`'s free queue as one: a freed request's ``PRIVATE`` blocks (free,
    cached, in no map), in queue order, the first ``start`` of them already taken again."""

    __slots__ = ("prev", "next", "blocks", "start")

    def __init__(self, blocks: list[Block]):
        self.blocks, self.start = blocks, 0


class LinkedBlockPool(_PrefixMap):
    """`BlockPool`'s rules (the module's docstring) with each block one `Block` object, linked as vLLM's
    ``FreeKVCacheBlockQueue`` links its ``KVCacheBlock`` s; the plain simulator hands the objects around
    instead of ids. Why: the pool is memory-bound, and a block's fields sit together in one object, so
    taking, freeing or hitting a block reads one object where `BlockPool` reads four lists (and the id's int)
    (benchmarks/bench_working_set.py). The hybrid scheduler keeps `BlockPool` (its tables are ids, 0 the
    null block). tests/plan/test_simulate_equivalence.py drives both against the reference pool.

    The null block (id 0) is the free queue's head-and-tail sentinel: ``null.next`` is evicted first.

    A full block whose hash no other request asks for (a request's own tail: the simulator knows from the whole
    load, `SimTurn.shared_keys`) holds ``PRIVATE`` instead of its hash: cached as far as the queue goes (it goes to
    the tail when freed, as any cached block), but not in the map, which saves a map insert and delete per such
    block. No lookup can tell: only its own request could ask, after a preemption, and `promote` puts its hashes
    into the map before its blocks are freed. Freed together, a request's PRIVATE blocks enter the queue as one
    entry (`_Run`: no hit can take one out of its middle), and a take copies them out as a slice.

    Which of a request's blocks are PRIVATE is known by their place in its table (the simulator's ``own_from`` to
    ``num_cached``: `take_cached`'s ``own``, `release`'s ``private``), so such a block's own ``ref`` and ``key`` are
    not kept while it is PRIVATE, held or in a run (stale; `state` names it PRIVATE): no lookup, hit or eviction
    reads them, and a take sets both. Why: these are most of the blocks, and writing two fields of each when taken
    and one when freed took about a tenth of a large simulation (benchmarks/bench_working_set.py --simulate: 13.8 s
    to 12.5 s of CPU)."""

    PRIVATE = _Private()

    def __init__(self, usable: int, caching: bool = True, uncached_first: bool = True):
        self.blocks = [Block(i) for i in range(usable + 1)]
        ring = self.blocks + self.blocks[:1]
        for before, after in zip(ring, ring[1:]):
            before.next, after.prev = after, before
        self.null = self.blocks[0]
        self.num_free = usable
        self.first: dict[Hashable, Block] = {}
        self.dups: dict[Hashable, list[Block]] = {}
        self.caching = caching
        self.uncached_first = uncached_first

    def cached(self, key: Hashable) -> int | None:
        block = self.first.get(key)
        return None if block is None else block.id

    def _pop(self, count: int) -> list[Block]:
        """The first ``count`` blocks of the free queue, out of it; the hashes of those that held one in the map
        evicted (the caller gives each block its new hash, or None). A run gives its blocks as one slice."""
        first, dups, private = self.first, self.dups, self.PRIVATE
        out: list[Block] = []
        null = self.null
        node = null.next
        need = count
        while need:
            if node.__class__ is _Run:
                blocks, start = node.blocks, node.start
                end = start + need
                if end < len(blocks):  # the run's first ``need`` blocks: the rest stays at the head
                    out += blocks[start:end]
                    node.start = end
                    break
                out += blocks[start:] if start else blocks
                need -= len(blocks) - start
                spent, node = node, node.next
                spent.prev = spent.next = None  # (no links left behind: see `unlink`)
            else:
                out.append(node)
                key = node.key
                if key is not None and key is not private:  # evicted (a private hash is in no map)
                    node.key = None
                    if dups and key in dups:
                        self._forget_one_of(key, node)
                    else:
                        del first[key]
                node = node.next
                need -= 1
        null.next, node.prev = node, null  # the queue now starts after the last one taken
        self.num_free -= count
        return out

    def take(self, count: int = 1) -> list[Block]:
        """``count`` new blocks from the head of the queue (each evicting its cache entry)."""
        out = self._pop(count)
        for block in out:
            block.key = None
            block.ref = 1
        return out

    def take_cached(self, count: int, keys: Sequence[Hashable], own: int = 0) -> list[Block]:
        """`take` of ``count`` blocks, then `cache` of the first ``len(keys)`` of them under ``keys`` (an admitted
        prompt's new blocks, its full ones registered at once); the ``own`` after those are ``PRIVATE`` (their fields
        not kept: see the class)."""
        if not self.caching or not (keys or own):
            return self.take(count)
        out = self._pop(count)
        first, dups = self.first, self.dups
        setdefault = first.setdefault
        for block, key in zip(out, keys):
            block.key = key
            block.ref = 1
            found = setdefault(key, block)
            if found is not block:  # a second block with this hash (see `cache`)
                dups.setdefault(key, [found]).append(block)
        for block in out[len(keys) + own:]:  # (the PRIVATE ones before are left as they are)
            block.key = None
            block.ref = 1
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Hits: each block leaves the queue (if it is in it) and gains a reference."""
        unlinked = 0
        for block in blocks:
            if not block.ref:
                before, after = block.prev, block.next
                before.next, after.prev = after, before
                unlinked += 1
            block.ref += 1
        self.num_free -= unlinked

    def release(self, blocks: Sequence[Block], private: tuple[int, int] | None = None) -> None:
        """`BlockPool.release`: the blocks in table order, freed last first; cached ones to the tail, uncached
        ones (``uncached_first``) to the head in the order they are freed. ``private``: ``(start, stop)``, where
        ``blocks[start:stop]`` are ``PRIVATE`` and held by this request alone: they go to the tail as one run (the
        same order, one queue entry instead of one per block; their fields untouched: see the class)."""
        uncached_first, null = self.uncached_first, self.null
        to_head: list[Block] = []
        tail = null.prev
        held = 0
        if private is None:
            parts: tuple[Sequence[Block], ...] = (blocks,)
        else:
            start, stop = private
            parts = (blocks[stop:], blocks[start:stop], blocks[:start])
        for i, part in enumerate(parts):
            if i == 1:  # the private run
                run = _Run(part[::-1])
                tail.next, run.prev = run, tail
                tail = run
                continue
            for block in reversed(part):
                if block.ref != 1:  # another request still holds it
                    block.ref -= 1
                    held += 1
                    continue
                block.ref = 0
                if block.key is None and uncached_first:
                    to_head.append(block)
                else:
                    tail.next, block.prev = block, tail
                    tail = block
        tail.next, null.prev = null, tail
        if to_head:
            before, after = null, null.next
            for block in to_head:
                before.next, block.prev = block, before
                before = block
            before.next, after.prev = after, before
        self.num_free += len(blocks) - held

    def cache(self, blocks: Sequence[Block], keys: Sequence[Hashable]) -> None:
        """Register each block under its key (a block already cached keeps its hash)."""
        if not self.caching:
            return
        first = self.first
        for block, key in zip(blocks, keys):
            if block.key is None:
                block.key = key
                found = first.setdefault(key, block)
                if found is not block:  # a second block with this hash: both stay cached, lookups find the first
                    self.dups.setdefault(key, [found]).append(block)

    def promote(self, blocks: Sequence[Block], keys: Sequence[Hashable]) -> None:
        """``PRIVATE`` ``blocks``, held by one request, registered under their hashes (``keys``, in the same order),
        as `cache` would have when they filled: their request is preempted and may look them up when readmitted.
        (Their fields were not kept while PRIVATE: both set here.)"""
        first = self.first
        for block, key in zip(blocks, keys):
            block.key = key
            block.ref = 1
            found = first.setdefault(key, block)
            if found is not block:
                self.dups.setdefault(key, [found]).append(block)

    def free_queue(self) -> list[int]:
        """The free queue's ids from head (evicted first) to tail."""
        out, node = [], self.null.next
        while node is not self.null:
            if node.__class__ is _Run:
                out += [b.id for b in node.blocks[node.start:]]
            else:
                out.append(node.id)
            node = node.next
        return out

    def free_among(self, blocks: Iterable[Block]) -> int:
        return [b.ref for b in blocks].count(0)

    def ids(self, blocks: Iterable[Block]) -> tuple[int, ...]:
        return tuple(b.id for b in blocks)

    def unlink(self) -> None:
        """Break the queue's links, once the pool is done with: its blocks form a ring of reference cycles
        that only a full collection would free (megabytes for a large pool, per simulation)."""
        node = self.null.next
        while node is not self.null:  # the queue's runs (spent ones hold no links), and its blocks
            node.prev, node = None, node.next
        for block in self.blocks:
            block.prev = block.next = None  # type: ignore[assignment]

    def state(self) -> PoolState:
        """What the pool holds between loads (every block free): its free queue, head first, each block's hash."""
        if self.num_free != len(self.blocks) - 1:
            raise ValueError("a pool's state is taken with every block free (between loads)")
        ids: list[int] = []
        keys: list[Hashable | None] = []
        node, private = self.null.next, self.PRIVATE
        while node is not self.null:  # (a run's blocks are PRIVATE: their own ``key`` is not kept)
            if node.__class__ is _Run:
                ids += [b.id for b in node.blocks[node.start:]]
                keys += [private] * (len(node.blocks) - node.start)
            else:
                ids.append(node.id)
                keys.append(node.key)
            node = node.next
        return PoolState(tuple(ids), tuple(keys),
                         tuple((key, tuple(b.id for b in held)) for key, held in self.dups.items()))

    def restore(self, state: PoolState) -> None:
        """This new pool as ``state`` left it: the same free queue and hashes (the same lookups and evictions)."""
        if len(state.free) != len(self.blocks) - 1:
            raise ValueError(f"a state of {len(state.free)} blocks given to a pool of {len(self.blocks) - 1}")
        blocks, null, private = self.blocks, self.null, self.PRIVATE
        before = null
        for i, key in zip(state.free, state.keys):
            block = blocks[i]
            block.key = key if self.caching else None
            before.next, block.prev = block, before
            before = block
            if block.key is not None and block.key is not private:
                self.first.setdefault(block.key, block)
        before.next, null.prev = null, before
        for key, held in state.dups:  # a hash several blocks hold: the first registered is the one lookups find
            self.dups[key] = [blocks[i] for i in held]
            self.first[key] = blocks[held[0]]

    @property
    def ref(self) -> list[int]:
        """Every block's references, by id (for tests: a list made on each call; a PRIVATE block's are stale)."""
        return [b.ref for b in self.blocks]

    @property
    def key_of(self) -> list[Hashable | None]:
        """Every block's hash, by id (for tests; a PRIVATE block's is stale)."""
        return [b.key for b in self.blocks]
