"""A load profile decides which points a run measures, one after the other, from what the earlier ones showed
(GuideLLM's ``Profile.next_strategy``): the automatic onset search, fixed levels, fixed rates, the rate search, a
traffic replay. Each is one module of this package registered with ``@profile``; of those whose ``chosen(cfg)``
holds, the one of lowest ``precedence`` runs (kvplan.bench.profiles.profile_for). What several profiles share (the
words for a load, levels measured once each, a rate point that must not fail) is below."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

from kvplan.bench.config import DEFAULT_REQUESTS, BenchConfig, BenchFailed
from kvplan.bench.loads import Load, OpenLoad
from kvplan.bench.results import OnsetName, PointResult
from kvplan.bench.sweep import Onset, RateSearch, Sweep, first_with

if TYPE_CHECKING:
    from kvplan.bench.workload import Workload
    from kvplan.engines.base import EngineCapacity
    from kvplan.plan.blocks import BlockRule
    from kvplan.traffic.model import Traffic


class ProfileContext(Protocol):
    """What a profile may read of the run, and its one action: measure a load (BenchRun implements it)."""

    cfg: BenchConfig
    points: list[PointResult]  # finished points, resumed ones included
    rule: BlockRule | None  # the block rule on the engine's pool (None: capacity unknown)
    capacity: EngineCapacity
    workload: Workload
    traffic: Traffic | None
    run_dir: Path  # where the run's files are (named in errors)

    def measure(self, load: Load) -> PointResult: ...

    def progress(self, onsets: dict[OnsetName, Onset | None]) -> None:
        """Record the onsets found so far (run.json), before the profile goes on."""


@dataclass
class ProfileResult:
    onsets: dict[OnsetName, Onset | None] = field(
        default_factory=lambda: {"first_kv_wait": None, "first_preemption": None})
    rate_search: RateSearch | None = None


class Profile(ABC):
    name: ClassVar[str]
    precedence: ClassVar[int]  # the lowest whose chosen() holds runs (options several profiles read: --sweep)
    load_mode: ClassVar[Literal["concurrency", "rate"]]  # the summary's load_mode: the x axis of its charts

    @classmethod
    @abstractmethod
    def chosen(cls, cfg: BenchConfig) -> bool:
        """Do the run's options ask for this profile?"""

    @abstractmethod
    def run(self, ctx: ProfileContext) -> ProfileResult:
        """Measure the profile's points through ``ctx.measure``."""

    @abstractmethod
    def describe(self, ctx: ProfileContext) -> str:
        """The load, in words, for the reports ("closed loop: ...")."""


PROFILES: dict[str, type[Profile]] = {}


def profile(name: str) -> Callable[[type[Profile]], type[Profile]]:
    def register(cls: type[Profile]) -> type[Profile]:
        if name in PROFILES:
            raise ValueError(f"load profile {name!r} is registered twice")
        cls.name = name
        PROFILES[name] = cls
        return cls

    return register


def point_size_text(cfg: BenchConfig) -> str:
    """How much a point sends, in words ("100 requests per point")."""
    if cfg.requests_per_stream:
        return f"{cfg.requests_per_stream} requests per stream"
    parts = []
    if cfg.requests is not None or cfg.duration_s is None:
        parts.append(f"{cfg.requests or DEFAULT_REQUESTS} requests")
    if cfg.duration_s is not None:
        parts.append(f"{cfg.duration_s:g} s")
    return " or ".join(parts) + " per point" + (", whichever ends first" if len(parts) > 1 else "")


def warm_up_text(cfg: BenchConfig) -> str:
    return "; one unrecorded warm-up round before the first point" if cfg.warmup else "; no warm-up"


def closed_loop_text(cfg: BenchConfig) -> str:
    return ("closed loop: concurrent streams, each sending its next request when the previous one ends; "
            f"{point_size_text(cfg)}{warm_up_text(cfg)}")


def measure_levels(ctx: ProfileContext, levels: list[int], run_point) -> ProfileResult:
    """Each level once (finished points are not measured again), the onsets read off the results."""
    sweep = Sweep(run_point, max(levels), {p.concurrency: p.outcome() for p in ctx.points})
    sweep.levels(levels)
    return ProfileResult(onsets={"first_kv_wait": first_with(sweep.results, lambda o: o.waited_for_kv),
                                 "first_preemption": first_with(sweep.results, lambda o: o.preempted)})


def open_loop_text(cfg: BenchConfig) -> str:
    arrivals = "Poisson" if cfg.burstiness == 1 else f"gamma (burstiness {cfg.burstiness:g})"
    text = f"open loop: requests at a fixed rate, {arrivals} arrivals"
    if cfg.rate_max_concurrency:
        text += f", at most {cfg.rate_max_concurrency} in flight"
    return text


def measure_rate(ctx: ProfileContext, rate: float) -> PointResult:
    """One open-loop point; a failed one ends the run (a rate above a failure says nothing)."""
    point = ctx.measure(OpenLoad(rate))
    if point.status != "ok":
        ok = sum(1 for p in ctx.points if p.status == "ok")
        raise BenchFailed(f"the point at {rate:g} requests/s failed: {point.error} "
                          f"({ok} finished point{'s' if ok != 1 else ''} kept in {ctx.run_dir})")
    return point
