"""The hybrid scheduler's steady decode runs (`_HybridScheduler._decode_steps`: many steps at once, a request's pool
work only at the steps its ``quiet`` thresholds run out) against the same scheduler stepping every step the general
way (`_step`), and against stepping with every `allocate_slots` call made (no ``quiet`` thresholds): every field of
the result equal, on window, chunked-local and recurrent-state groups (with and without Mamba-2's checkpoint page,
every retention) beside full attention, closed and open loops, shared prefixes, pools small enough to preempt, a
token budget and a sequence cap that leave requests waiting, and a load carried on from an earlier one's pool. The
general way is the one the vLLM parity tests check (tests/vllm_facing/test_hybrid_pool_parity.py: its trace turns
the runs off)."""

from __future__ import annotations

import pytest

import kvplan.plan.hybrid_sim as hybrid_sim
from kvplan.plan.hybrid_cache import CHUNKED, FULL, MAMBA, SLIDING, CacheGroup, HybridCache, HybridGroups
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.simulate import EMPTY_POOL, Lengths, SchedulerConfig, closed_loop, open_loop, poisson_arrivals


def step_time(batch) -> float:  # every field counts, so a batch that differs shows in the times
    return 0.004 + 1e-5 * batch.prefill_tokens + 3e-6 * batch.kv_tokens_read + 1e-4 * batch.decode_seqs


def both(config, load, groups, start=None):
    """(with decode runs, stepping every step: a trace turns the runs off, as in the plain simulator's test)"""
    fast = simulate_groups(config, load, groups, step_time, start=start)
    slow = simulate_groups(config, load, groups, step_time, start=start, trace=[])
    return fast, slow


def every_call(monkeypatch, config, load, groups):
    """Stepping every step with no call skipped: every request's thresholds run out at once (`next_removal` says its
    next call may free a block)."""
    with monkeypatch.context() as patched:
        patched.setattr(HybridCache, "next_removal", lambda self, tables, computed: computed)
        return simulate_groups(config, load, groups, step_time, trace=[])


F, M, M2 = CacheGroup(FULL), CacheGroup(MAMBA), CacheGroup(MAMBA, checkpoint=True)
WINDOW = HybridGroups((CacheGroup(SLIDING, 64), F), 16, 1024, 2048)
WINDOWS = HybridGroups((CacheGroup(SLIDING, 48), CacheGroup(SLIDING, 48), F), 16, 1024, 2048)
CHUNKS = HybridGroups((CacheGroup(CHUNKED, 64), F), 16, 1024, 2048)
STATE = HybridGroups((F, M), 16, 1024, 2048)
STATE2 = HybridGroups((M2, F, M2), 16, 1024, 2048)
STATES_DENSE = HybridGroups((F, M, M), 16, 1024, 2048, None)
STATE2_WINDOW_PERIODIC = HybridGroups((F, CacheGroup(SLIDING, 40), M2), 16, 1024, 2048, 64)


@pytest.mark.parametrize("groups", [WINDOW, WINDOWS, CHUNKS, STATE, STATE2, STATES_DENSE, STATE2_WINDOW_PERIODIC],
                         ids=["window", "two-windows", "chunked", "state", "mamba2-states", "states-dense-retention",
                              "mamba2-window-periodic-retention"])
@pytest.mark.parametrize("case", ["closed", "closed-shared", "preempting", "budget", "seqs", "open"])
def test_decode_runs_equal_stepping_one_by_one(groups, case, monkeypatch):
    lengths = Lengths(96, 120, "lognormal", seed=3)
    config = SchedulerConfig(num_blocks=200, block_size=16)
    load = closed_loop(6, lengths, 4)
    if case == "closed-shared":
        load = closed_loop(6, lengths, 4, shared_prefix_tokens=48)
    elif case == "preempting":
        config = SchedulerConfig(num_blocks=40, block_size=16)
    elif case == "budget":  # every running request's token spends the budget: the waiting ones wait for it
        config = SchedulerConfig(num_blocks=200, block_size=16, max_num_batched_tokens=4)
    elif case == "seqs":
        config = SchedulerConfig(num_blocks=200, block_size=16, max_num_seqs=3)
    elif case == "open":
        load = open_loop([t * 0.3 for t in poisson_arrivals(1.0, 30, 5)], lengths, shared_prefix_tokens=32)
    fast, slow = both(config, load, groups)
    assert fast == slow
    assert slow == every_call(monkeypatch, config, load, groups)
    if case == "preempting":
        assert fast.preemptions > 0
    if case in ("budget", "seqs"):
        assert fast.peak_waiting > 0


