"""``levels`` (``--sweep 1,4,16``): closed loop at exactly the levels asked; the onsets are the first levels that
showed them."""

from __future__ import annotations

from kvplan.bench.config import BenchConfig
from kvplan.bench.loads import ClosedLoad
from kvplan.bench.profiles.base import Profile, ProfileContext, ProfileResult, closed_loop_text, measure_levels, profile


@profile("levels")
class LevelsProfile(Profile):
    precedence = 40
    load_mode = "concurrency"

    @classmethod
    def chosen(cls, cfg: BenchConfig) -> bool:
        return bool(cfg.sweep)

    def describe(self, ctx: ProfileContext) -> str:
        return closed_loop_text(ctx.cfg)

    def run(self, ctx: ProfileContext) -> ProfileResult:
        levels = list(ctx.cfg.sweep or [])
        return measure_levels(ctx, levels, lambda c: ctx.measure(ClosedLoad(c)).outcome())
