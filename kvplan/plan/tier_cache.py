"""The two-tier prefix cache: the GPU pool and vLLM's native CPU offload tier behind it. Pure.

With ``--kv-offloading-size`` vLLM 0.32 runs the OffloadingConnector: its scheduler side
(``OffloadingConnectorScheduler``, distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py@0.32.0)
asks the CPU tier's manager (``CPUOffloadingManager``, v1/kv_offload/cpu/manager.py@0.32.0, LRU policy
by default: v1/kv_offload/cpu/policies/lru.py@0.32.0; ARC on request) for the tokens beyond the GPU pool's hit, and
offers the tier every full prompt chunk a request computes. What a request of ``n = P // B`` full
prompt blocks does, served alone (the docstrings below give the detail):

1. **GPU hit** ``g``: the leading prompt blocks still cached in the GPU pool, at most ``(P - 1) // B``
   (the last token is always computed: ``KVCacheManager.get_computed_blocks``). The pool is modelled as
   `kvplan.plan.prefix_cache.working_set` models it: requests one at a time, the pool an LRU over blocks
   in which a finished request's prompt blocks are the most recent (its first block the newest), its
   generated full blocks just below them, and its partial last block holding one slot until the next
   request reuses it (vLLM 0.23+). Concurrency is not in it.
2. **Tier lookup** (``_lookup_complete_chunks``): one key per *chunk* of ``blocks_per_chunk`` GPU blocks
   (the hash of the chunk's last block, tagged with the KV group), for every full chunk of the prompt,
   ``P // tpc`` of them (``tpc = blocks_per_chunk x B``: the last full block counts even when it ends
   the prompt; vLLM then recomputes the last token: ``_update_waiting_for_remote_kv``). It starts at the
   chunk holding the GPU boundary, ``g // blocks_per_chunk``, counts the chunks present from there, and
   loads ``tpc x (start + hits) - g x B`` tokens, or nothing when that is under one chunk.
3. **Load** (``update_state_after_alloc``): ``prepare_load`` of those chunks; the request's stores then
   start after them (``next_stored_chunk_idx``). Without a tier hit they start at chunk 0: the chunks of
   the GPU hit are offered too.
4. **Store** (``_build_store_jobs``, ``offload_prompt_only`` on by default: prompt chunks only, no
   decode blocks): ``prepare_store`` of the offered chunks. Chunks already there are kept (and
   protected from this call's eviction); the others are stored after evicting the least recently used
   unprotected chunks (LRU; ARC: below). When the others outnumber the free chunks plus the unprotected ones, the call
   stores nothing (``prepare_store`` returns None). The chunks the request just loaded are not
   protected: its own store may evict them.
5. **Finish** (``on_request_finished``): every chunk the request loaded or offered that is still there
   becomes the most recent, its first one the newest (LRU ``on_request_finished`` re-ranks them in
   reverse prefix order). A request with a tier hit does not touch the tier's copy of its GPU-hit
   chunks: neither loaded nor offered.

The tier's kv_connector_extra_config (read by ``CPUOffloadingSpec``, v1/kv_offload/cpu/spec.py@0.32.0):

* ``eviction_policy``: ``lru`` (the default: steps 4-5 above) or ``arc`` (``ARCCachePolicy``,
  v1/kv_offload/cpu/policies/arc.py@0.32.0; `_ArcTier`). A stored chunk enters T1. At finish, in reverse
  prefix order, a chunk the request reused (loaded, or offered while present) moves from T1 to T2 or to
  T2's most recent end, and a chunk it stored to T1's most recent end; a chunk it loaded and its own store
  then evicted is not promoted. Eviction takes T1's least recent unprotected chunks while T1 holds at least
  ``int(p)`` chunks (less those this call already took), else T2's, else T1's; the victims' keys go to the
  ghost lists B1 / B2 (each at most the tier's size). A store of a key in B1 raises ``p`` by
  ``max(1, |B2| / |B1|)``, one in B2 lowers it by ``max(1, |B1| / |B2|)`` (within [0, tier size]): once per
  key per request (``on_store_miss``), before the store's eviction, even when the store then fails.
* ``store_threshold`` (default 0; below 2 every offered chunk is stored): each ``prepare_store`` call counts
  each offered key in an LRU table of ``max_tracker_size`` keys (64,000; `_OfferCounts`), and a chunk not in
  the tier is stored only once its count reaches the threshold (the others: ``skipped_chunks``, vLLM's
  ``stores_skipped``). Under either policy.

A ``prepare_store`` that cannot free room (step 4) is retried by each later step of the request: its
``M - 1`` decode steps and the step that sees it finished (the scheduler leaves ``next_stored_chunk_idx``
where it was). Without a threshold a retry changes nothing; with one it counts the offers again (and fails
again: admitting more chunks never frees more room).

Assumed (the model is timing-free): a request's prefill is one scheduler step, so its stores are one
``prepare_store`` call (chunked prefill splits it, which changes the result only for a request with more
new chunks than the tier holds: one call stores nothing, several store its later chunks), and loads and
stores finish before the next request arrives (in flight, a chunk is a ``HIT_PENDING`` that defers the
request, and pinned chunks cannot be evicted). Not modelled: an out-of-tree policy
(``cache_policy_module_path``); with chunked prefill a failed store's retries (and so a threshold's counts)
also depend on the number of prefill steps. The tier counts chunks of ONE KV cache group: with several
groups each group's block takes its own chunk (kvplan.plan.offload), so give this model the chunks one
group gets.

The tier is simulated block by block (its content depends on the GPU pool's, which decides where
lookups start and which chunks get touched, so no closed form of one reuse distance gives it); the
bulk operations run in C (``OrderedDict`` moves, ``takewhile`` scans): the 100,000-request trace of
benchmarks/bench_tier_cache.py (27 million prompt blocks) takes about 15 s a simulation; `tier_curve`'s
sizing takes a few dozen simulations (a 20,000-request trace: 24 of them, 99 s).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import filterfalse, islice, repeat, takewhile

from kvplan.errors import KvplanError
from kvplan.plan.prefix_cache import BlockHasher, replay_order
from kvplan.plan.schema import WorkloadTier
from kvplan.traffic.model import Traffic, Turn

#: The shares of the hits an unbounded tier adds that `kvplan size --workload` sizes a tier for.
TIER_SHARES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class TierRequest:
    """One request as the two tiers see it: its prompt and output lengths and the ids of its full prompt
    blocks (kvplan.plan.prefix_cache.BlockHasher: equal ids are equal vLLM block hashes)."""

    prompt_tokens: int
    output_tokens: int
    keys: tuple[int, ...]


@dataclass(frozen=True)
class TierHits:
    """Hits of a GPU pool of ``gpu_blocks`` blocks with a CPU tier of ``tier_chunks`` chunks behind it.

    ``gpu_hit_tokens`` and ``tier_hit_tokens`` are the prompt tokens each tier serves: the counters
    vLLM's prefix cache and its connector report (``prefix_cache_hits`` / ``connector_prefix_cache_hits``,
    v1/core/sched/scheduler.py@0.32.0); the rest of ``queried_tokens`` is computed. ``per_request``:
    (GPU hit blocks, tier hit blocks) per request, when asked for."""

    gpu_blocks: int
    tier_chunks: int
    blocks_per_chunk: int
    block_size: int
    requests: int
    queried_tokens: int
    gpu_hit_tokens: int
    tier_hit_tokens: int
    stored_chunks: int  # chunks written to the tier
    evicted_chunks: int
    failed_stores: int  # prepare_store calls that stored nothing: more new chunks than room
    distinct_chunks: int  # chunk keys ever stored: a tier this large never evicts
    per_request: tuple[tuple[int, int], ...] = ()
    eviction_policy: str = "lru"
    store_threshold: int = 0
    skipped_chunks: int = 0  # new chunks offered fewer than store_threshold times (vLLM's stores_skipped)

    @property
    def missed_tokens(self) -> int:
        return self.queried_tokens - self.gpu_hit_tokens - self.tier_hit_tokens

    def rate(self, tokens: int) -> float:
        return tokens / self.queried_tokens if self.queried_tokens else 0.0


def tier_requests(turns: Iterable[Turn], block_size: int) -> Iterable[TierRequest]:
    """Each turn's prompt blocks as hash ids, lazily (a long trace is hashed as it is simulated)."""
    hasher = BlockHasher(block_size)
    for t in turns:
        yield TierRequest(t.prompt_tokens, t.output_tokens, hasher.prompt_keys(t.segments))