def test_a_carried_pool_gives_the_same_next_load():
    config = SchedulerConfig(num_blocks=60, block_size=16)
    lengths = Lengths(80, 70, "lognormal", seed=1)
    first_fast, first_slow = both(config, closed_loop(3, lengths, 3, shared_prefix_tokens=32), WINDOW,
                                  start=EMPTY_POOL)
    assert first_fast == first_slow
    then_fast, then_slow = both(config, closed_loop(4, lengths, 3, 9, shared_prefix_tokens=32), WINDOW,
                                start=first_fast.pool_after)
    assert then_fast == then_slow and then_fast.prefix_hits > 0


@pytest.mark.parametrize("groups", [WINDOW, STATE2], ids=["window", "mamba2-states"])
def test_the_runs_are_taken(monkeypatch, groups):
    """(Else the equalities above would hold trivially.) A closed loop of 6 streams runs most of its steps in decode
    runs."""
    ran = []
    original = hybrid_sim._HybridScheduler._decode_steps

    def counted(self, max_steps):
        ran.append(original(self, max_steps))
        return ran[-1]

    monkeypatch.setattr(hybrid_sim._HybridScheduler, "_decode_steps", counted)
    res = simulate_groups(SchedulerConfig(num_blocks=200, block_size=16), closed_loop(6, Lengths(96, 120), 4), groups,
                          step_time)
    assert sum(ran) > res.steps // 2


@pytest.mark.parametrize("groups", [WINDOW, STATE2], ids=["window", "mamba2-states"])
def test_runs_are_taken_while_the_head_waits_for_kv_blocks(monkeypatch, groups):
    """(Else the equalities above would not show the blocked-head runs.) On a pool small enough to preempt, some runs
    are taken while a request that could be tried waits for KV blocks (`_head_need`, `_still_blocked`): most steps, here
    (1,346 of 1,520 beside a window, 991 of 1,267 beside Mamba-2 states)."""
    blocked_steps = []
    original = hybrid_sim._HybridScheduler._decode_steps

    def counted(self, max_steps):
        waits = bool(self.waiting) and len(self.running) < self.config.max_num_seqs
        ran = original(self, max_steps)
        if waits:
            blocked_steps.append(ran)
        return ran

    monkeypatch.setattr(hybrid_sim._HybridScheduler, "_decode_steps", counted)
    res = simulate_groups(SchedulerConfig(num_blocks=40, block_size=16),
                          closed_loop(6, Lengths(96, 120, "lognormal", seed=3), 4), groups, step_time)
    assert sum(blocked_steps) > res.steps // 2


@pytest.mark.parametrize("groups", [WINDOW, WINDOWS, CHUNKS, STATE, STATE2, STATES_DENSE, STATE2_WINDOW_PERIODIC])
def test_releasable_counts_what_remove_skipped_frees(monkeypatch, groups):
    """`HybridCache.releasable` (the frees `_still_blocked` allows for) against `remove_skipped` itself, at every call
    of a preempting simulation stepped one by one."""
    seen = []
    original = HybridCache.remove_skipped

    def checked(self, tables, computed):
        expected = self.releasable(tables, computed)
        freed = original(self, tables, computed)
        seen.append((expected, freed))
        return freed

    monkeypatch.setattr(HybridCache, "remove_skipped", checked)
    simulate_groups(SchedulerConfig(num_blocks=40, block_size=16), closed_loop(6, Lengths(96, 120, "lognormal", seed=3), 4),
                    groups, step_time, trace=[])
    assert all(expected == freed for expected, freed in seen)
    assert sum(freed for _, freed in seen) > 50
