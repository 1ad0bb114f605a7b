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
    generated blocks (never hit: ids below 0)."""
    B = block_size
    hasher = BlockHasher(B)
    order: list[int] = []
    generated = 0
    uncached_prev = 0
    distances = []
    for turn in turns:
        keys = hasher.prompt_keys(turn.segments)
        place = {block: i for i, block in enumerate(order)}
        for block in keys[: (turn.prompt_tokens - 1) // B]:  # the last token is always computed
            if block not in place:
                break
            distances.append(place[block] + uncached_prev)
        computed = turn.prompt_tokens + turn.output_tokens - 1
        tail = max(0, computed // B - len(keys))
        mine = set(keys)
        order = [*keys, *range(generated - 1, generated - 1 - tail, -1), *(b for b in order if b not in mine)]
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


@pytest.mark.parametrize("make", [conversations, collisions])
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
