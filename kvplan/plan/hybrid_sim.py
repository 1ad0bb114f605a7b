"""The scheduler simulator (kvplan.plan.simulate) over a hybrid KV cache: full-attention, sliding-window and
chunked-local groups sharing one block pool (kvplan.plan.hybrid_cache). Pure.

The steps are the plain simulator's (`Scheduler.schedule`, v1/core/sched/scheduler.py@0.32.0); what differs is
the pool, as `KVCacheManager.allocate_slots` (v1/core/kv_cache_manager.py@0.32.0) works it for several groups:

- a running request calls it every step it is scheduled, not only when it needs a block: a window group
  first frees the blocks that slid out of the window (even when the allocation then fails and the request
  preempts others), then every group gets the blocks of the step's tokens, then the newly full blocks are
  offered to the cache (a window group's only at its replay boundary and junction);
- admission looks up the hit every group agrees on, checks the whole sequence fits (window groups capped at
  their admission bound) and the first chunk does, then touches the hits (skipped ones are nulls);
- finishing or preemption frees group by group, each table's last block first;
- with a recurrent-state group (Mamba "align" mode) the scheduler cuts every prefill chunk where a state must
  be cached (`mamba_aligned_chunk`, a running request given 0 tokens is passed over for the step; with
  Mamba-2's checkpoint page a prompt's last chunk is not cut at its replay boundary), and a waiting request
  whose hit ends on a state cached in this step waits for the next one.

Steady decode stretches run many steps at once (`_HybridScheduler._decode_steps`), a request's pool work done only
at the steps where it does something; `replay_one_at_a_time` is the fast path for requests served one at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from kvplan.errors import KvplanError
from kvplan.plan.block_pool import BlockPool
from kvplan.plan.hybrid_cache import HybridCache, HybridGroups, mamba_aligned_chunk
from kvplan.plan.simulate import (
    CarriedPool,
    Load,
    SchedulerConfig,
    SimResult,
    SimTurn,
    StepBatch,
    _keys,
    _Req,
    _Scheduler,
    paused_gc,
    simulate,
)
from kvplan.plan.steplog import decode_pricer
from kvplan.units import cdiv


def simulate_groups(config: SchedulerConfig, load: Load, groups: HybridGroups | None,
                    step_time: Callable[[StepBatch], float] | None = None, max_steps: int = 5_000_000,
                    trace: list[tuple] | None = None, start: CarriedPool | None = None) -> SimResult:
    """`simulate` on a model's KV cache groups: the plain simulator for one full-attention group (or
    ``groups`` None), else the hybrid pool. ``trace`` receives, beside the plain simulator's events (their
    hits and tables per group), ``("wait", request, num_tokens)`` when admission is refused and ``("stall",
    request, num_tokens, new_tokens)`` when a running request's allocation fails (before it preempts); like the
    plain simulator's, ``("budget", request)`` when a step leaves ``request`` waiting for the token budget (here
    also for a first chunk that Mamba's block-aligned split rounds down to no block). ``start``: `simulate`'s (the
    pool an earlier load on these groups left; its ``pool_after`` then kept)."""
    if groups is None or groups.full_attention_only:
        return simulate(config, load, step_time, max_steps, trace, start)
    with paused_gc():
        scheduler = _HybridScheduler(config, load, step_time, trace, groups, start)
        result = scheduler.run(max_steps)
        if start is not None:
            result.pool_after = CarriedPool(scheduler.pool.state(), scheduler.counter)
        return result


class _HybridScheduler(_Scheduler):
    pool_class = BlockPool  # (HybridCache keeps tables of block ids, 0 the null block)

    def __init__(self, config: SchedulerConfig, load: Load, step_time, trace, groups: HybridGroups,
                 start: CarriedPool | None = None):
        if groups.block_size != config.block_size:
            raise KvplanError(f"the KV groups' block size {groups.block_size} is not the pool's {config.block_size}")
        super().__init__(config, load, step_time, trace, start)
        self.cache = HybridCache(groups, self.pool)
        self.max_model_len = groups.max_model_len
        # Per request (by rid): its block table in each group, the leading blocks each offered the cache, and
        # the shared-prefix junction its last lookup found (vLLM's request.shared_prefix_boundary).
        self.tables: dict[int, list[list[int]]] = {}
        self.offered: dict[int, list[int]] = {}
        self.junction: dict[int, int] = {}
        # Per request (by rid): while its computed tokens stay below the first and its tokens at most the second and
        # below the third, `allocate_slots` frees, takes and caches nothing (a decode step but where a block starts or
        # fills, or a window or state lets one go: 13 of every 16 at block 16 beside a window or a state group):
        # (`next_removal`, its tables' blocks x B, its next full block's end).
        self.quiet: dict[int, tuple[float, int, int]] = {}
        self.mamba = groups.has_mamba
        self.checkpoint = groups.mamba_checkpoint
        if self.mamba:
            self._cut_chunk = self._chunk

    # ---------------------------------------------------------------- the pool

    def _held(self, req: _Req) -> None:
        """``req.blocks``: how many pool blocks it holds over every group, counted from its tables (0: the null
        block; only their number is read: its peak)."""
        req.blocks = _Held(sum(len(table) - table.count(0) for table in self.tables.get(req.rid, ())))

    def _cache_to(self, req: _Req, upto: int) -> None:
        offered = self.offered[req.rid]
        if min(upto, req.num_tokens) // self.B <= min(offered) and not self.mamba:  # no newly full block
            return  # (a state group may re-register its replay state: every call counts)
        junction = self.junction.get(req.rid, 0)
        boundaries = (req.prompt - 1, junction) if junction else (req.prompt - 1,)
        self.cache.cache(self.tables[req.rid], offered, min(upto, req.num_tokens),
                         lambda start, stop: _keys(req, start, stop, self.B), boundaries)

    def _grow(self, req: _Req, num_tokens: int, new_tokens: int) -> bool:
        if self._allocate_slots(req, num_tokens):
            return True
        if self.trace is not None:
            self.trace.append(("stall", req.tl.index, req.num_tokens, new_tokens))
        return False

    def _allocate_slots(self, req: _Req, num_tokens: int) -> bool:
        """A running request's `allocate_slots` for ``num_tokens`` in all: out-of-window blocks freed, the
        new blocks if they fit (False if not), the full ones cached."""
        quiet = self.quiet.get(req.rid)
        if quiet is not None and req.computed < quiet[0] and num_tokens <= quiet[1] and \
                min(num_tokens, req.num_tokens) < quiet[2]:
            return True  # nothing slid out of a window, no new block, none newly full: every call below a no-op
        tables = self.tables[req.rid]
        freed = self.cache.remove_skipped(tables, req.computed)
        prefill_end = max(req.prompt, req.num_tokens - 1)
        if (self.cache.blocks_to_allocate(tables, num_tokens, [], req.computed, prefill_end=prefill_end)
                > self.pool.num_free):
            self.quiet.pop(req.rid, None)
            if freed:
                self._held(req)
            return False
        taken = self.cache.allocate(tables, num_tokens, req.computed, prefill_end)
        self._cache_to(req, num_tokens)
        if self.mamba:
            if freed or taken:
                self._held(req)
        else:  # (stateless groups: the blocks held change by exactly these counts)
            req.blocks.count += taken - freed
        # A state group's call also counts when it re-registers the replay boundary's state as cached in this step
        # (`_recache_replay_state`), which no call these thresholds cover does: that needs the state's block held and
        # the full blocks ending on it, at token a. Its retirement (the first threshold) keeps the computed tokens <= a,
        # so this call ended at a, holding no block past it, and a later call's new token needs one (the second).
        B = self.B
        self.quiet[req.rid] = (self.cache.next_removal(tables, req.computed), min(map(len, tables)) * B,
                               (min(self.offered[req.rid]) + 1) * B)
        return True

    def _free(self, req: _Req) -> None:
        self.quiet.pop(req.rid, None)
        tables = self.tables.pop(req.rid, None)
        if tables is not None:
            self.cache.free(tables)
            del self.offered[req.rid]
        req.blocks = []

    def _tables(self, req: _Req) -> tuple:
        return tuple(tuple(t) for t in self.tables[req.rid])

    # ---------------------------------------------------------------- one step

    def _needs_room(self, req: _Req, num_tokens: int) -> bool:
        return True  # allocate_slots runs every step: a window frees the blocks that slid out of it

    def _chunk(self, req: _Req, start: int, num_new_tokens: int) -> int:
        """The tokens a step schedules of ``num_new_tokens`` from ``start``: cut where a state must be cached
        when the model has a recurrent-state group (`_mamba_block_aligned_split`)."""
        if not self.mamba:
            return num_new_tokens
        return mamba_aligned_chunk(start, num_new_tokens, req.prompt, req.num_tokens, self.B,
                                   self.config.max_num_batched_tokens, self.junction.get(req.rid, 0),
                                   self.checkpoint)

    def _schedule_running(self, scheduled: list[tuple[_Req, int, int]], budget: int) -> tuple[int, bool]:
        if self.mamba:  # a step starts (`new_step_starts`); the plain loop then cuts chunks with `_cut_chunk`
            self.cache.new_step()
            if self.trace is not None:
                self.trace.append(("step",))
        return super()._schedule_running(scheduled, budget)

    def _scheduled(self, req: _Req, num_tokens: int, new_tokens: int) -> None:
        if self.trace is not None:  # (the full blocks were cached by _allocate_slots)
            self.trace.append(("alloc", req.tl.index, req.num_tokens, new_tokens, self._tables(req)))

    def _admit_waiting(self, scheduled: list[tuple[_Req, int, int]], budget: int) -> bool:
        config, pool, cache, waiting = self.config, self.pool, self.cache, self.waiting
        while waiting and budget > 0 and len(self.running) < config.max_num_seqs:
            req = waiting[0]
            found = self._admission(req, budget)
            if found is None:  # no block-aligned chunk fits the budget left: the step admits no more
                return False
            hits, computed, first_chunk, need = found
            fits = need <= pool.num_free
            prefill_end = max(req.prompt, req.num_tokens - 1)
            if config.prefix_caching and (fits or not config.prefix_stats_at_admission):
                if req.tl.preemptions:
                    self.pre_queries, self.pre_hits = self.pre_queries + req.num_tokens, self.pre_hits + computed
                else:
                    self.queries, self.hits_tokens = self.queries + req.num_tokens, self.hits_tokens + computed
            if not fits:
                if self.trace is not None:
                    self.trace.append(("wait", req.tl.index, req.num_tokens))
                return True
            if not req.tl.preemptions:
                req.tl.cached_tokens = computed
            tables = self.tables[req.rid] = cache.add_hits(hits, computed)
            self.offered[req.rid] = [len(t) for t in tables]
            req.computed = computed
            cache.allocate(tables, computed + first_chunk, computed, prefill_end)
            self._cache_to(req, computed + first_chunk)
            self._held(req)
            if self.trace is not None:
                self.trace.append(("admit", req.tl.index, req.num_tokens, tuple(tuple(h) for h in hits), first_chunk,
                                   self._tables(req)))
            waiting.popleft()
            self.running.append(req)
            if req.tl.admitted_step is None:
                req.tl.admitted_step, req.tl.admitted_time = self.step, self.now
            scheduled.append((req, first_chunk, computed))
            budget -= first_chunk
        return False

    def _admission(self, req: _Req, budget: int, kv_only: bool = False) -> tuple[list[list[int]], int, int, int] | None:
        """A waiting request's attempt with ``budget`` tokens left: (its hits per group, its computed tokens, its first
        chunk, the blocks admitting it needs), or None when no block-aligned first chunk fits the budget. It needs
        the most of the whole sequence's blocks, window groups at their admission cap (``full_sequence_must_fit``,
        with ``admit_full_prompt``), and its first chunk's; ``kv_only``: `blocks_to_allocate`'s. The lookup sets its
        shared-prefix junction (vLLM's request.shared_prefix_boundary)."""
        config, cache, B = self.config, self.cache, self.B
        if config.prefix_caching:
            hits, computed, junction = cache.lookup(_keys(req, 0, (req.num_tokens - 1) // B, B), req.num_tokens - 1)
        else:
            hits, computed, junction = [[] for _ in cache.kinds], 0, 0
        self.junction[req.rid] = junction
        first_chunk = self._chunk(req, computed, min(req.num_tokens - computed, budget))
        if not first_chunk:
            return None
        prefill_end = max(req.prompt, req.num_tokens - 1)
        need = cache.blocks_to_allocate(None, computed + first_chunk, hits, computed, prefill_end=prefill_end,
                                        kv_only=kv_only)
        if config.admit_full_prompt:
            need = max(need, cache.blocks_to_allocate(None, min(req.num_tokens, self.max_model_len), hits, computed,
                                                      capped=True, prefill_end=prefill_end, kv_only=kv_only))
        return hits, computed, first_chunk, need

    def _admission_blocks(self, req: _Req) -> int:
        """Over every group, each at its admission cap (the full-sequence check, `_admit_waiting`)."""
        no_hits = [[] for _ in self.cache.kinds]
        return self.cache.blocks_to_allocate(None, min(req.num_tokens, self.max_model_len), no_hits, 0, capped=True,
                                             prefill_end=max(req.prompt, req.num_tokens - 1))

    def _decode_steps(self, max_steps: int) -> int:
        """The plain simulator's steady decode steps (`_Scheduler._decode_steps`: every running request decodes one
        token, none can be admitted), run at once over a hybrid pool. A step's pool work is each running request's
        `allocate_slots`, in running order, and a request's call does nothing at a step its ``quiet`` thresholds
        cover (no block slides out of a window, none starts, none fills). So the run calls `_allocate_slots` only at
        the step each request's thresholds run out, with the request as that step sees it, in running order among
        that step's calls: the same calls, doing the same work in the same order, as stepping one by one. Window
        groups free blocks at those calls and take the new ones in the same order, so the pool ends the same.

        The run stops before a step whose calls might not all fit: fewer free blocks than one a group for each of its
        calling requests (a decode token starts at most one block a group; the frees before each take only help).
        `_step` runs that step (and its preemptions). Not with a trace, or while a waiting request could be admitted:
        with a head that may be tried, only while it surely waits for KV blocks (`_head_need`, rechecked at each
        step whose calls change the pool: `_still_blocked`). A state group's `new_step` is not called in the run: what
        it clears is read only by an admission, and the next `_step` starts with it."""
        config, running, waiting = self.config, self.running, self.waiting
        num = len(running)
        budget_left = config.max_num_batched_tokens - num
        if not num or budget_left < 0 or self.trace is not None:
            return 0
        may_admit = budget_left > 0 and num < config.max_num_seqs
        blocked, head_need, head_hits = False, 0, set()
        if may_admit and waiting:  # the head is tried every step: a run only while it surely waits for KV blocks
            found = self._head_need(budget_left)
            if found is None or found[0] <= self.pool.num_free:
                return 0
            blocked, (head_need, head_hits) = True, found
        horizon = max_steps - self.step
        kv = num  # kv_tokens_read of the first step: sum of (computed + 1)
        base: list[tuple[int, int]] = []  # each request's (computed, generated) at the run's start
        due: dict[int, list[tuple[int, _Req]]] = {}  # step of the run -> (running position, request) calling then
        for i, req in enumerate(running):
            c = req.computed
            if not req.generated or c != req.prompt + req.generated - 1:
                return 0  # (not decoding: a prompt chunk or a recomputation left)
            horizon = min(horizon, req.output - req.generated)
            kv += c
            base.append((c, req.generated))
            due.setdefault(self._quiet_until(req, c) - c, []).append((i, req))
        pool, pending, price, usable = self.pool, self.pending_q, decode_pricer(self.step_time), self.usable
        per_call = len(self.cache.kinds)  # blocks one decode token may start, at most
        ends: list[float] = []
        fills: list[float] = []
        kv_first = kv
        now, step = self.now, self.step
        peak_used, peak_waiting = self.peak_used, max(self.peak_waiting, len(waiting))
        budget_spent = budget_left == 0 and self.first_budget_step is None
        budget_wait = (step, now) if budget_spent and waiting else None
        next_arrival = pending[0][0] if pending else math.inf
        for j in range(horizon):
            if next_arrival <= now:  # arrivals seen at this step's start (behind a blocked head)
                if may_admit and not blocked:
                    break
                next_arrival = self._take_arrivals(step, now)
                peak_waiting = max(peak_waiting, len(waiting))
                if budget_spent and budget_wait is None and waiting:
                    budget_wait = (step, now)
            calls = due.get(j)
            if calls:
                if len(calls) * per_call > pool.num_free:  # one might not fit: a step of its own
                    break
                if blocked and not self._still_blocked(head_need, head_hits, [(base[i][0] + j, req) for i, req in calls],
                                                       len(calls) * per_call):
                    break
                del due[j]
                for i, req in sorted(calls, key=_first):
                    c, g = base[i]
                    req.computed, req.generated = c + j, g + j  # (the request as step j sees it)
                    if not self._allocate_slots(req, c + j + 1):
                        raise AssertionError("a decode step's allocation failed after its room was checked")
                    if len(req.blocks) > req.tl.peak_blocks:
                        req.tl.peak_blocks = len(req.blocks)
                    # (its next call: the next step at the earliest, which `_step` would make anyway)
                    due.setdefault(j + max(1, self._quiet_until(req, c + j) - (c + j)), []).append((i, req))
            used = usable - pool.num_free
            if used > peak_used:
                peak_used = used
            end = now + price(num, kv)
            ends.append(end)
            fills.append(used / usable)
            now = end
            step += 1
            kv += num
        steps = len(ends)
        if not steps:
            return 0
        self.log.add_decode_run(num, kv_first, ends, fills)
        self.peak_used, self.peak_waiting = peak_used, peak_waiting
        self.peak_running = max(self.peak_running, num)
        if blocked:
            for req in waiting:
                req.tl.waited_for_kv = True
            self._waited()
        done: list[_Req] = []
        for req, (c, g) in zip(running, base):
            req.computed, req.generated = c + steps, g + steps
            req.tl.token_times.extend(ends)
            if req.generated >= req.output:
                done.append(req)
        return self._end_run(steps, done, step, now, budget_wait)

    def _head_need(self, budget: int) -> tuple[int, set[int]] | None:
        """The blocks the head of the queue needs to be admitted with ``budget`` tokens left (counted alone:
        `blocks_to_allocate`'s ``kv_only``; it waits for KV blocks while more than are free), and its hit blocks. None
        when a decode run may not pass its refusals over: every failed attempt counts in the prefix-cache stats (as
        the plain `_blocked_head`), a running request's keys reach past its prompt's full blocks (its new full blocks
        might be hashes of the head's prompt), or no block-aligned first chunk fits the budget (a budget wait, not a KV
        one). (`_admission`, as each attempt of `_admit_waiting`.)"""
        config, B = self.config, self.B
        if config.prefix_caching and not (config.admit_full_prompt and config.prefix_stats_at_admission):
            return None
        if any(len(req.keys) > req.prompt // B for req in self.running):
            return None
        found = self._admission(self.waiting[0], budget, kv_only=True)
        if found is None:
            return None
        hits, _, _, need = found
        return need, {b for hit in hits for b in hit if b}

    def _still_blocked(self, need: int, hits: set[int], calls: list[tuple[int, _Req]], takes: int) -> bool:
        """Whether the head of the queue, blocked since the run began needing ``need`` blocks with ``hits``, is still
        refused at a step whose ``calls`` ((computed tokens, request): each request's `allocate_slots`, at most
        ``takes`` new blocks in all) change the pool, its calls made first. Its need has not fallen: only a hit's
        eviction lowers it, and the calls cache only blocks of generated tokens (`_head_need`), so its hits never
        grow, while a hit freed adds one. When none of the first ``takes`` blocks of the free queue is a hit (the
        takes come from there, after any blocks the calls free uncached), this step evicts none either, and the free
        blocks grow by at most what the calls free (`HybridCache.releasable`)."""
        if self.pool.leads_with_any(hits, takes):
            return False
        releasable = self.cache.releasable
        return need > self.pool.num_free + sum(releasable(self.tables[req.rid], c) for c, req in calls)

    def _quiet_until(self, req: _Req, computed: int) -> int:
        """The computed tokens at which a decoding request's `_allocate_slots` next does something: the first
        ``computed`` its ``quiet`` thresholds do not cover (``computed`` itself when it has none)."""
        quiet = self.quiet.get(req.rid)
        if quiet is None:
            return computed
        removal, held_end, full_end = quiet
        # Quiet while computed < removal, computed + 1 <= held_end and computed + 1 < full_end.
        until = min(held_end, full_end - 1)
        return max(computed, int(min(removal, until)))


_first = itemgetter(0)


class _Held:
    """A hybrid request's ``blocks`` as the plain scheduler's code reads them, ``len`` only (its peak): the pool
    blocks it holds over every group. A list of them, rebuilt whenever a table changed, took a fifth of a Gemma 3
    replica's simulation."""

    __slots__ = ("count",)

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count


# --------------------------------------------------------------------------- one request at a time


def replay_one_at_a_time(turns: Sequence[SimTurn], groups: HybridGroups, usable_blocks: int,
                         max_num_batched_tokens: int = 1 << 30, prefix_caching: bool = True,
                         pool=None) -> tuple[int, int]:
    """(prompt tokens looked up, tokens hit) when the turns are served one at a time, in order, on a pool of
    ``usable_blocks``: the hybrid simulator's run of them as one session (each turn sent when the one before
    ends), the same pool operations in the same order, without its steps: a prompt goes in chunks of the
    token budget, and decoding only touches the pool at the steps where a block fills or starts, or a window
    (chunk) moves past a block. A turn the pool cannot hold alone raises a KvplanError. (``pool``: another
    pool to replay on, as `hybrid_working_set`'s unbounded one.)"""
    B = groups.block_size
    pool = pool if pool is not None else BlockPool(usable_blocks, prefix_caching)
    cache = HybridCache(groups, pool)
    G = len(groups.groups)
    sliding = [cache.spans[g] for g in range(G) if cache.kinds[g] == "sliding"]
    chunked = [cache.spans[g] for g in range(G) if cache.kinds[g] == "chunked"]
    mamba, checkpoint = groups.has_mamba, groups.mamba_checkpoint
    budget = max_num_batched_tokens
    queries = hits_tokens = 0
    for number, turn in enumerate(turns):
        P, M, ids = turn.prompt, turn.output, turn.keys

        def keys(start: int, stop: int, ids=ids, number=number) -> Sequence:
            if stop <= len(ids):
                return ids[start:stop]
            return [ids[k] if k < len(ids) else ("req", number, k) for k in range(start, stop)]

        def chunk_of(start: int, P=P, junction=0, number=number) -> int:
            n = min(P - start, budget)
            n = mamba_aligned_chunk(start, n, P, P, B, budget, junction, checkpoint) if mamba else n
            if n <= 0:
                raise KvplanError(f"request {number}: no block-aligned prefill chunk of {B:,} tokens fits the token "
                                  f"budget of {budget:,}")
            return n

        cache.new_step()  # (a turn starts in a later step than the one before ended)
        if prefix_caching:
            hits, computed, junction = cache.lookup(keys(0, (P - 1) // B), P - 1)
        else:
            hits, computed, junction = [[] for _ in range(G)], 0, 0
        chunk = chunk_of(computed, junction=junction)
        free = pool.num_free
        if (cache.blocks_to_allocate(None, min(P, groups.max_model_len), hits, computed, capped=True, prefill_end=P)
                > free or cache.blocks_to_allocate(None, computed + chunk, hits, computed, prefill_end=P) > free):
            raise KvplanError(f"request {number} cannot be admitted on a pool of {usable_blocks:,} blocks, even alone")
        queries += P
        hits_tokens += computed
        tables = cache.add_hits(hits, computed)
        offered = [len(t) for t in tables]
        boundaries = (P - 1, junction) if junction else (P - 1,)
        cache.allocate(tables, computed + chunk, computed, P)
        cache.cache(tables, offered, computed + chunk, keys, boundaries)
        computed += chunk
        steps = [computed]  # the prompt's later chunks: each step starts with `computed` tokens done
        while steps[-1] < P:
            steps.append(steps[-1] + chunk_of(steps[-1], junction=junction))
        # Decode: a step with c tokens computed computes token c + 1 (c = P .. P + M - 2). It changes the pool
        # only when a block starts (c % B == 0) or fills (c % B == B - 1), or a window / chunk group's skipped
        # blocks grow; the first decode step also frees what the prompt's last chunk left out of the window.
        # A state group also frees the state before the last token's block when c % B == 1.
        edges = (0, 1, B - 1) if mamba else (0, B - 1)
        decode = {c for c in range(P, P + M - 1) if c % B in edges} if M > 1 else set()
        if M > 1:
            decode.add(P)
            for w in sliding:  # skipped = c - w + 1 reaches a multiple of B
                decode.update(range(max(P + (w - 1 - P) % B, w - 1 + B), P + M - 1, B))
            for w in chunked:  # skipped = c // w * w moves on
                decode.update(range(P + (-P) % w, P + M - 1, w))
        for c, upto in [(a, b) for a, b in zip(steps, steps[1:])] + [(c, c + 1) for c in sorted(decode)]:
            cache.remove_skipped(tables, c)
            prefill_end = max(P, upto - 1)  # (vLLM's request holds ``upto`` tokens at this step)
            if cache.blocks_to_allocate(tables, upto, [], c, prefill_end=prefill_end) > pool.num_free:
                raise KvplanError(f"request {number} cannot finish on a pool of {usable_blocks:,} blocks, even alone")
            cache.allocate(tables, upto, c, prefill_end)
            cache.cache(tables, offered, upto, keys, boundaries)
        cache.free(tables)
    return queries, hits_tokens


class _RefsOfNone(dict):
    def __missing__(self, key: int) -> int:
        return 0


class _KeysOfNone(dict):
    def __missing__(self, key: int) -> None:
        return None


class _UnboundedPool:
    """A pool that never runs out and never evicts, for the achievable hits: blocks are numbered as taken
    (``taken``: how many; a pool that size never evicts either). It keeps only prompt blocks' hashes: served
    one at a time, nothing is preempted, so no request looks up another's generated blocks."""

    caching = True

    def __init__(self, checkpoints: bool = False) -> None:
        self.first: dict = {}
        self.ref = _RefsOfNone()  # (no block is ever free: nothing to count as evictable)
        self.key_of = _KeysOfNone()  # (a state cached in this step is never hit in it: one request at a time)
        self.taken = 0
        self.num_free = 1 << 62
        # Each cached block's hash, for `forget`: kept only beside Mamba-2 checkpoint groups (None: not kept).
        self.cached_as: dict[int, tuple] | None = {} if checkpoints else None

    def take(self, count: int) -> list[int]:
        start, self.taken = self.taken + 1, self.taken + count
        return list(range(start, self.taken + 1))

    def touch(self, blocks) -> None:
        pass

    def release(self, blocks) -> None:
        pass

    def cache(self, blocks, keys) -> None:
        for block, key in zip(blocks, keys):
            if not isinstance(key[1], tuple):  # (group, ("req", n, k)): a generated block
                self.first.setdefault(key, block)
                if self.cached_as is not None:
                    self.cached_as[block] = key

    def forget(self, block: int) -> None:
        """(A transient checkpoint's hash taken off: `BlockPool.forget`.)"""
        key = self.cached_as.pop(block, None) if self.cached_as is not None else None
        if key is not None and self.first.get(key) == block:
            del self.first[key]


@dataclass(frozen=True)
class HybridWorkingSet:
    """Hits of requests served one at a time on a hybrid pool (`replay_one_at_a_time`): the lookups, the hits an
    unbounded pool keeps, this pool's, and the pool each share of the achievable hits needs (None: none found
    up to the never-evicting size)."""

    queried_tokens: int
    achievable_tokens: int
    hit_tokens_at_pool: int
    pool_for_share: dict[float, int | None]
    never_evicting_pool: int
    replays: int


#: Block positions (over the groups) a hybrid working set replays at most, times its replays: a bound on time
#: (a replay takes ~3 us a block position: ~30 s at the bound).
MAX_HYBRID_BLOCK_OPS = 10_000_000


def hybrid_working_set(turns: Sequence[SimTurn], groups: HybridGroups, usable_blocks: int,
                       shares: Sequence[float] = (0.5, 0.9, 0.99),
                       max_num_batched_tokens: int = 1 << 30) -> HybridWorkingSet:
    """The one-at-a-time hits on ``usable_blocks``, and, by bisection over pool sizes, a pool keeping each share of
    the achievable hits: the top of a bracket narrowed to 1% (each share searched from the previous one's pool
    up). Hybrid hits need not grow with the pool at every size, so a somewhat smaller pool may keep the share
    too. Every probe is a replay of every block: a trace above `MAX_HYBRID_BLOCK_OPS` is refused."""
    B = groups.block_size
    positions = len(groups.groups) * sum(cdiv(t.prompt + t.output - 1, B) for t in turns)
    probes = 3 + 3 * 10  # the asked pool, the unbounded one, ~10 bisection probes a share (to 1%)
    if positions * probes > MAX_HYBRID_BLOCK_OPS:
        raise KvplanError(f"the traffic holds {positions:,} block positions over the model's {len(groups.groups)} KV "
                          f"groups: replaying them ~{probes} times for a hybrid model's working set is above "
                          f"kvplan's bound of {MAX_HYBRID_BLOCK_OPS:,}",
                          "replay a sample of the traffic: fewer sessions or requests")
    unbounded = _UnboundedPool(groups.mamba_checkpoint)
    queried, achievable = replay_one_at_a_time(turns, groups, 0, max_num_batched_tokens, pool=unbounded)
    top = max(1, unbounded.taken)
    memo: dict[int, int | None] = {}

    def hits(pool: int) -> int | None:
        if pool not in memo:
            try:
                memo[pool] = replay_one_at_a_time(turns, groups, pool, max_num_batched_tokens)[1]
            except KvplanError:
                memo[pool] = None  # the pool cannot hold one of the requests alone
        return memo[pool]

    at_pool = hits(usable_blocks) or 0
    found: dict[float, int | None] = {}
    lo = 1
    for share in sorted(shares):
        goal = share * achievable
        if goal <= 0:
            found[share] = 0
            continue
        if (hits(top) or 0) < goal:  # (never: the never-evicting pool keeps every achievable hit)
            found[share] = None
            continue
        a, b = lo, top  # b keeps the goal; stop within 1% of it (each probe replays every block)
        while b - a > b // 128:
            mid = (a + b) // 2
            if (hits(mid) or 0) >= goal:
                b = mid
            else:
                a = mid + 1
        found[share] = lo = b
    return HybridWorkingSet(queried, achievable, at_pool, found, top, len(memo))
