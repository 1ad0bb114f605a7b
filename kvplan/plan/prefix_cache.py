"""vLLM's prefix cache over traffic with reuse: block hashes, and the working set. Pure.

**Block hashes.** vLLM hashes each *full* block of a request's tokens together with its parent
block's hash (`hash_block_tokens`, v1/core/kv_cache_utils.py@0.32.0): two blocks are the same
cache entry exactly when every token up to the block's end is the same. `BlockHasher` gives each
distinct (parent, block content) an integer id, where a block's content is the segments' token
runs it covers (kvplan.traffic.model: equal segment keys are equal tokens); so equal ids are equal
vLLM hashes and different ids never collide.

**Working set** (the timing-free answer). Requests served one at a time, the pool's free blocks
kept in vLLM's eviction order: a finished request's blocks go to the back of the free queue tail
first, so its prefix is the last to be evicted (`BlockPool.free_blocks` / `FreeKVCacheBlockQueue`,
v1/core/block_pool.py@0.32.0), and a hit takes the block out of the queue. That order is LRU over
"last used", with a request's own blocks ordered prefix-most-recent. A block is still cached when
a request arrives iff fewer than C other blocks were used more recently (its *reuse distance*
below the pool of C blocks). Because every request that uses block k of a chain also uses blocks
0..k-1, and uses them later in its own order, reuse distances grow along a chain: the hits a pool
keeps are always a prefix of the prompt, as vLLM's `find_longest_cache_hit` finds them. So the
hits at pool size C are ``sum(clamp(C - distance, 0, blocks))`` over the runs of blocks reused,
one pass computes every C, and the curve says which pool keeps 50 / 90 / 99% of the hits any
pool could keep. Concurrency is not in it (requests in flight pin blocks and shrink the room
left for cached ones): the simulator (kvplan.plan.simulate) answers with it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from kvplan.errors import KvplanError
from kvplan.plan.block_pool import BlockPool
from kvplan.plan.hybrid_cache import HybridCache, HybridGroups
from kvplan.plan.hybrid_sim import hybrid_working_set
from kvplan.plan.schema import WorkloadPlan, WorkloadTier
from kvplan.plan.simulate import SimTurn, paused_gc, session_load
from kvplan.traffic.model import Segment, Traffic, Turn


class BlockHasher:
    """Integer ids for vLLM's chained block hashes of prompts made of segments.

    Ids are numbered from 1 in the order blocks are first seen. A block is one of two kinds:

    - a block *straddling* segments (two spans or more), named by ``(parent id, its spans)``;
    - a block one segment holds whole: it belongs to a *run*, the whole blocks one segment holds from one
      offset after one chain, named by ``(chain id, segment key, offset)`` (like `working_set`'s runs).
      A run is stored as the list of its blocks' ids, so a 512-token segment already seen after the same
      chain costs one lookup, not 32; a longer copy of the segment extends the list (a shorter one takes
      a prefix: token ids are prefix-stable).

    A whole block belongs to one run only: a run starts either at offset 0 (block 0 of its segment) or
    just after a straddling block, never after a whole block of its own segment, so its first block
    cannot also be a later block of another run (whose parent is a whole block). The blocks past a
    run's stored length are therefore new, and the ids (their values too) are those a block-at-a-time
    ``(parent, spans) -> id`` map gives."""

    def __init__(self, block_size: int):
        if block_size < 1:
            raise KvplanError("the block size must be >= 1")
        self.block_size = block_size
        self._straddling: dict[tuple, int] = {}  # (parent, spans) -> id
        self._runs: dict[tuple, list[int]] = {}  # (parent, segment key, offset) -> ids of the run's blocks
        self._count = 0  # ids given so far
        self._alone = bytearray(1)  # by id: 1 while only the prompt that made it has it (index 0 unused)

    def _straddling_id(self, parent: int, spans: tuple) -> int:
        key = (parent, spans)
        found = self._straddling.get(key)
        if found is None:
            self._count += 1
            found = self._straddling[key] = self._count
            self._alone.append(1)
        else:
            self._alone[found] = 0
        return found

    def _reused(self, run: list[int], count: int) -> None:
        """A second prompt got the run's first ``count`` ids (consecutive, unless the run was extended)."""
        first, last = run[0], run[min(count, len(run)) - 1]
        if last - first == count - 1:
            self._alone[first:last + 1] = bytes(count)
        else:
            for i in run[:count]:
                self._alone[i] = 0

    def shared_count(self, keys: Sequence[int]) -> int:
        """How many of a prompt's leading ids (`prompt_keys`) another prompt hashed so far also got. Those
        are a prefix: an id names its whole chain, so a prompt with a prompt's k-th id has its first k too."""
        return bisect_left(keys, 1, key=self._alone.__getitem__)

    def _run(self, parent: int, key: str, offset: int, count: int) -> list[int]:
        """The ids of the run's first ``count`` blocks (or more: the caller takes ``count``)."""
        name = (parent, key, offset)
        run = self._runs.get(name)
        if run is None:
            run = self._runs[name] = []
        if len(run) < count:  # blocks never seen: the next ids, in prompt order
            start = self._count + 1
            self._count += count - len(run)
            self._alone.extend(b"\x01" * (count - len(run)))
            run.extend(range(start, self._count + 1))
        return run

    def prompt_keys(self, segments: Sequence[Segment]) -> tuple[int, ...]:
        """The ids of the prompt's full blocks, in order (the last partial block has none)."""
        B, runs, alone = self.block_size, self._runs, self._alone
        out: list[int] = []
        parent = 0
        spans: list[tuple[str, int, int]] = []  # the block being filled: (segment key, start, end) runs
        filled = 0
        for seg in segments:
            key, tokens = seg.key, seg.tokens
            at = 0
            if filled:  # the segment first completes the block being filled, if it can
                at = min(B - filled, tokens)
                spans.append((key, 0, at))
                filled += at
                if filled < B:
                    continue
                parent = self._straddling_id(parent, tuple(spans))
                out.append(parent)
                spans, filled = [], 0
            count = (tokens - at) // B
            if count:  # then its whole blocks: one run (`_run`, inline: a call per segment less)
                name = (parent, key, at)
                run = runs.get(name)
                if run is None:  # never seen: the next ids, in prompt order
                    start = self._count + 1
                    self._count += count
                    run = runs[name] = list(range(start, self._count + 1))
                    alone.extend(b"\x01" * count)
                else:  # a second prompt has its first ``count`` ids (`_reused`, inline for consecutive ones)
                    first = run[0]
                    if count <= len(run) and run[count - 1] - first == count - 1:
                        alone[first:first + count] = bytes(count)
                    else:
                        self._reused(run, count)
                    if len(run) < count:
                        run = self._run(parent, key, at, count)
                out.extend(run if len(run) == count else run[:count])
                parent = run[count - 1]
                at += count * B
            if at < tokens:  # its rest starts the next block
                spans, filled = [(key, at, tokens)], tokens - at
        return tuple(out)

    def __len__(self) -> int:
        return self._count


# --------------------------------------------------------------------------- working set


@dataclass(frozen=True)
class WorkingSet:
    """Hits as a function of the pool (in blocks), requests served one at a time.

    ``distances`` / ``weights``: each reused run of blocks, its reuse distance (blocks used more
    recently) and its length in blocks; ``achievable_blocks``: hits an unbounded pool keeps (every
    full block that an earlier request cached, up to each prompt's last token)."""

    block_size: int
    requests: int
    queried_tokens: int  # prompt tokens of all requests (vLLM's prefix_cache_queries)
    achievable_blocks: int
    distances: tuple[int, ...]  # sorted
    weights: tuple[int, ...]  # in the order of ``distances``
    # distances + weights sorted, and running sums of both (hit_blocks in O(log n))
    _ends: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _distance_sums: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _end_sums: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ends = tuple(sorted(d + w for d, w in zip(self.distances, self.weights)))
        object.__setattr__(self, "_ends", ends)
        object.__setattr__(self, "_distance_sums", tuple(accumulate(self.distances, initial=0)))
        object.__setattr__(self, "_end_sums", tuple(accumulate(ends, initial=0)))

    def hit_blocks(self, pool_blocks: int) -> int:
        """Blocks a pool of ``pool_blocks`` serves from cache over the whole traffic: a run at distance d of w
        blocks keeps min(w, C - d) when d < C, which is (C - d) - (C - d - w) once its end d + w is below C,
        so the sum is two sums over sorted positions."""
        c = pool_blocks
        started = bisect_left(self.distances, c)
        ended = bisect_left(self._ends, c)
        return (started * c - self._distance_sums[started]) - (ended * c - self._end_sums[ended])

    def hit_rate(self, pool_blocks: int) -> float:
        """Hit tokens / queried tokens at that pool (the rate vLLM's counters give)."""
        return self.hit_blocks(pool_blocks) * self.block_size / self.queried_tokens if self.queried_tokens else 0.0

    def pool_for(self, share: float) -> int:
        """The smallest pool (blocks) keeping ``share`` of the achievable hits."""
        if not 0 < share <= 1:
            raise KvplanError(f"invalid share {share}", "use a fraction in (0, 1]")
        goal = share * self.achievable_blocks
        if goal <= 0:
            return 0
        lo, hi = 0, (self.distances[-1] + max(self.weights)) if self.distances else 0
        while lo < hi:
            mid = (lo + hi) // 2
            if self.hit_blocks(mid) >= goal:
                hi = mid
            else:
                lo = mid + 1
        return lo


class _Fenwick:
    """Sums over positions 1..n, n growing by one at a time: `append` costs O(1) amortized, and `add` walks
    only the ancestors built so far (few for a recent position, the usual one)."""

    def __init__(self) -> None:
        self.tree = [0]

    def append(self, value: int) -> None:
        tree = self.tree
        i = len(tree)
        # tree[i] sums (i - lowbit(i), i]: the value and the nodes tree[i - 1], tree[i - 2], tree[i - 4]...
        step, low = 1, i & -i
        while step < low:
            value += tree[i - step]
            step <<= 1
        tree.append(value)

    def add(self, i: int, delta: int) -> None:
        tree, n = self.tree, len(self.tree)
        while i < n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        tree, total = self.tree, 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


def working_set(turns: Iterable[Turn], block_size: int) -> WorkingSet:
    """The reuse distances of every request's prompt blocks, requests in the order given (a replay's
    arrival order), in one pass over the prompts' segments.

    **Runs.** Blocks go a *run* at a time: the blocks one segment holds whole from one offset after one
    chain, or a single block straddling segments, so a 512-token segment costs one step, not 32. A run is
    named by where it starts, ``(chain, segment key, offset)`` (a straddling block by ``(chain, its
    spans)``), and a chain (the prompt up to a block boundary) by its last run and how many of that run's
    blocks it holds. Equal names are equal vLLM hashes (as `BlockHasher`'s ids are); a shorter copy of a
    segment covers a prefix of the same run (token ids are prefix-stable: kvplan.traffic.tokens); and a
    run's blocks sit at the same prompt position in every request (the chain fixes it).

    **Distances.** A request ``r`` that reuses the block at position ``x`` of its prompt, last used by
    request ``j``, finds as more recent: every block last used by requests after ``j`` (a Fenwick tree
    over request numbers holds each block at its last user), and the blocks of ``j`` before position ``x``
    that no later request took (a prefix of ``j``'s prompt moves on as a whole, since chains are reused
    from the start: ``moved[j]`` blocks). A run's blocks can have several last users (a shorter copy of a
    segment reused only its first blocks): ``pieces[run]`` holds them as ``(end, j, end, j...)``, newest
    first, blocks ``[previous end, end)`` last used by ``j``. Along a prompt the last users only get older
    (a request that uses a block uses every block before it), so ``r`` takes its blocks from one request
    after another, a *stretch* each: it looks a stretch's blocks up, then moves them to itself.

    **Stale copies.** A cached block the request does not look up (its last, when the prompt ends on a block
    boundary: the last token is always computed; or any past a miss) is computed again into a new block with the
    same hash, and vLLM keeps both (`BlockHashToBlockMap`). The old copy stays where it was, holding a slot
    (``stale``: its prompt positions, counted in its request's distances once a later request moved past them);
    the request's copy is the hash's newer one. vLLM's lookup takes the older copy while it lasts, which moves the
    stale slot to the newer copy's place; the curve keeps it at the older one's, so it can count one block too
    few for blocks last used between the two: it may over-predict by a block per such copy, never under-predict
    (tests/plan/test_prefix_cache.py, against the simulator)."""
    turns = list(turns)
    B = block_size
    if B < 1:
        raise KvplanError("the block size must be >= 1")
    runs: dict[tuple, int] = {}  # a run's name -> its number, from 1 (chain run 0: the empty chain)
    # run number -> its blocks' last users: tuples of ints, which the GC stops tracking (with a list per run
    # its collections walked every run: 1.5 times the time)
    pieces: list[tuple[int, ...]] = [()]
    tree = _Fenwick()  # request number -> the blocks it was the last to use
    moved = [0] * (len(turns) + 1)  # leading blocks of each request's prompt a later request took
    # request -> prompt positions of its stale copies: blocks a later request computed again instead of hitting
    # (past its hits), which stay in the pool where they were; rare, so a list each
    stale: dict[int, list[int]] = {}
    # (distance, blocks) pairs as one int each, distance << shift | blocks: ints sort several times faster
    # than tuples, fastest within a machine word, so shift is just wide enough for the longest run
    shift = (max((t.prompt_tokens for t in turns), default=0) // B).bit_length()
    pairs: list[int] = []
    queried = achievable = total_blocks = 0
    uncached_prev = 0  # the previous request's uncached (partial) last block, still in the queue
    r = 0
    for r, turn in enumerate(turns, 1):
        prompt_tokens = turn.prompt_tokens
        queried += prompt_tokens
        left = (prompt_tokens - 1) // B  # blocks looked up (the last token is always computed)
        held = new_blocks = 0  # the prompt's full blocks so far, and those no request held before
        user = taken = reach = 0  # the stretch: the request its blocks come from, how many, where they end
        offset = None  # the distance of the stretch's block at prompt position x is offset + x (once looked up)
        chain_run = chain_blocks = 0  # the empty chain
        spans: list[tuple[str, int, int]] = []  # the block being filled: (segment key, start, end) runs
        filled = 0
        for seg in turn.segments:
            key, tokens = seg.key, seg.tokens
            at = 0
            while at < tokens:  # the segment's runs: the block it completes, then the blocks it holds whole
                if filled:
                    at = min(B - filled, tokens)
                    spans.append((key, 0, at))
                    filled += at
                    if filled < B:
                        break
                    where, count = (chain_run, chain_blocks, tuple(spans)), 1
                    spans, filled = [], 0
                else:
                    count = (tokens - at) // B
                    if not count:  # the rest starts the prompt's next block
                        spans, filled = [(key, at, tokens)], tokens - at
                        break
                    where = (chain_run, chain_blocks, key, at)
                    at += count * B
                number = len(pieces)
                run = runs.setdefault(where, number)
                if run == number:  # never seen: new blocks, and so is every later run (its chain is new)
                    pieces.append((count, r))
                    new_blocks += count
                else:
                    found = pieces[run]
                    want = count if count < left else left  # blocks of the run to look up
                    start = i = 0  # found[i], found[i + 1]: the piece holding the run's blocks [start, end)
                    while start < count and i < len(found):
                        end, j = found[i], found[i + 1]
                        if j != user:  # a new stretch: the previous one's blocks move to this request
                            if user:
                                tree.add(user, -taken)
                                moved[user] = reach  # (a request's blocks move on in prompt order)
                            user, taken, offset = j, 0, None
                        if start < want:
                            if offset is None:
                                # blocks last used after j, as before this request (it changed the tree only
                                # at later requests, past j's prefix sum), less j's blocks a later request took;
                                # the previous request's partial block holds a slot (uncached blocks go to the
                                # head of the free queue, vLLM 0.23+)
                                offset = total_blocks - tree.prefix(j) - moved[j] + uncached_prev
                                if j in stale:  # its stale copies inside the moved prefix still hold a slot
                                    offset += sum(1 for at in stale[j] if at < moved[j])
                            pairs.append((offset + held + start) << shift | ((end if end < want else want) - start))
                        stop = end if end < count else count
                        # Only looked-up blocks move to this request. A cached block past the lookups (the
                        # prompt's last, when it ends on a block boundary) is recomputed into a new block with
                        # the same hash: the old copy stays where it was, and this request's copy is the newer.
                        moves_to = stop if stop < want else want
                        if moves_to > start:
                            taken += moves_to - start
                            reach = held + moves_to
                        if stop > moves_to:
                            stale.setdefault(j, []).extend(range(held + max(start, moves_to), held + stop))
                        start = stop
                        i += 2
                    if start < want:  # a never-seen block ends the chain
                        achievable += start
                        left = 0
                    else:
                        achievable += want
                        left -= want
                    new_blocks += count - (start if start < want else want)  # never seen, or recomputed
                    # This request now holds the run's blocks [0, count); the older pieces past them stay.
                    if end > count:
                        i -= 2
                    pieces[run] = (count, r) + found[i:]
                chain_run, chain_blocks = run, count
                held += count
        if user:
            tree.add(user, -taken)
            moved[user] = reach
        # Its other full blocks (the last sampled token is never computed) hold generated tokens no
        # prompt repeats: cached, never hit, but they take room (freed before the prompt: less recent).
        computed = prompt_tokens + turn.output_tokens - 1
        tail = max(0, computed // B - held)
        total_blocks += new_blocks + tail
        tree.append(held + tail)
        # Its last block, when partial, holds no hash: freed to the head of the queue, it takes a slot
        # from the cache until the next request's first new block reuses it (vLLM 0.23+).
        uncached_prev = 1 if computed % B else 0
    pairs.sort()
    mask = (1 << shift) - 1
    return WorkingSet(block_size=B, requests=r, queried_tokens=queried, achievable_blocks=achievable,
                      distances=tuple([p >> shift for p in pairs]), weights=tuple([p & mask for p in pairs]))


def traffic_working_set(traffic: Traffic, block_size: int) -> WorkingSet:
    """`working_set` of a traffic's turns in the order a one-at-a-time replay sends them: by arrival
    (a session's later turns follow its earlier ones, with their think times after an earlier turn's
    arrival as the ordering clock)."""
    return working_set(replay_order(traffic), block_size)


def replay_order(traffic: Traffic) -> list[Turn]:
    """Turns by the time a request-at-a-time replay would send them: absolute arrivals as given; a
    later turn at its previous turn's time plus its think time (service time is not known here);
    ties in file order (a stable sort)."""
    turns = traffic.turns
    times: list[float] = []
    at: dict[str, float] = {}
    for turn in turns:
        t = float(turn.arrival_s) if turn.arrival_s is not None else at.get(turn.session, 0.0) + turn.think_s
        at[turn.session] = t
        times.append(t)
    return [turns[i] for i in sorted(range(len(turns)), key=times.__getitem__)]


def traffic_load(traffic: Traffic, block_size: int, time_scale: float = 1.0, client_delay=None):
    """The traffic as the simulator's session load (kvplan.plan.simulate.session_load): each turn's
    full prompt blocks as hash ids, arrivals and think times multiplied by ``time_scale`` (a replay's
    ``--time-scale``), sessions numbered in order of first appearance."""

    if not 0 < time_scale <= 1e6:
        raise KvplanError(f"invalid time scale {time_scale}", "use a factor > 0 (0.5 replays twice as fast)")
    hasher = BlockHasher(block_size)
    numbers: dict[str, int] = {}
    with paused_gc():  # millions of ids, no garbage (kvplan.plan.simulate.paused_gc)
        keys = [hasher.prompt_keys(t.segments) for t in traffic.turns]
        # Once every prompt is hashed, each turn also says how many of its ids another turn has too.
        turns = [SimTurn(numbers.setdefault(t.session, len(numbers)), t.prompt_tokens, t.output_tokens, k,
                         arrival=None if t.arrival_s is None else t.arrival_s * time_scale,
                         think=t.think_s * time_scale, shared_keys=hasher.shared_count(k))
                 for t, k in zip(traffic.turns, keys)]
    return session_load(turns, client_delay)


# --------------------------------------------------------------------------- kvplan size --workload


#: The shares of the achievable hits `kvplan size --workload` names a pool for.
HIT_SHARES = (0.5, 0.9, 0.99)


def session_peak_turns(traffic: Traffic, block_size: int) -> dict[str, tuple[int, Turn]]:
    """Per session, in order of first appearance: the most blocks one of its turns holds (``cdiv(P + M - 1, B)``)
    and the first turn that holds them."""
    peaks: dict[str, tuple[int, Turn]] = {}
    for t in traffic.turns:
        held = -(-(t.prompt_tokens + t.output_tokens - 1) // block_size)
        if held > peaks.get(t.session, (0, None))[0]:
            peaks[t.session] = (held, t)
    return peaks


def sessions_held_at_once(traffic: Traffic, block_size: int, usable_blocks: int,
                          groups: HybridGroups | None = None) -> int:
    """The most sessions whose largest turns fit the pool together, the blocks they share counted once,
    taking the largest sessions first (a worst case: the sessions in flight are the heaviest). On a hybrid
    cache (``groups``) a turn holds its blocks in every full-attention group (shared ones counted once per
    group) and, in each window / chunk group, what admission reserves there: at most the group's cap
    (kvplan.plan.hybrid_cache), never shared.

    Only the sessions taken, and the first one that does not fit, are hashed: a block's id names its content
    (`BlockHasher`: equal chains get equal ids in any order of hashing), so the blocks two turns share do not
    depend on which other turns were hashed (a 100,000-session trace whose pool holds 53 hashed them all)."""
    peaks = session_peak_turns(traffic, block_size)
    full, caps = 1, ()
    if groups is not None and not groups.full_attention_only:
        full = sum(g.kind == "full" for g in groups.groups)
        caps = tuple(c for c in HybridCache(groups, BlockPool(1)).cap if c is not None)
    hasher = BlockHasher(block_size)
    held: set[int] = set()
    unique = 0
    count = 0
    for peak, turn in sorted(peaks.values(), key=lambda p: -p[0]):  # (stable: ties in order of first appearance)
        keys = hasher.prompt_keys(turn.segments)
        shared = len(held.intersection(keys))
        need = (peak - shared) * full + sum(min(peak, cap) for cap in caps)
        if unique + need > usable_blocks:
            break
        unique += need
        held.update(keys)
        count += 1
    return count


def workload_plan(traffic: Traffic, block_size: int, usable_blocks: int, groups: HybridGroups | None = None,
                  tier: WorkloadTier | None = None, max_num_batched_tokens: int = 1 << 30):
    """What `kvplan size --workload` prints: the hits the pool keeps and the pool each share needs; ``tier``
    (--kv-offloading-size: kvplan.plan.tier_cache.workload_tier, which builds on this module) goes with it.
    ``groups``: the model's KV cache groups (kvplan.plan.hybrid_cache.HybridGroups.of_capacity, which refuses
    what is not modelled); a hybrid cache is replayed (`hybrid_workload_plan`)."""

    if groups is not None and not groups.full_attention_only:
        if tier is not None:
            raise KvplanError(f"the CPU tier's hits on a hybrid KV cache ({groups.describe()}) are not modelled",
                              "drop --kv-offloading-size to see the GPU pool's hits")
        return hybrid_workload_plan(traffic, groups, usable_blocks, max_num_batched_tokens)
    ws = traffic_working_set(traffic, block_size)
    notes = ["requests served one at a time (no timing): requests in flight pin blocks and leave less room for "
             "cached ones; kvplan bench --traffic replays it on the engine beside the simulator's figures"]
    need = {f"{share:.0%}": ws.pool_for(share) for share in HIT_SHARES}
    return WorkloadPlan(
        source=traffic.source, requests=traffic.num_requests, sessions=len(traffic.sessions), block_size=block_size,
        pool_blocks=usable_blocks, queried_tokens=ws.queried_tokens,
        achievable_hit_rate=round(ws.achievable_blocks * block_size / ws.queried_tokens, 6) if ws.queried_tokens else 0.0,
        hit_rate_at_pool=round(ws.hit_rate(usable_blocks), 6), pool_for_share=need,
        pool_share_used={k: round(v / usable_blocks, 4) if usable_blocks else float("inf") for k, v in need.items()},
        sessions_held_at_once=sessions_held_at_once(traffic, block_size, usable_blocks), notes=notes,
        tier=tier)


def hybrid_sim_turns(traffic: Traffic, block_size: int) -> list[SimTurn]:
    """The traffic's turns in `replay_order`, as the one-at-a-time replay takes them (hash ids of their full
    prompt blocks)."""
    hasher = BlockHasher(block_size)
    return [SimTurn(0, t.prompt_tokens, t.output_tokens, hasher.prompt_keys(t.segments)) for t in replay_order(traffic)]


def _hybrid_note(groups: HybridGroups) -> str:
    """What the hybrid working set assumes, for the kinds of group the model has."""
    kinds = {g.kind for g in groups.groups}
    note = (f"hybrid KV cache ({groups.describe()}): a hit is the prefix every group has cached (vLLM 0.32's hybrid "
            "coordinator)")
    if kinds & {"sliding", "chunked"}:
        note += ("; a sliding-window group caches only the window's blocks before each prompt's last block and at "
                 "shared-prefix junctions, and frees the blocks that slide out of the window")
    if "mamba" in kinds:
        note += ("; a recurrent-state group (mamba_cache_mode align) keeps a state only where a prefill chunk ends on "
                 "a block (the scheduler cuts chunks there) and caches the one at each prompt's last whole block "
                 "and at shared-prefix junctions: a hit ends on one of those states")
        if groups.mamba_checkpoint:
            note += ("; with a prefill checkpoint page (Mamba-2 from vLLM 0.32, Qwen GDN on Hopper from 0.33) a "
                     "prompt's last chunk runs past its last "
                     "whole block and exports that state inside itself, holding one more state block per group")
    return note


def hybrid_workload_plan(traffic: Traffic, groups: HybridGroups, usable_blocks: int,
                         max_num_batched_tokens: int = 1 << 30) -> WorkloadPlan:
    """`workload_plan` on a hybrid KV cache: the requests replayed one at a time through every group
    (kvplan.plan.hybrid_sim.hybrid_working_set), in the working set's order."""
    B = groups.block_size
    hws = hybrid_working_set(hybrid_sim_turns(traffic, B), groups, usable_blocks, HIT_SHARES, max_num_batched_tokens)
    q = hws.queried_tokens
    need = {f"{share:.0%}": hws.pool_for_share[share] or hws.never_evicting_pool for share in HIT_SHARES}
    notes = ["requests served one at a time (no timing): requests in flight pin blocks and leave less room for "
             "cached ones; kvplan bench --traffic replays it on the engine beside the simulator's figures",
             _hybrid_note(groups),
             f"pool sizes found by bisection to a 1% bracket over {hws.replays} one-at-a-time replays; hybrid hits "
             "need not grow with the pool at every size, so a somewhat smaller pool may keep the share too"]
    return WorkloadPlan(
        source=traffic.source, requests=traffic.num_requests, sessions=len(traffic.sessions), block_size=B,
        pool_blocks=usable_blocks, queried_tokens=q,
        achievable_hit_rate=round(hws.achievable_tokens / q, 6) if q else 0.0,
        hit_rate_at_pool=round(hws.hit_tokens_at_pool / q, 6) if q else 0.0, pool_for_share=need,
        pool_share_used={k: round(v / usable_blocks, 4) if usable_blocks else float("inf") for k, v in need.items()},
        sessions_held_at_once=sessions_held_at_once(traffic, B, usable_blocks, groups), notes=notes)
