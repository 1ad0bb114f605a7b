"""``rate-search`` (``--sweep-rate auto``): open loop, the highest request rate meeting the SLOs, found by doubling
or halving to a bracket and then bisecting (kvplan.bench.sweep.search_rate)."""

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
from kvplan.bench.sweep import search_rate


@profile("rate-search")
class RateSearchProfile(Profile):
    precedence = 20
    load_mode = "rate"

    @classmethod
    def chosen(cls, cfg: BenchConfig) -> bool:
        return cfg.rate_search is not None

    def describe(self, ctx: ProfileContext) -> str:
        cfg = ctx.cfg
        rs = cfg.rate_search
        assert rs is not None
        return (f"{open_loop_text(cfg)}; rates searched for the highest meeting the SLOs (from {rs.start:g} "
                f"requests/s, doubled or halved to a bracket, then bisected to {rs.resolution:.0%}, at most "
                f"{rs.max_points} points); {point_size_text(cfg)}{warm_up_text(cfg)}")

    def run(self, ctx: ProfileContext) -> ProfileResult:
        rs = ctx.cfg.rate_search
        assert rs is not None
        known = {p.rate: bool(p.slo_met) for p in ctx.points
                 if p.mode == "rate" and p.rate is not None and p.status == "ok"}
        found = search_rate(lambda rate: bool(measure_rate(ctx, rate).slo_met), rs.start, rs.resolution,
                            rs.max_points, known)
        return ProfileResult(rate_search=found)
