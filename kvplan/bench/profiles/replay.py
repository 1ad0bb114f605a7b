"""``replay`` (``--traffic FILE``): each point replays the first N sessions of the traffic (N = each
``--sessions`` level, or all of them), turns at their timestamps or think times (kvplan.bench.replay)."""

from __future__ import annotations

from kvplan.bench.config import BenchConfig
from kvplan.bench.loads import ReplayLoad
from kvplan.bench.profiles.base import Profile, ProfileContext, ProfileResult, measure_levels, profile


@profile("replay")
class ReplayProfile(Profile):
    precedence = 10
    load_mode = "concurrency"

    @classmethod
    def chosen(cls, cfg: BenchConfig) -> bool:
        return cfg.traffic is not None

    def describe(self, ctx: ProfileContext) -> str:
        cfg = ctx.cfg
        assert cfg.traffic is not None and ctx.traffic is not None
        scale = f", times x {cfg.traffic.time_scale:g}" if cfg.traffic.time_scale != 1 else ""
        return (f"replay of {ctx.traffic.source}: each point the first N sessions (the load level), each turn at "
                f"its timestamp or its think time after the previous turn of its session ended{scale}; prompts are "
                "token ids built from the turns' segments (identical segments, identical ids; new ids each point)"
                + ("; one unrecorded warm-up round before the first point" if cfg.warmup else ""))

    def run(self, ctx: ProfileContext) -> ProfileResult:
        assert ctx.traffic is not None and ctx.cfg.traffic is not None
        levels = ctx.cfg.traffic.sessions or [len(ctx.traffic.sessions)]
        return measure_levels(ctx, levels, lambda n: ctx.measure(ReplayLoad(n)).outcome())
