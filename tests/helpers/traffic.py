"""Small traffic files for the tests that replay them on vLLM's own block pool and offloading manager."""

from __future__ import annotations

import random

from kvplan.traffic.model import Segment, Traffic, Turn


def agent_traffic(sessions: int, turns: int, prefix: int, new: int, out: int) -> Traffic:
    """Agent sessions: a prefix shared by every other session, then the session's history and ``new`` tokens a turn."""
    rows = []
    for t in range(turns):
        for s in range(sessions):
            segs = [Segment(f"g{s % 2}:prefix", prefix)] if prefix else []
            for u in range(t):
                segs += [Segment(f"s{s}:u{u}", new), Segment(f"s{s}:a{u}", out)]
            segs.append(Segment(f"s{s}:u{t}", new))
            rows.append(Turn(f"s{s}", t, tuple(segs), out, arrival_s=float(s) if t == 0 else None, think_s=1.5))
    return Traffic(tuple(sorted(rows, key=lambda r: (r.turn, r.session))), "agent")


def hashed_traffic(n: int, seed: int, block: int = 64, aligned: bool = False, shared: int = 4) -> Traffic:
    """Mooncake-like: prompts of ``block``-token segments from ``shared`` prefixes; ``aligned``: whole blocks only."""
    rng = random.Random(seed)
    prefixes = [[f"p{i}b{k}" for k in range(rng.randrange(1, 5))] for i in range(shared)]
    rows = []
    for i in range(n):
        keys = list(rng.choice(prefixes)) + [f"r{i}b{k}" for k in range(rng.randrange(0, 3))]
        last = block if aligned else rng.randrange(1, block + 1)
        segs = [Segment(k, block) for k in keys[:-1]] + [Segment(keys[-1], last)]
        rows.append(Turn(f"r{i}", 0, tuple(segs), rng.randrange(1, 40), arrival_s=i * 0.7))
    return Traffic(tuple(rows), "hashed")
