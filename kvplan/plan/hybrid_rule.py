"""The bench's onsets on a hybrid KV cache: the first closed-loop level that waits for KV blocks, and the first that
preempts, for a model whose KV cache is several groups (sliding-window or chunked-local beside full attention)
taking blocks from one pool. Pure.

The single-group block rule (kvplan.plan.blocks.BlockRule) counts ``cdiv(P + M - 1, B)`` blocks a request; on a
hybrid pool a request holds blocks in every group, and a window group's count rises and falls: its prompt's
blocks are all allocated at prefill (`SingleTypeKVCacheManager.get_num_blocks_to_allocate`, nothing skipped at
0 computed tokens), then `remove_skipped_blocks` frees those wholly before the next token's window
(``computed - W + 1`` tokens skipped, `SlidingWindowManager.get_num_skipped_tokens`) at every later
`allocate_slots` (v1/core/single_type_kv_cache_manager.py@0.32.0, v1/core/kv_cache_manager.py@0.32.0). So the
onsets come from the hybrid scheduler simulator (kvplan.plan.hybrid_sim.simulate_groups, checked against
vLLM's own KVCacheManager in tests/vllm_facing/test_hybrid_pool_parity.py), run as the bench runs a point:
``c`` streams in lockstep (every stream's first request at once, the next when the previous ends), the
workload's lengths by request number (drawn ones included), in engine steps.

`HybridRule` answers what the bench asks of a BlockRule (the onsets, and per level: waits, preempts, fill,
label). Beside them it finds the first level below the first KV wait at which a request waits for the token
budget (``max_num_batched_tokens``) rather than for blocks (`SimResult.first_budget_wait_step`): vLLM's waiting gauge
counts those too, so the bench tells a budget-limited point from a KV wait by it (kvplan.bench.point). Like the
block rule it takes the events to be monotone in the level: it searches the first level with each event from a
guess (the pool over one request's peak), galloping and bisecting, and every level's answer is read off the
onsets. A search stops at ``searched_up_to`` (twice the KV-wait onset, at least 8: the top of the bench's own
sweep, kvplan.bench.sweep.default_max_concurrency): None there means none up to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvplan.errors import KvplanError
from kvplan.plan.block_pool import BlockPool
from kvplan.plan.blocks import load_label
from kvplan.plan.hybrid_cache import HybridCache, HybridGroups
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.simulate import SchedulerConfig, SimResult, closed_loop
from kvplan.units import cdiv

#: Requests a stream the simulation sends at most: the first waves decide a lockstep loop of identical
#: requests; more only cost time (a stream of drawn lengths may meet its onset in a later wave: said in the doc).
MAX_SIMULATED_REQUESTS_PER_STREAM = 4
#: Request-steps (a request scheduled in a step) all the simulations of one prediction may take: ~6 us each in
#: the hybrid simulator (1,300 streams x 3 requests of 512 + 128 tokens, 0.5 M request-steps: 3 s), so ~60 s.
MAX_REQUEST_STEPS = 10_000_000


@dataclass
class HybridRule:
    """Closed-loop streams of a workload on the pool of ``config`` shared by ``groups``.

    ``lengths(number)``: (prompt, output) of request ``number`` as bench draws them; ``prompt_tokens`` /
    ``output_tokens``: the lengths the prediction is shown with (the asked ones, or a trace's means);
    ``requests_per_stream(c)``: how many requests each of ``c`` streams sends (capped at
    `MAX_SIMULATED_REQUESTS_PER_STREAM`); ``shared_prefix``: the fraction of each prompt every request shares."""

    config: SchedulerConfig
    groups: HybridGroups
    lengths: Callable[[int], tuple[int, int]]
    prompt_tokens: int
    output_tokens: int
    requests_per_stream: Callable[[int], int]
    shared_prefix: float = 0.0
    results: dict[int, SimResult] = field(default_factory=dict, repr=False)  # the levels simulated
    request_steps: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.groups.block_size != self.config.block_size:
            raise KvplanError(f"the KV groups' block size {self.groups.block_size} is not the pool's "
                              f"{self.config.block_size}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise KvplanError("the hybrid rule needs a prompt and >= 1 output token")
        one = self._simulate(1)  # one request alone: its peak over the groups, and whether it fits at all
        if one.preempted or one.waited_for_kv:
            raise KvplanError(f"one request of {self.prompt_tokens} + {self.output_tokens} tokens does not fit the "
                              f"pool of {self.usable_blocks:,} usable blocks alone")
        self.peak_blocks = one.peak_used_blocks
        cache = HybridCache(self.groups, BlockPool(self.usable_blocks, False))
        self.admit_blocks = self._admit_blocks(cache)
        # The guess: streams in lockstep hold their last step's blocks together (a large pool's prefills are
        # chunked apart, their prompts' window blocks not held at once); a pool prefilling them together waits
        # sooner, at its one-request peak, and the search gallops down to it.
        guess = max(1, self.usable_blocks // self._last_step_blocks(cache) + 1)
        self.first_kv_wait = self._first_level(lambda r: r.waited_for_kv, guess, self._top(guess))
        self.searched_up_to = self._top(self.first_kv_wait or guess)
        self.first_preemption = self._first_level(lambda r: r.preempted, self.first_kv_wait or guess,
                                                  self.searched_up_to)
        # Waits for the budget, below the first KV wait only (from it on a load waits for KV whatever else it waits
        # for): searched from the levels the onsets simulated (the least with one, else the most below the top), so
        # a budget that never binds costs few new runs.
        self.budget_searched_up_to = (self.first_kv_wait - 1) if self.first_kv_wait else self.searched_up_to
        self.first_budget_wait = None
        if self.budget_searched_up_to >= 1:
            top = self.budget_searched_up_to
            budget_waits = [level for level, r in self.results.items() if r.waited_for_budget and level <= top]
            self.first_budget_wait = self._first_level(
                lambda r: r.waited_for_budget,
                min(budget_waits) if budget_waits else max(level for level in self.results if level <= top), top)

    # ---------------------------------------------------------------- what the bench reads (as of a BlockRule)

    @property
    def num_blocks(self) -> int:
        return self.config.num_blocks

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def usable_blocks(self) -> int:
        return self.config.usable_blocks

    @property
    def max_num_seqs(self) -> int:
        return self.config.max_num_seqs

    @property
    def kv_groups(self) -> str:
        return self.groups.describe()

    def waits_for_kv(self, concurrency: int) -> bool:
        return self.first_kv_wait is not None and min(concurrency, self.max_num_seqs) >= self.first_kv_wait

    def preempts(self, concurrency: int) -> bool:
        return self.first_preemption is not None and min(concurrency, self.max_num_seqs) >= self.first_preemption

    def waits_for_budget(self, concurrency: int) -> bool | None:
        """Some request waits for the token budget at ``concurrency`` streams; None above the levels searched for it
        (from the first KV wait on) when none below had one."""
        level = min(concurrency, self.max_num_seqs)
        if self.first_budget_wait is not None:
            return level >= self.first_budget_wait
        return False if level <= self.budget_searched_up_to else None

    def kv_fill(self, concurrency: int) -> float:
        """Predicted peak share of usable blocks in use: the simulated level's, else every stream at one request's peak."""
        if concurrency in self.results:
            return min(1.0, self.results[concurrency].peak_kv_fill)
        return min(1.0, min(concurrency, self.max_num_seqs) * self.peak_blocks / self.usable_blocks)

    def label(self, concurrency: int) -> str:
        """KV-limited, budget-limited, admission-limited (max_num_seqs) or neither (kvplan.plan.blocks.load_label)."""
        return load_label(self.waits_for_kv(concurrency), concurrency, self.max_num_seqs,
                          bool(self.waits_for_budget(concurrency)))

    # ---------------------------------------------------------------- the search

    def _top(self, level: int) -> int:
        return min(self.max_num_seqs, max(8, 2 * level))

    def _admit_blocks(self, cache: HybridCache) -> int:
        """Free blocks a request of the shown lengths needs to be admitted: its whole prompt in every group, a window
        group at its admission cap (`max_admission_blocks_per_request`, kv_cache_interface.py@0.32.0)."""
        return cache.blocks_to_allocate(None, min(self.prompt_tokens, self.groups.max_model_len),
                                        [[] for _ in self.groups.groups], 0, capped=True,
                                        prefill_end=self.prompt_tokens)

    def _last_step_blocks(self, cache: HybridCache) -> int:
        """Blocks a request of the shown lengths holds at its last step (``P + M - 2`` tokens computed, slots for
        ``P + M - 1``): every group's, less a window / chunk group's skipped ones."""
        tokens, computed = self.prompt_tokens + self.output_tokens - 1, self.prompt_tokens + self.output_tokens - 2
        required = cdiv(tokens, self.block_size)
        return sum(required - min(required, cache.skipped_tokens(g, computed) // self.block_size)
                   for g in range(len(self.groups.groups)))

    def _simulate(self, level: int) -> SimResult:
        if level not in self.results:
            k = max(1, min(self.requests_per_stream(level), MAX_SIMULATED_REQUESTS_PER_STREAM))
            steps = level * k * (self.output_tokens + cdiv(self.prompt_tokens, self.config.max_num_batched_tokens))
            if self.request_steps + steps > MAX_REQUEST_STEPS:
                raise KvplanError(f"predicting the onsets on the hybrid KV pool would simulate more than "
                                  f"{MAX_REQUEST_STEPS:,} request-steps (level {level:,})")
            self.request_steps += steps
            self.results[level] = simulate_groups(self.config, closed_loop(level, self.lengths, k,
                                                                           shared_prefix=self.shared_prefix),
                                                  self.groups)
        return self.results[level]

    def _first_level(self, event: Callable[[SimResult], bool], guess: int, top: int) -> int | None:
        """The smallest level in 1..``top`` whose lockstep closed loop has ``event`` (taken as monotone): from
        ``guess``, galloping down or up to a bracket, then bisecting it. None: not even at ``top``."""
        guess = max(1, min(guess, top))
        first_step = max(1, guess // 32)  # a large pool's onset moves from the guess by a share of it (chunked prefills)
        if event(self._simulate(guess)):
            yes, step = guess, first_step
            while True:  # down: the first level below without it
                no = max(0, yes - step)
                if no == 0 or not event(self._simulate(no)):
                    break
                yes, step = no, step * 2
        else:
            no, step = guess, first_step
            while True:
                yes = min(top, no + step)
                if event(self._simulate(yes)):
                    break
                if yes == top:
                    return None
                no, step = yes, step * 2
        while yes - no > 1:  # no < first <= yes
            mid = (no + yes) // 2
            if event(self._simulate(mid)):
                yes = mid
            else:
                no = mid
        return yes
