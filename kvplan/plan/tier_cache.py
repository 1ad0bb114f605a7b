"""The two-tier prefix cache: the GPU pool and vLLM's native CPU offload tier behind it. Pure.

With ``--kv-offloading-size`` vLLM 0.32 runs the OffloadingConnector: its scheduler side
(``OffloadingConnectorScheduler``, distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py@0.32.0)
asks the CPU tier's manager (``CPUOffloadingManager``, v1/kv_offload/cpu/manager.py@0.32.0, LRU policy
by default: v1/kv_offload/cpu/policies/lru.py@0.32.0) for the tokens beyond the GPU pool's hit, and
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
   unprotected chunks. When the others outnumber the free chunks plus the unprotected ones, the call
   stores nothing (``prepare_store`` returns None). The chunks the request just loaded are not
   protected: its own store may evict them.
5. **Finish** (``on_request_finished``): every chunk the request loaded or offered that is still there
   becomes the most recent, its first one the newest (LRU ``on_request_finished`` re-ranks them in
   reverse prefix order). A request with a tier hit does not touch the tier's copy of its GPU-hit
   chunks: neither loaded nor offered.

Assumed (the model is timing-free): a request's prefill is one scheduler step, so its stores are one
``prepare_store`` call (chunked prefill splits it, which changes the result only for a request with more
new chunks than the tier holds: one call stores nothing, several store its later chunks), and loads and
stores finish before the next request arrives (in flight, a chunk is a ``HIT_PENDING`` that defers the
request, and pinned chunks cannot be evicted). ``store_threshold`` is 0 (vLLM's default: every offered
chunk is stored) and the policy is LRU (vLLM's default; ARC, ``eviction_policy: arc``, is not modelled).
The tier counts chunks of ONE KV cache group: with several groups each group's block takes its own
chunk (kvplan.plan.offload), so give this model the chunks one group gets.

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


def simulate_tiers(requests: Iterable[TierRequest], block_size: int, gpu_blocks: int, tier_chunks: int,
                   blocks_per_chunk: int = 1, keep_per_request: bool = False,
                   tier_out: list | None = None) -> TierHits:
    """Serve the requests one at a time through the GPU pool and the CPU tier (module docstring, steps
    1-5). ``tier_out``, when given, receives the tier's content at the end (chunk keys as block ids, the
    least recent first): the parity test compares it with vLLM's manager."""
    B, bpc = block_size, blocks_per_chunk
    if B < 1 or bpc < 1:
        raise KvplanError("the block size and the blocks per chunk must be >= 1")
    if gpu_blocks < 0 or tier_chunks < 0:
        raise KvplanError("pool and tier sizes must be >= 0")
    gpu: OrderedDict[int, None] = OrderedDict()  # cached GPU blocks, the least recent first
    tier: OrderedDict[int, None] = OrderedDict()  # chunks in the CPU tier, the least recent first
    seen: set[int] = set()  # chunk keys ever stored
    fresh = 0  # ids of generated blocks: negative, never hit
    queried = gpu_hits = tier_hits = stored = evicted = failed = served = 0
    per_request: list[tuple[int, int]] = []
    gpu_has, tier_has = gpu.__contains__, tier.__contains__
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
        if tier_chunks:
            new = list(filterfalse(tier_has, offered))
            if new:
                need = len(new) - (tier_chunks - len(tier))
                if need > 0:
                    protected = set(offered)
                    victims = list(islice(filterfalse(protected.__contains__, tier), need))
                    if len(victims) < need:
                        failed += 1
                        new = []
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
        tier_out.extend(tier)
    return TierHits(gpu_blocks=gpu_blocks, tier_chunks=tier_chunks, blocks_per_chunk=bpc, block_size=B,
                    requests=served, queried_tokens=queried, gpu_hit_tokens=gpu_hits, tier_hit_tokens=tier_hits,
                    stored_chunks=stored, evicted_chunks=evicted, failed_stores=failed, distinct_chunks=len(seen),
                    per_request=tuple(per_request))


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
               precision: float = 0.01) -> TierCurve:
    """The hits at ``tier_chunks``, an unbounded tier's, and for each share of the unbounded tier's hits
    the smallest tier keeping it, by bisection over simulations: geometric, to ``precision`` (a 1% step
    of the size), each step one `simulate_tiers` run. Bisection assumes more room never loses hits,
    which LRU gives for one fixed access sequence; here the accesses depend on the hits (a hit changes
    which chunks get touched), so the size found is where the simulated hits first reach the share."""
    if not 0 < precision < 1:
        raise KvplanError(f"invalid precision {precision}")
    for share in shares:
        if not 0 < share <= 1:
            raise KvplanError(f"invalid share {share}", "use a fraction in (0, 1]")

    def run(t: int) -> TierHits:
        return simulate_tiers(requests, block_size, gpu_blocks, t, blocks_per_chunk)

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
                  blocks_per_chunk: int = 1) -> WorkloadTier:
    """What `kvplan size --workload --kv-offloading-size` prints: the GPU, tier and missed shares of the
    prompt tokens with this pool and this tier, and the tier each share of an unbounded tier's hits needs."""
    curve = tier_curve(traffic_tier_requests(traffic, block_size), block_size, gpu_blocks, tier_chunks,
                       blocks_per_chunk)
    at, top = curve.at_size, curve.unbounded
    notes = [f"vLLM 0.32's native tier, LRU (its default), requests one at a time: lookups start where the GPU hit "
             f"ends, every full prompt chunk is offered on compute (offload_prompt_only), a tier hit leaves its GPU-hit "
             f"chunks untouched; sizes found by bisection over simulations ({len(curve.points)} here)"]
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
        failed_stores=at.failed_stores, notes=notes)
