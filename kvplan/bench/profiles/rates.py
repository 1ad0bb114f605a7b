"""``rates`` (``--rate 2,4,8``): open loop, one point per request rate; a failed point stops the run."""

from __future__ import annotations

from kvplan.bench.config import BenchConfig
from kvplan.bench.profiles.base import (
    Profile,
    ProfileContext,
    ProfileResult,
    measure_rate,
    open_loop_text,
    point_size_text,
    profile,
    warm_up_text,
)


@profile("rates")
class RatesProfile(Profile):
    precedence = 30
    load_mode = "rate"

    @classmethod
    def chosen(cls, cfg: BenchConfig) -> bool:
        return bool(cfg.rates)

    def describe(self, ctx: ProfileContext) -> str:
        cfg = ctx.cfg
        return f"{open_loop_text(cfg)}; {point_size_text(cfg)}{warm_up_text(cfg)}"

    def run(self, ctx: ProfileContext) -> ProfileResult:
        done = {p.rate for p in ctx.points if p.mode == "rate"}
        for rate in ctx.cfg.rates or []:
            if rate not in done:
                measure_rate(ctx, rate)
        return ProfileResult()
