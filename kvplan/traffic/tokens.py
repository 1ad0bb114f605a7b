"""Token ids for segments: identical segments are identical ids, different ones never collide.

A segment's ids are drawn from a generator seeded by its key (and the run's nonce, so one run's
cached blocks never serve another's), uniformly from ``TOKEN_ID_RANGE``. Two different keys draw
independent sequences: a 16-token block of one equals a block of another with probability
990^-16 (about 1e-48), so the engine's prefix cache sees the reuse the traffic describes and no
other. `kvplan bench` sends the ids to ``/v1/completions``, so no tokenizer is involved.
"""

from __future__ import annotations

import random
from functools import lru_cache

from kvplan.traffic.model import Turn

#: Token ids drawn for prompts. Below 1000 fits every vocabulary (the tiny test model has 1024)
#: and skips the low ids where small vocabularies keep their special tokens.
TOKEN_ID_RANGE = (10, 1000)


def token_ids(key: str, n: int, lo: int = TOKEN_ID_RANGE[0], hi: int = TOKEN_ID_RANGE[1]) -> list[int]:
    """``n`` ids in ``[lo, hi)`` drawn from a generator seeded by ``key``: the first ``k`` of them
    are the same for every ``n >= k``."""
    rng = random.Random(key)
    return [rng.randrange(lo, hi) for _ in range(n)]


@lru_cache(maxsize=4096)
def _segment_ids(key: str, n: int, lo: int, hi: int) -> tuple[int, ...]:
    return tuple(token_ids(f"seg:{key}", n, lo, hi))


def prompt_token_ids(turn: Turn, nonce: str = "", id_range: tuple[int, int] = TOKEN_ID_RANGE) -> list[int]:
    """The prompt of ``turn`` as token ids: its segments' ids in order."""
    lo, hi = id_range
    out: list[int] = []
    for seg in turn.segments:
        out.extend(_segment_ids(f"{nonce}:{seg.key}", seg.tokens, lo, hi))
    return out
