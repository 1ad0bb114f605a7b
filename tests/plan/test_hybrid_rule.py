"""The bench's closed-loop onsets on a hybrid KV cache (kvplan.plan.hybrid_rule.HybridRule), by hand from vLLM
0.32's rules (v1/core/single_type_kv_cache_manager.py@0.32.0): a sliding window of W tokens allocates a prompt's
blocks at prefill (`get_num_blocks_to_allocate`: nothing skipped at 0 tokens computed), then at every later
`allocate_slots` frees the blocks wholly before ``computed - W + 1`` (`get_num_skipped_tokens`,
`remove_skipped_blocks`); a chunked-local group of C tokens frees the blocks before ``computed // C * C``; admission
reserves every group's whole prompt (a window group at its cap, kv_cache_interface.py@0.32.0). The pool is the
engine tests' (tests/bench/test_replay_engine_hybrid.py): 40 blocks of 32 tokens, 39 usable, a 64-token window
beside full attention."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanError
from kvplan.plan import hybrid_rule
from kvplan.plan.blocks import BlockRule
from kvplan.plan.hybrid_cache import CHUNKED, FULL, SLIDING, CacheGroup, HybridGroups
from kvplan.plan.hybrid_rule import HybridRule
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.simulate import Lengths, SchedulerConfig, closed_loop

POOL = SchedulerConfig(num_blocks=40, block_size=32)
WINDOW = HybridGroups((CacheGroup(SLIDING, 64), CacheGroup(FULL)), 32, 512, 2048)


def _rule(prompt: int, output: int, groups: HybridGroups = WINDOW, lengths=None, per_stream: int = 8) -> HybridRule:
    return HybridRule(POOL, groups, lengths or Lengths(prompt, output), prompt, output, lambda c: per_stream)


def test_window_group_preempts_sooner_than_full_attention_alone():
    """64 + 64: full attention ends at cdiv(127, 32) = 4 blocks; the window's 2 prompt blocks grow to 4 positions, of
    which block 0 is freed at the last step (126 computed, 63 skipped): 3. 7 a request, 5 x 7 = 35 <= 39; six are all
    admitted (2 + 2 each, 24 <= 39) and grow to 42 > 39: waits and preempts at 6. Full attention alone: 10."""
    r = _rule(64, 64)
    assert (r.admit_blocks, r.peak_blocks, r.first_kv_wait, r.first_preemption) == (4, 7, 6, 6)
    assert BlockRule(40, 32, 64, 64, 1 << 30).first_kv_wait == 10
    assert [r.waits_for_kv(c) for c in (5, 6, 12)] == [False, True, True] and r.preempts(6) and not r.preempts(5)
    assert r.label(6) == "KV-limited" and r.kv_fill(5) == 35 / 39


def test_admitted_whole_and_never_growing_waits_without_preemption():
    """40 + 24: 2 blocks in each group at admission; at the last step (62 computed) the window skips nothing, and
    full attention needs cdiv(63, 32) = 2: 4 a request at every step. 39 // 4 = 9 run, the tenth waits; a running
    request never holds more than it was admitted with: no preemption up to the searched top (2 x 10)."""
    r = _rule(40, 24)
    assert (r.admit_blocks, r.peak_blocks, r.first_kv_wait, r.first_preemption, r.searched_up_to) == (4, 4, 10, None, 20)


def test_a_window_that_frees_blocks_lets_more_in_and_then_preempts():
    """100 + 60: admission takes 4 + 4 = 8 (the peak): 39 // 8 = 4 start, the fifth waits. The first decode step
    frees the window's block 0 (100 computed, 37 skipped): 28 held, 11 free, the fifth is admitted (36). From 128
    computed to the end (158) each holds 5 full + 3 window blocks (block 1 freed at 65 skipped, block 2 not before
    159 computed): five at 8 = 40 > 39, a preemption at 5. The full-attention block rule: 39 // 5 + 1 = 8, and its
    admission argument (4 x 8 fit) would call 5 KV-waiting without preemption."""
    r = _rule(100, 60)
    assert (r.admit_blocks, r.peak_blocks, r.first_kv_wait, r.first_preemption) == (8, 8, 5, 5)
    assert BlockRule(40, 32, 100, 60, 1 << 30).first_kv_wait == 8


def test_a_long_prompt_is_admission_limited():
    """256 + 4: admission reserves 8 + 8 blocks (the window's cap, cdiv(min(63 + 2048, 512), 32) + 1 = 17, is above
    8): 39 // 16 = 2 run, the third waits. Decoding, each holds 9 + 3 = 12 (the window skips 195 tokens: 6 blocks),
    24 held and 15 free < 16: no third gets in beside two, and two never outgrow the pool: no preemption up to 8."""
    r = _rule(256, 4)
    assert (r.admit_blocks, r.peak_blocks, r.first_kv_wait, r.first_preemption, r.searched_up_to) == (16, 16, 3, None, 8)


def test_chunked_local_group():
    """64 + 64 beside a 64-token chunked-local group: it frees the blocks of finished chunks (2 at 64 computed), so at
    the last step (126 computed) it holds positions 2-3: full 4 + 2 = 6 a request. 39 // 6 = 6 fit; seven are all
    admitted (2 + 2 each, 28) and grow to 42 > 39: both onsets at 7."""
    chunked = HybridGroups((CacheGroup(CHUNKED, 64), CacheGroup(FULL)), 32, 512, 2048)
    r = _rule(64, 64, chunked)
    assert (r.admit_blocks, r.peak_blocks, r.first_kv_wait, r.first_preemption) == (4, 6, 7, 7)


def test_the_search_finds_the_levels_a_scan_of_every_level_finds():
    """Drawn lengths (uniform, spread 0.5): the galloping search's onsets are the first levels of a plain scan of the
    simulator over every level up to the searched top."""
    lengths = Lengths(64, 64, "uniform", 0.5, seed=3)
    r = _rule(64, 64, lengths=lengths, per_stream=4)
    scan = {c: simulate_groups(POOL, closed_loop(c, lengths, 4), WINDOW) for c in range(1, r.searched_up_to + 1)}
    assert r.first_kv_wait == next(c for c, s in scan.items() if s.waited_for_kv)
    assert r.first_preemption == next((c for c, s in scan.items() if s.preempted), None)


def test_a_request_that_does_not_fit_alone_and_a_search_over_the_bound_are_refused(monkeypatch):
    with pytest.raises(KvplanError, match="could never finish"):  # 500 + 800 tokens: 41 blocks of full attention
        _rule(500, 800)
    monkeypatch.setattr(hybrid_rule, "MAX_REQUEST_STEPS", 500)
    with pytest.raises(KvplanError, match="more than 500 request-steps"):
        _rule(64, 64)


def test_the_first_budget_wait_is_the_first_level_whose_prompts_overflow_one_step():
    """A 128-token window beside full attention on 999 usable blocks of 16, 256 + 128 tokens (both onsets at 31), and
    a 2,048-token budget: the streams' prompts arrive together, and 8 x 256 = 2,048 fill one step, so from 9 streams
    one waits for the budget at step 0 (never at 8: the next 8 prompts again arrive together into a step of 8
    decodes ending). With no budget to speak of none waits for it below the first KV wait, and from there it is not
    searched."""
    groups = HybridGroups((CacheGroup(SLIDING, span=128), CacheGroup(FULL)), 16, 4096, 2048)

    def rule(budget: int) -> HybridRule:
        config = SchedulerConfig(num_blocks=1000, block_size=16, max_num_batched_tokens=budget, max_model_len=4096)
        return HybridRule(config, groups, lambda _: (256, 128), 256, 128, lambda _: 8)

    tight, roomy = rule(2048), rule(1 << 20)
    assert (tight.first_kv_wait, tight.first_preemption, tight.first_budget_wait) == (31, 31, 9)
    assert tight.results[9].first_budget_wait_step == 0 and [tight.label(c) for c in (8, 9, 31)] == [
        "neither", "budget-limited", "KV-limited"]
    assert (roomy.first_kv_wait, roomy.first_budget_wait) == (31, None)
    assert [roomy.waits_for_budget(c) for c in (8, 30, 31)] == [False, False, None]


def test_a_request_too_big_for_the_pool_names_its_blocks_over_every_group():
    """400 + 4 on 20 blocks (19 usable): admission takes cdiv(400, 32) = 13 blocks in each group (the window's cap,
    17, is above 13): 26 > 19, so it can never run; full attention alone (13) would have fit."""
    with pytest.raises(KvplanError, match=r"request 0 can never be admitted: it needs 26 blocks, the pool has 19 usable"):
        simulate_groups(SchedulerConfig(num_blocks=20, block_size=32), closed_loop(1, Lengths(400, 4), 1), WINDOW)


def test_the_plain_simulator_refuses_a_pool_of_several_groups():
    """A config that carries hybrid groups (`SchedulerConfig.kv_groups`) given to the one-group simulator would count
    one group's blocks a request: refused; `simulate_groups` runs it."""
    from dataclasses import replace

    from kvplan.plan.simulate import simulate

    config = replace(POOL, kv_groups=WINDOW)
    with pytest.raises(ValueError, match="simulate_groups"):
        simulate(config, closed_loop(1, Lengths(40, 24), 1))
    assert simulate_groups(config, closed_loop(1, Lengths(40, 24), 1), WINDOW).requests[0].output_tokens == 24
