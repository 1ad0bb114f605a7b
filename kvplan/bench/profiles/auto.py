"""``auto`` (the default): closed loop, searching the first concurrency that waits for KV and the first that
preempts, from the block rule's predictions (kvplan.bench.sweep.Sweep.find), with the unloaded baseline, the top
of the range and any ``--include`` levels measured too."""

from __future__ import annotations

from kvplan.bench.config import BenchConfig
from kvplan.bench.loads import ClosedLoad
from kvplan.bench.profiles.base import Profile, ProfileContext, ProfileResult, closed_loop_text, profile
from kvplan.bench.sweep import Sweep, default_max_concurrency, fallback_guess


@profile("auto")
class AutoProfile(Profile):
    precedence = 100
    load_mode = "concurrency"

    @classmethod
    def chosen(cls, cfg: BenchConfig) -> bool:
        return True  # what runs when no other profile is asked for

    def describe(self, ctx: ProfileContext) -> str:
        return closed_loop_text(ctx.cfg)

    def run(self, ctx: ProfileContext) -> ProfileResult:
        cfg, rule = ctx.cfg, ctx.rule
        known = {p.concurrency: p.outcome() for p in ctx.points}
        top = max([cfg.max_concurrency or default_max_concurrency(rule), *cfg.include_levels])
        sweep = Sweep(lambda c: ctx.measure(ClosedLoad(c)).outcome(), top, known)
        sweep.measure(1)  # the unloaded baseline
        if rule is not None:
            wait_guess = rule.first_kv_wait or top
        else:
            w = ctx.workload
            wait_guess = fallback_guess(ctx.capacity.num_blocks, ctx.capacity.block_size, w.prompt_tokens,
                                        w.output_tokens)
        result = ProfileResult()
        wait = sweep.find(lambda o: o.waited_for_kv, wait_guess)
        result.onsets["first_kv_wait"] = wait
        ctx.progress(result.onsets)
        predicted_preempt = rule.first_preemption if rule is not None else None
        preempt_guess = predicted_preempt or wait.first or top
        result.onsets["first_preemption"] = sweep.find(lambda o: o.preempted, max(preempt_guess, wait.first or 1))
        for level in sorted({top, *cfg.include_levels}):  # the top of the range (plot), the asked load
            sweep.measure(level)
        return result