#: kv_connector_extra_config's ``eviction_policy`` values vLLM 0.32 registers
#: (v1/kv_offload/cpu/policies/factory.py@0.32.0).
EVICTION_POLICIES = ("lru", "arc")
#: kv_connector_extra_config's ``max_tracker_size`` default (v1/kv_offload/cpu/spec.py@0.32.0).
MAX_TRACKER_SIZE = 64_000


class _OfferCounts:
    """``store_threshold`` >= 2: how many times each chunk key was offered to ``prepare_store``, in an LRU table
    of at most ``max_tracker_size`` keys (``CPUOffloadingManager.counts`` / ``_record_accesses``,
    v1/kv_offload/cpu/manager.py@0.32.0). A chunk not in the tier is stored only once its count reaches the
    threshold; a key aged out of the table starts again from 1."""

    def __init__(self, threshold: int, max_size: int):
        self.threshold, self.max_size = threshold, max_size
        self.counts: OrderedDict[int, int] = OrderedDict()

    def record(self, keys: Sequence[int]) -> None:
        """``_record_accesses``: keys already tracked count one more and become the most recent (protected from
        this call's aging-out); new keys enter at 1, each aging out the least recent unprotected key when the
        table is full, and are not tracked at all when every tracked key is protected."""
        counts = self.counts
        protected: set[int] = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                protected.add(key)
        unprotected = len(counts) - len(protected)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_size:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1

    def admit(self, candidates: list[int]) -> list[int]:
        """``prepare_store``'s filter of the chunks not in the tier: offered at least ``threshold`` times."""
        get, threshold = self.counts.get, self.threshold
        return [k for k in candidates if get(k, 0) >= threshold]


