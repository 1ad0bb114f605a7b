"""Load profiles, one module each (see base.py); importing this package registers them. The profile with the lowest
``precedence`` whose ``chosen(cfg)`` holds is the run's (``auto`` last: it runs when nothing else is asked for)."""

from kvplan.bench.config import BenchConfig
from kvplan.bench.profiles import (
    auto,  # noqa: F401 - the default
    levels,  # noqa: F401 - --sweep
    rate_search,  # noqa: F401 - --sweep-rate auto
    rates,  # noqa: F401 - --rate
    replay,  # noqa: F401 - --traffic
)
from kvplan.bench.profiles.base import PROFILES, Profile, ProfileContext, ProfileResult

__all__ = ["PROFILES", "Profile", "ProfileContext", "ProfileResult", "profile_for"]


def profile_for(cfg: BenchConfig) -> Profile:
    """The profile the run's options choose."""
    return next(cls for cls in sorted(PROFILES.values(), key=lambda c: c.precedence) if cls.chosen(cfg))()
