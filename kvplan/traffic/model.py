"""Real traffic as data: sessions of turns whose prompts are made of segments. Pure: no I/O.

A **segment** is a run of tokens with an identity: two segments with the same ``key`` hold the
same tokens (a tenant's system prompt, a tool set, one earlier message of a conversation), and
segments with different keys never share a token sequence. A **turn** is one request: its
prompt is the segments in order (a prefix shared by a group of sessions, the session's history
so far, the new message), plus how many tokens it generates. A **session** is the turns of one
conversation or agent run, in order. When a turn arrives is said one of two ways: an absolute
``arrival_s`` (a timestamped trace; every first turn of a session), or ``think_s`` after the
previous turn of its session ended (closed loop per session).

Everything downstream reads traffic through these types: the loaders (kvplan.traffic.loaders)
build them, the simulator and the working-set curve (kvplan.plan.prefix_cache) turn segments
into vLLM's block hashes, and `kvplan bench` turns them into token ids (kvplan.traffic.tokens)
so that the engine's prefix cache sees exactly the reuse the traffic describes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter

from kvplan.errors import KvplanError

#: Bounds far above any real workload: larger values are typos or hostile input.
MAX_TURN_TOKENS = 1 << 24  # 16M tokens in one prompt
MAX_TURNS = 2_000_000
MAX_SEGMENTS_PER_TURN = 100_000
MAX_SECONDS = 30 * 86400.0  # a month of trace time


@dataclass(frozen=True)
class Segment:
    """``tokens`` tokens whose content is named by ``key`` (equal keys: equal tokens)."""

    key: str
    tokens: int

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or not 0 < self.tokens <= MAX_TURN_TOKENS:
            raise KvplanError(f"segment {self.key[:60]!r}: {self.tokens!r} tokens (expected 1 to {MAX_TURN_TOKENS:,})")


_tokens_of = attrgetter("tokens")  # (a segment's tokens, read at C speed: a trace's prompts are millions of segments)


@dataclass(frozen=True)
class Turn:
    """One request of a session."""

    session: str
    turn: int  # 0-based position in its session
    segments: tuple[Segment, ...]
    output_tokens: int
    arrival_s: float | None = None  # absolute arrival (required on a session's first turn)
    think_s: float = 0.0  # else: seconds after the previous turn of the session finished

    @cached_property  # read once per request by every consumer: the working set, the simulator, the replay
    def prompt_tokens(self) -> int:
        return sum(map(_tokens_of, self.segments))

    @property
    def label(self) -> str:
        return f"session {self.session[:60]!r} turn {self.turn}"


@dataclass(frozen=True)
class Traffic:
    """Turns in the order a replay sends them when times tie (file order); checked when built."""

    turns: tuple[Turn, ...]
    source: str
    notes: tuple[str, ...] = ()
    _by_session: dict[str, tuple[Turn, ...]] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.turns:
            raise KvplanError(f"{self.source}: no requests")
        if len(self.turns) > MAX_TURNS:
            raise KvplanError(f"{self.source}: {len(self.turns):,} requests (at most {MAX_TURNS:,})")
        sessions: dict[str, list[Turn]] = {}
        for t in self.turns:
            _check_turn(t, self.source)
            seen = sessions.setdefault(t.session, [])
            if t.turn != len(seen):
                raise KvplanError(f"{self.source}: {t.label} follows turn {len(seen) - 1} of its session"
                                  if seen else f"{self.source}: {t.label} is not its session's first turn (0)",
                                  "number each session's turns 0, 1, 2... in file order")
            if t.turn == 0 and t.arrival_s is None:
                raise KvplanError(f"{self.source}: {t.label} has no arrival time", "give the first turn a timestamp")
            seen.append(t)
        object.__setattr__(self, "_by_session", {k: tuple(v) for k, v in sessions.items()})

    @property
    def sessions(self) -> dict[str, tuple[Turn, ...]]:
        return self._by_session

    @property
    def num_requests(self) -> int:
        return len(self.turns)

    @property
    def timestamped(self) -> bool:
        """Every turn has an absolute arrival (an open-loop trace, no think times)."""
        return all(t.arrival_s is not None for t in self.turns)

    def first_arrivals(self) -> Iterator[tuple[float, Turn]]:
        for turns in self._by_session.values():
            yield turns[0].arrival_s, turns[0]  # type: ignore[misc]

    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)

    def describe(self) -> str:
        n, s = len(self.turns), len(self._by_session)
        return (f"{self.source}: {n:,} requests in {s:,} sessions, {self.prompt_tokens() / n:,.0f} prompt + "
                f"{self.output_tokens() / n:,.0f} output tokens on average")


def _check_turn(t: Turn, source: str) -> None:
    def where() -> str:  # (named only when refused: a trace is a million turns)
        return f"{source}: {t.label}"

    if not t.segments:
        raise KvplanError(f"{where()}: an empty prompt")
    if len(t.segments) > MAX_SEGMENTS_PER_TURN:
        raise KvplanError(f"{where()}: {len(t.segments):,} segments (at most {MAX_SEGMENTS_PER_TURN:,})")
    if t.prompt_tokens > MAX_TURN_TOKENS:
        raise KvplanError(f"{where()}: {t.prompt_tokens:,} prompt tokens (at most {MAX_TURN_TOKENS:,})")
    if isinstance(t.output_tokens, bool) or not isinstance(t.output_tokens, int) or not 0 < t.output_tokens <= MAX_TURN_TOKENS:
        raise KvplanError(f"{where()}: {t.output_tokens!r} output tokens (expected 1 to {MAX_TURN_TOKENS:,})")
    for name, value in (("arrival", t.arrival_s), ("think time", t.think_s)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_SECONDS:
            raise KvplanError(f"{where()}: {name} {value!r} s (expected 0 to {MAX_SECONDS:,.0f} s)")