class _ArcTier:
    """The tier under ``eviction_policy: arc``: ``ARCCachePolicy`` (v1/kv_offload/cpu/policies/arc.py@0.32.0)
    as ``CPUOffloadingManager`` drives it (v1/kv_offload/cpu/manager.py@0.32.0), every chunk ready and unpinned
    between requests (the model's assumption). T1: chunks stored and not reused since; T2: chunks a request
    reused (loaded, or offered while present); B1 / B2: the keys last evicted from each, at most the tier's
    size each; ``target`` (``target_t1_size``, p): how many chunks T1 should hold. Orders least recent first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def has(self, key: int) -> bool:  # ``get`` (lookup): no side effect
        return key in self.t1 or key in self.t2

    def _adapt(self, key: int) -> None:
        """``_adapt_to_ghost_hit``: a key stored again after its eviction moves the target toward the list it was
        evicted from (B1: T1 grows by max(1, |B2|/|B1|); B2: shrinks by max(1, |B1|/|B2|)), bounded by [0, size]."""
        b1, b2 = self.b1, self.b2
        if key in b1:
            self.target = min(self.target + max(1, len(b2) / len(b1)), self.capacity)
            b1.move_to_end(key)
        elif key in b2:
            self.target = max(self.target - max(1, len(b1) / len(b2)), 0)
            b2.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> int | None:
        """``evict``: n victims, each from T1's least recent end while T1 (less what this call already took) holds
        at least int(target), else from T2's, else T1's; protected keys are skipped; all or nothing (None). The
        victims go to the MRU ends of B1 / B2, which are then trimmed to the tier's size."""
        t1, t2 = self.t1, self.t2
        it1 = (k for k in t1 if k not in protected)
        it2 = (k for k in t2 if k not in protected)
        from_t1: list[int] = []
        from_t2: list[int] = []
        virtual_t1 = len(t1)
        for _ in range(n):
            key = None
            if virtual_t1 >= int(self.target):
                key = next(it1, None)
                if key is not None:
                    from_t1.append(key)
                    virtual_t1 -= 1
                    continue
            key = next(it2, None)
            if key is not None:
                from_t2.append(key)
                continue
            key = next(it1, None)
            if key is None:
                return None
            from_t1.append(key)
            virtual_t1 -= 1
        # applied in selection order (arc.py keeps one list); T1's and T2's victims go to different ghosts
        for key in from_t1:
            del t1[key]
            self.b1[key] = None
        for key in from_t2:
            del t2[key]
            self.b2[key] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return n

    def prepare_store(self, keys: list[int], counts: _OfferCounts | None, missed: set[int]
                      ) -> tuple[list[int] | None, int, int]:
        """One ``prepare_store(keys)`` call: (the chunks stored, or None when it cannot free room; chunks evicted;
        chunks skipped by the threshold). The chunks to store first adapt the target once per request
        (``on_store_miss``, before eviction, even when the store then fails), then go to T1's MRU end in prefix
        order, leaving B1 / B2; the offered keys are protected from this call's eviction."""
        if counts is not None:
            counts.record(keys)
        t1, t2 = self.t1, self.t2
        new = [k for k in keys if k not in t1 and k not in t2]
        skipped = 0
        if counts is not None:
            admitted = counts.admit(new)
            skipped, new = len(new) - len(admitted), admitted
        first_misses = [k for k in new if k not in missed]
        if first_misses:
            for key in reversed(first_misses):
                self._adapt(key)
            missed.update(first_misses)
        if not new:
            return new, 0, skipped
        need = len(new) - (self.capacity - len(t1) - len(t2))
        evicted = 0
        if need > 0:
            if self.evict(need, set(keys)) is None:
                return None, 0, skipped
            evicted = need
        b1_pop, b2_pop = self.b1.pop, self.b2.pop
        for key in new:
            t1[key] = None
            b1_pop(key, None)
            b2_pop(key, None)
        return new, evicted, skipped

    def serve(self, offered: list[int], recorded: Sequence[int], counts: _OfferCounts | None, output_tokens: int
              ) -> tuple[list[int] | None, int, int]:
        """A request's store (``offered``: step 4) and finish (``recorded``: what it loaded or offered, step 5):
        (the chunks stored, None when the store failed; chunks evicted; chunks skipped by the threshold).

        A failed ``prepare_store`` is retried by every later step of the request, its decode steps and the step
        that sees it finished (``_build_store_jobs`` leaves ``next_stored_chunk_idx`` where it was,
        distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py@0.32.0): without a threshold the retries
        change nothing; with one they count the offers again, and fail again (more admitted, no more room)."""
        new: list[int] | None = []
        evicted = skipped = 0
        if offered:
            missed: set[int] = set()
            for _ in range(1 + max(1, output_tokens) if counts is not None else 1):
                new, evicted, skip = self.prepare_store(offered, counts, missed)
                skipped += skip
                if new is not None:
                    break
        self.finish(recorded, new or [])
        return new, evicted, skipped

    def finish(self, recorded: Sequence[int], inserted: list[int]) -> None:
        """``on_request_finished``, tail to head over the chunks the request loaded or offered: a chunk it stored
        becomes the most recent of T1; one it reused (loaded, or offered while present) moves from T1 to T2's MRU
        end or to T2's MRU end; a chunk no longer there is left alone."""
        t1, t2 = self.t1, self.t2
        stored = set(inserted)
        for key in reversed(recorded):
            if key in stored:
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    t2.move_to_end(key)
            elif key in t1:
                del t1[key]
                t2[key] = None
            elif key in t2:
                t2.move_to_end(key)


