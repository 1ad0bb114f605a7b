"""The load of one point, as a tagged union: what a load profile asks the point runner for. A point's stored
record (PointResult) keeps its historical fields (``mode``, ``concurrency``, ``rate``), so runs written by older
kvplans still read; the union is the seam between profiles and the runner, not a file format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal


@dataclass(frozen=True)
class ClosedLoad:
    """``concurrency`` streams, each sending its next request when its previous one ends."""

    concurrency: int
    mode: ClassVar[Literal["concurrency"]] = "concurrency"

    def label(self) -> str:
        return f"{self.concurrency}"


@dataclass(frozen=True)
class OpenLoad:
    """Requests at ``rate`` per second (gamma gaps of the run's burstiness), however many are in flight."""

    rate: float  # requests/s
    mode: ClassVar[Literal["rate"]] = "rate"

    def label(self) -> str:
        return f"rate {self.rate:g}/s"


@dataclass(frozen=True)
class ReplayLoad:
    """The first ``sessions`` sessions of the run's traffic, each turn at its timestamp or think time."""

    sessions: int
    mode: ClassVar[Literal["concurrency"]] = "concurrency"  # stored as a closed-loop level: its sessions

    def label(self) -> str:
        return f"{self.sessions} sessions"


Load = ClosedLoad | OpenLoad | ReplayLoad
