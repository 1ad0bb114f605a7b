"""Load profiles, one module each (see base.py). Importing this package imports every module in it, which registers
them: a new load pattern is one new module (plus the option that asks for it). The profile with the lowest
``precedence`` whose ``chosen(cfg)`` holds is the run's (``auto`` last: it runs when nothing else is asked for)."""

import importlib
import pkgutil

from kvplan.bench.config import BenchConfig
from kvplan.bench.profiles.base import PROFILES, Profile, ProfileContext, ProfileResult

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PROFILES", "Profile", "ProfileContext", "ProfileResult", "profile_for"]


def profile_for(cfg: BenchConfig) -> Profile:
    """The profile the run's options choose."""
    return next(cls for cls in sorted(PROFILES.values(), key=lambda c: c.precedence) if cls.chosen(cfg))()
