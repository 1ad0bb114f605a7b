"""working_set's one pass (runs of blocks, stretches of last users, a growing Fenwick tree) against a
block-at-a-time reference written from the module docstring: the free queue as one list, most recent
block first, over traffics made to hit the pass's corners."""

from __future__ import annotations

import random

import pytest

from kvplan.plan.prefix_cache import BlockHasher, working_set
from kvplan.traffic.model import Segment, Turn


def reference_distances(turns: list[Turn], block_size: int) -> list[int]:
    """The reuse distance of every block a request finds cached, one block at a time: its place in the
    eviction order (blocks used more recently before it), plus one while the previous request's partial
    last block holds a slot. A finished request's blocks go first, its prompt in prompt order, then its
    generated blocks (never hit: ids below 0). A cached block the request does not hit (past its hits, or
    its last block when it ends on a block boundary) is computed again: its old copy stays in place as a
    stale block (an id below 0, never hit)."""
    B = block_size
    hasher = BlockHasher(B)
    order: list[int] = []
    generated = 0
    uncached_prev = 0
    distances = []
    for turn in turns:
        keys = hasher.prompt_keys(turn.segments)
        place = {block: i for i, block in enumerate(order)}
        hits = 0
        for block in keys[: (turn.prompt_tokens - 1) // B]:  # the last token is always computed
            if block not in place:
                break
            distances.append(place[block] + uncached_prev)
            hits += 1
        computed = turn.prompt_tokens + turn.output_tokens - 1
        tail = max(0, computed // B - len(keys))
        # A cached block the request does not hit is computed again into a new block with the same hash: the
        # old copy stays where it is (a stale copy: an id of its own, never looked up again).
        touched = set(keys[:hits])
        stale = {block for block in keys[hits:] if block in place}
        kept = []
        for b in order:
            if b in stale:
                generated -= 1
                kept.append(generated)
            elif b not in touched:
                kept.append(b)
        order = [*keys, *range(generated - 1, generated - 1 - tail, -1), *kept]
        generated -= tail
        uncached_prev = 1 if computed % B else 0
    return sorted(distances)


def conversations(rng: random.Random) -> list[Turn]:
    """Sessions mixing shared documents (at several offsets, some as shorter copies), odd-length pieces,
    histories that grow turn by turn, and outputs crossing block boundaries, interleaved."""
    shared = [(f"doc{i}", rng.randint(1, 120)) for i in range(rng.randint(1, 6))]

    def piece(s: int, name: str) -> Segment:
        if rng.random() < 0.4:
            key, n = rng.choice(shared)
            return Segment(key, rng.randint(1, n) if rng.random() < 0.3 else n)
        return Segment(f"s{s}:{name}", rng.randint(1, 50))

    queues = []
    for s in range(rng.randint(1, 8)):
        history = [Segment(f"pad{rng.randrange(2)}", rng.randint(1, 20))] if rng.random() < 0.3 else []
        turns = []
        for t in range(rng.randint(1, 5)):
            ask = [piece(s, f"u{t}:{k}") for k in range(rng.randint(1, 3))]
            out = rng.randint(1, 60)
            turns.append(Turn(f"s{s}", t, tuple(history + ask), out, arrival_s=0.0))
            history += ask + [Segment(f"s{s}:a{t}", out)]
        queues.append(turns)
    order = []
    while any(queues):
        order.append(rng.choice([q for q in queues if q]).pop(0))
    return order


def collisions(rng: random.Random) -> list[Turn]:
    """Few keys of a few tokens: a key at several lengths and twice in one prompt, prompts that are
    prefixes of others, the same prompt again."""
    lengths = {f"k{i}": rng.randint(1, 40) for i in range(rng.randint(1, 4))}
    prompts = []
    for _ in range(rng.randint(1, 8)):
        prompt = tuple(Segment(k, rng.randint(1, lengths[k]) if rng.random() < 0.4 else lengths[k])
                       for k in rng.choices(list(lengths), k=rng.randint(1, 6)))
        prompts += [prompt, prompt[: rng.randint(1, len(prompt))]]
    return [Turn(f"q{i}", 0, rng.choice(prompts), rng.randint(1, 50), arrival_s=0.0) for i in range(rng.randint(1, 40))]


def aligned(rng: random.Random) -> list[Turn]:
    """Prompts that end on block boundaries (at every block size tried) and are prefixes of earlier ones: their
    cached last block is computed again, leaving a stale copy."""
    docs = {f"d{i}": 48 * rng.randint(1, 4) for i in range(rng.randint(1, 3))}
    turns = []
    for i in range(rng.randint(2, 30)):
        key = rng.choice(list(docs))
        segs = [Segment(key, rng.choice([docs[key], 48 * rng.randint(1, docs[key] // 48)]))]
        if rng.random() < 0.3:
            segs.append(Segment(f"u{i}", rng.choice([48, rng.randint(1, 60)])))
        turns.append(Turn(f"a{i}", 0, tuple(segs), rng.randint(1, 50), arrival_s=0.0))
    return turns


@pytest.mark.parametrize("make", [conversations, collisions, aligned])
@pytest.mark.parametrize("seed", range(12))
def test_the_runs_expand_to_the_block_at_a_time_distances(make, seed):
    rng = random.Random(seed)
    turns = make(rng)
    for block_size in (1, 3, 4, 16):
        ws = working_set(turns, block_size)
        blocks = sorted(d + k for d, w in zip(ws.distances, ws.weights) for k in range(w))
        assert blocks == reference_distances(turns, block_size), block_size
        assert ws.achievable_blocks == len(blocks)
        assert ws.queried_tokens == sum(t.prompt_tokens for t in turns) and ws.requests == len(turns)
        assert list(ws.distances) == sorted(ws.distances) and min(ws.weights, default=1) >= 1