def simulate_tiers(requests: Iterable[TierRequest], block_size: int, gpu_blocks: int, tier_chunks: int,
                   blocks_per_chunk: int = 1, keep_per_request: bool = False,
                   tier_out: list | None = None, eviction_policy: str = "lru", store_threshold: int = 0,
                   max_tracker_size: int = MAX_TRACKER_SIZE, state_out: dict | None = None) -> TierHits:
    """Serve the requests one at a time through the GPU pool and the CPU tier (module docstring, steps
    1-5), under ``eviction_policy`` ("lru" or "arc") and ``store_threshold`` (< 2: every offered chunk is
    stored). ``tier_out``, when given, receives the tier's content at the end (chunk keys as block ids, the
    least recent first; ARC: T1 then T2); ``state_out`` the policy's state (LRU: ``tier``; ARC: ``t1``, ``t2``,
    ``b1``, ``b2``, ``target``; with a threshold: ``counts``, (key, offers) least recent first): the parity
    test compares them with vLLM's manager."""
    B, bpc = block_size, blocks_per_chunk
    if B < 1 or bpc < 1:
        raise KvplanError("the block size and the blocks per chunk must be >= 1")
    if gpu_blocks < 0 or tier_chunks < 0:
        raise KvplanError("pool and tier sizes must be >= 0")
    if eviction_policy not in EVICTION_POLICIES:
        raise KvplanError(f"unknown eviction policy {eviction_policy!r}", "vLLM 0.32 has lru (its default) and arc")
    if store_threshold < 0 or max_tracker_size < 1:
        raise KvplanError("the store threshold must be >= 0 and the tracker size >= 1")
    # store_threshold < 2 stores every offered chunk (v1/kv_offload/cpu/spec.py@0.32.0, manager.py@0.32.0)
    counts = _OfferCounts(store_threshold, max_tracker_size) if store_threshold >= 2 else None
    arc = _ArcTier(tier_chunks) if eviction_policy == "arc" else None
    skipped = 0
    gpu: OrderedDict[int, None] = OrderedDict()  # cached GPU blocks, the least recent first
    tier: OrderedDict[int, None] = OrderedDict()  # chunks in the CPU tier, the least recent first
    seen: set[int] = set()  # chunk keys ever stored
    fresh = 0  # ids of generated blocks: negative, never hit
    queried = gpu_hits = tier_hits = stored = evicted = failed = served = 0
    per_request: list[tuple[int, int]] = []
    gpu_has, tier_has = gpu.__contains__, (tier.__contains__ if arc is None else arc.has)
    tier_pop = tier.pop
    for req in requests:
        served += 1
        P, keys = req.prompt_tokens, req.keys
        queried += P
        n = len(keys)
        # 1. the GPU hit: the leading blocks still cached, at most (P - 1) // B. The cached blocks of a
        # prompt are always a prefix of it (a request touching block k touched blocks 0..k-1 after it)
        cached = len(list(takewhile(gpu_has, keys)))
        g = min(cached, (P - 1) // B)
        # 2. the tier lookup, from the chunk holding the GPU boundary (chunk i's key: its last block's id)
        chunks = keys[bpc - 1::bpc] if bpc > 1 else keys  # P // tpc of them
        nk = len(chunks)
        start = g // bpc
        ext = 0
        if (nk * bpc - g) * B >= bpc * B and tier_chunks:
            h = len(list(takewhile(tier_has, islice(chunks, start, nk))))
            ext = (bpc * (start + h) - g) * B
            if ext < bpc * B:  # less than a chunk beyond the GPU hit: nothing loaded
                ext = 0
        if ext:
            first = start  # 3. loaded [start, start + h); stores start after them
            offered = chunks[start + h:]
        else:
            first = 0
            offered = chunks
        t_blocks = ext // B
        gpu_hits += g * B
        tier_hits += ext
        if keep_per_request:
            per_request.append((g, t_blocks))
        # 4. the store: chunks already there are protected; the others need room
        if tier_chunks and arc is not None:  # ARC: steps 4 and 5 under its own lists
            new, ev, skip = arc.serve(offered, chunks[first:] if first else chunks, counts, req.output_tokens)
            skipped += skip
            if new is None:
                failed += 1
            else:
                evicted += ev
                stored += len(new)
                seen.update(new)
        elif tier_chunks:
            new = list(filterfalse(tier_has, offered))
            if counts is not None and offered:  # store_threshold: prepare_store counts the offer, then filters
                counts.record(offered)
                candidates = new
                new = counts.admit(candidates)
                skipped += len(candidates) - len(new)
            if new:
                need = len(new) - (tier_chunks - len(tier))
                if need > 0:
                    protected = set(offered)
                    victims = list(islice(filterfalse(protected.__contains__, tier), need))
                    if len(victims) < need:
                        failed += 1
                        new = []
                        if counts is not None:  # the retries (as under ARC above): counted, failing again
                            for _ in range(max(1, req.output_tokens)):
                                counts.record(offered)
                                skipped += len(candidates) - len(counts.admit(candidates))
                    else:
                        deque(map(tier_pop, victims), 0)
                        evicted += need
                if new:
                    stored += len(new)
                    seen.update(new)
            # 5. finish: what it loaded or offered, still there or just stored, becomes the most recent,
            # its first chunk the newest
            recorded = chunks[first:] if first else chunks
            if new and len(new) == len(recorded):  # all new (the usual case): inserted in their final order
                tier.update(zip(reversed(new), repeat(None)))
            else:
                if new:
                    tier.update(zip(new, repeat(None)))
                present = list(filter(tier_has, recorded))
                deque(map(tier.move_to_end, reversed(present)), 0)
        # the GPU pool after the request: its blocks the most recent (first block newest), its generated
        # full blocks below them, and its partial last block (if any) taking a slot
        computed = P + req.output_tokens - 1
        tail = max(0, computed // B - n)
        if tail:
            gpu.update(zip(range(-fresh - 1, -fresh - tail - 1, -1), repeat(None)))
            fresh += tail
        if cached < n:  # its new blocks, the last one the least recent
            gpu.update(zip(reversed(keys[cached:]), repeat(None)))
        deque(map(gpu.move_to_end, reversed(keys[:cached])), 0)
        uncached = 1 if computed % B else 0  # its partial last block: a slot (prefix_cache.working_set)
        excess = len(gpu) - max(0, gpu_blocks - uncached)
        if excess > 0:
            deque(map(gpu.popitem, repeat(False, excess)), 0)
    if tier_out is not None:
        tier_out.extend(tier if arc is None else [*arc.t1, *arc.t2])
    if state_out is not None:
        if arc is None:
            state_out["tier"] = list(tier)
        else:
            state_out.update(t1=list(arc.t1), t2=list(arc.t2), b1=list(arc.b1), b2=list(arc.b2), target=arc.target)
        if counts is not None:
            state_out["counts"] = list(counts.counts.items())
    return TierHits(gpu_blocks=gpu_blocks, tier_chunks=tier_chunks, blocks_per_chunk=bpc, block_size=B,
                    requests=served, queried_tokens=queried, gpu_hit_tokens=gpu_hits, tier_hit_tokens=tier_hits,
                    stored_chunks=stored, evicted_chunks=evicted, failed_stores=failed, distinct_chunks=len(seen),
                    per_request=tuple(per_request), eviction_policy=eviction_policy, store_threshold=store_threshold,
                    skipped_chunks=skipped)


@dataclass(frozen=True)
class TierCurve:
    """The tier's hits against its size, at one GPU pool: ``unbounded`` is a tier that never evicts;
    ``points`` every size simulated (chunks -> tier hit tokens)."""

    at_size: TierHits  # the tier asked about
    unbounded: TierHits
    tier_for_share: dict[str, int]  # "50%" -> the smallest tier (chunks) found keeping that share
    points: dict[int, int]


def tier_curve(requests: Sequence[TierRequest], block_size: int, gpu_blocks: int, tier_chunks: int,
               blocks_per_chunk: int = 1, shares: Sequence[float] = TIER_SHARES,
               precision: float = 0.01, eviction_policy: str = "lru", store_threshold: int = 0) -> TierCurve:
    """The hits at ``tier_chunks``, an unbounded tier's, and for each share of the unbounded tier's hits
    the smallest tier keeping it, by bisection over simulations: geometric, to ``precision`` (a 1% step
    of the size), each step one `simulate_tiers` run. Bisection assumes more room never loses hits,
    which LRU gives for one fixed access sequence (ARC does not promise it); here the accesses depend on the
    hits (a hit changes which chunks get touched), so the size found is where the simulated hits first reach
    the share. Every simulation runs under ``eviction_policy`` and ``store_threshold``."""
    if not 0 < precision < 1:
        raise KvplanError(f"invalid precision {precision}")
    for share in shares:
        if not 0 < share <= 1:
            raise KvplanError(f"invalid share {share}", "use a fraction in (0, 1]")

    def run(t: int) -> TierHits:
        return simulate_tiers(requests, block_size, gpu_blocks, t, blocks_per_chunk,
                              eviction_policy=eviction_policy, store_threshold=store_threshold)

    at = run(tier_chunks)
    top = max(1, at.distinct_chunks)
    unbounded = at if tier_chunks >= top else run(top)
    top = max(top, unbounded.distinct_chunks)  # (a larger tier can store chunks a smaller one skipped)
    points = {tier_chunks: at.tier_hit_tokens, top: unbounded.tier_hit_tokens}
    goal_of = {f"{s:.0%}": s * unbounded.tier_hit_tokens for s in shares}
    need: dict[str, int] = {}
    for name, goal in goal_of.items():
        if goal <= 0:
            need[name] = 0
            continue
        lo, hi = 0, top  # hits(lo) < goal <= hits(hi)
        known = [t for t, v in points.items() if v >= goal]
        hi = min(known) if known else top
        below = [t for t, v in points.items() if v < goal and t < hi]
        lo = max(below) if below else 0
        while hi - lo > max(1, int(lo * precision)):
            mid = (lo + hi) // 2 if lo == 0 or hi > 4 * lo else int((lo * hi) ** 0.5)
            mid = min(max(mid, lo + 1), hi - 1)
            if mid not in points:
                points[mid] = run(mid).tier_hit_tokens
            if points[mid] >= goal:
                hi = mid
            else:
                lo = mid
        need[name] = hi
    return TierCurve(at_size=at, unbounded=unbounded, tier_for_share=need, points=dict(sorted(points.items())))


def traffic_tier_requests(traffic: Traffic, block_size: int) -> list[TierRequest]:
    """The traffic's requests in the order `kvplan.plan.prefix_cache.traffic_working_set` serves them
    (`replay_order`), hashed."""
    return list(tier_requests(replay_order(traffic), block_size))


def workload_tier(traffic: Traffic, block_size: int, gpu_blocks: int, tier_chunks: int,
                  blocks_per_chunk: int = 1, eviction_policy: str = "lru", store_threshold: int = 0) -> WorkloadTier:
    """What `kvplan size --workload --kv-offloading-size` prints: the GPU, tier and missed shares of the
    prompt tokens with this pool and this tier, and the tier each share of an unbounded tier's hits needs,
    under the tier's ``eviction_policy`` and ``store_threshold`` (kv_connector_extra_config)."""
    curve = tier_curve(traffic_tier_requests(traffic, block_size), block_size, gpu_blocks, tier_chunks,
                       blocks_per_chunk, eviction_policy=eviction_policy, store_threshold=store_threshold)
    at, top = curve.at_size, curve.unbounded
    policy = "LRU (its default)" if eviction_policy == "lru" else "ARC (eviction_policy arc)"
    stores = ("every full prompt chunk is offered on compute (offload_prompt_only)" if store_threshold < 2 else
              f"every full prompt chunk is offered on compute (offload_prompt_only) and stored from its "
              f"{_ordinal(store_threshold)} offer (store_threshold {store_threshold}, a tracker of "
              f"{MAX_TRACKER_SIZE:,} keys)")
    notes = [f"vLLM 0.32's native tier, {policy}, requests one at a time: lookups start where the GPU hit "
             f"ends, {stores}, a tier hit leaves its GPU-hit chunks untouched; sizes found by bisection over "
             f"simulations ({len(curve.points)} here)"]
    if at.skipped_chunks:
        notes.append(f"{at.skipped_chunks:,} offers of a chunk were below the store threshold and not stored")
    if at.failed_stores:
        notes.append(f"{at.failed_stores:,} requests had more new chunks than the tier could free and stored nothing "
                     "(one prepare_store per prefill; chunked prefill would store their later chunks)")
    return WorkloadTier(
        tier_chunks=tier_chunks, blocks_per_chunk=blocks_per_chunk,
        gpu_hit_rate=round(at.rate(at.gpu_hit_tokens), 6), tier_hit_rate=round(at.rate(at.tier_hit_tokens), 6),
        miss_rate=round(at.rate(at.missed_tokens), 6), unbounded_tier_hit_rate=round(top.rate(top.tier_hit_tokens), 6),
        tier_for_share=curve.tier_for_share,
        tier_share_used={k: round(v / tier_chunks, 4) if tier_chunks else float("inf")
                         for k, v in curve.tier_for_share.items()},
        failed_stores=at.failed_stores, notes=notes, eviction_policy=eviction_policy,
        store_threshold=store_threshold)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
