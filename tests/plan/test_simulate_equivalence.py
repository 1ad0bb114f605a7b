"""The simulator's fast paths against the plain ones they stand for (issue 23): the flat-list block pool
against a plain copy (tests/helpers/reference_block_pool.py), operation for operation; steady decode steps run at once
against the same steps run one by one (a block-pool trace turns the fast path off); the run-memoized
block hasher against a block-at-a-time one. Every result must be identical, floats to the bit."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from helpers.reference_block_pool import ReferenceBlockPool

from kvplan.plan import simulate as sim
from kvplan.plan.block_pool import BlockPool, LinkedBlockPool
from kvplan.plan.prefix_cache import BlockHasher, traffic_load
from kvplan.plan.simulate import Lengths, SchedulerConfig, SimTurn, closed_loop, open_loop, poisson_arrivals, session_load
from kvplan.plan.steplog import decode_batch
from kvplan.traffic.loaders import agent_traffic
from kvplan.traffic.model import Segment, Traffic, Turn

# --------------------------------------------------------------------------- the pool


def _pools_agree(ref: ReferenceBlockPool, flat: BlockPool | LinkedBlockPool, keys: range) -> None:
    assert flat.free_queue() == ref.free_queue()
    assert flat.num_free == ref.num_free
    assert flat.ref == ref.ref
    assert [flat.cached(k) for k in keys] == [ref.cached(k) for k in keys]


@pytest.mark.parametrize("pool_class", [BlockPool, LinkedBlockPool])
@pytest.mark.parametrize("caching,uncached_first", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("seed", range(6))
def test_the_fast_pools_are_block_pool_block_for_block(seed, caching, uncached_first, pool_class):
    """Random requests take blocks, register some under a few shared hashes (so hashes get a second block
    and lose it again), hit cached ones (held or free) and release; after every operation both pools
    have the same free queue, references and lookups. (The linked pool takes and returns its Block
    objects: the operations name them by id here.)"""
    rng = random.Random(seed)
    usable = rng.choice([5, 12, 40])
    keys = range(rng.choice([3, 8, 30]))
    ref, fast = ReferenceBlockPool(usable, caching, uncached_first), pool_class(usable, caching, uncached_first)
    flat = _ById(fast) if pool_class is LinkedBlockPool else fast
    held: list[list[int]] = []  # each request's blocks, in table order
    for _ in range(400):
        op = rng.random()
        if op < 0.35 and ref.num_free:
            n = rng.randint(1, ref.num_free)
            taken = [ref.take() for _ in range(n)]
            assert flat.take(n) == taken
            held.append(taken)
        else:
            _cache_hit_or_release(rng, op, ref, flat, held, keys, cache_below=0.6, hit_below=0.8)
        _pools_agree(ref, flat, keys)
    for blocks in held:
        ref.release(blocks)
        flat.release(blocks)
    _pools_agree(ref, flat, keys)
    assert flat.num_free == usable


@pytest.mark.parametrize("caching,uncached_first", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("seed", range(8))
def test_take_cached_is_take_then_cache(seed, caching, uncached_first):
    """`LinkedBlockPool.take_cached` (admission's new blocks, the full ones registered as they are taken) against
    the reference pool's takes then registrations: after every operation the same free queue, references and
    lookups. Keys come from a handful, so a take often registers a hash that a block later in the same take still
    holds (it loses it when taken), or that a held block holds (a second block for the hash)."""
    rng = random.Random(f"take_cached:{seed}")
    usable = rng.choice([6, 16, 40])
    keys = range(rng.choice([3, 6, 20]))
    ref, pool = ReferenceBlockPool(usable, caching, uncached_first), LinkedBlockPool(usable, caching, uncached_first)
    flat = _ById(pool)
    held: list[list[int]] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.4 and ref.num_free:
            n = rng.randint(1, ref.num_free)
            names = [rng.choice(keys) for _ in range(rng.randint(0, n))]
            taken = [ref.take() for _ in range(n)]
            for b, k in zip(taken, names):
                ref.cache(b, k)
            assert [b.id for b in pool.take_cached(n, names)] == taken
            held.append(taken)
        else:
            _cache_hit_or_release(rng, op, ref, flat, held, keys, cache_below=0.55, hit_below=0.75)
        _pools_agree(ref, flat, keys)
        assert pool.key_of == [None, *(ref.key_of.get(b) for b in range(1, usable + 1))]
        # a hash several blocks hold: its blocks, first registered first
        assert {k: [b.id for b in v] for k, v in pool.dups.items()} == {
            k: list(v) for k, v in ref.blocks_of.items() if len(v) > 1}


@pytest.mark.parametrize("uncached_first", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_private_runs_are_blocks_under_hashes_no_one_asks_for(seed, uncached_first):
    """`LinkedBlockPool`'s PRIVATE blocks (`take_cached`'s ``own``, blocks that fill later, freed as one run, their
    own fields not kept) against the reference pool with each such block cached under a hash of its own that no
    lookup asks for. Requests as the simulator makes them: hits, new blocks under shared hashes, its own
    blocks, an uncached tail that grows and whose first blocks fill and become its own; freed in table order. After
    every operation: the same free queue and lookups, and the same references for every block that is not PRIVATE
    (a PRIVATE block's own fields are not kept)."""
    rng = random.Random(f"private:{seed}")
    usable = rng.choice([12, 30, 60])
    shared = range(rng.choice([4, 10]))
    ref, pool = ReferenceBlockPool(usable, True, uncached_first), LinkedBlockPool(usable, True, uncached_first)
    held: list[list] = []  # [blocks (Block objects), first own, end of own] per request
    private_free: set[int] = set()  # ids of free blocks in a PRIVATE run
    unique = iter(range(10**9))

    def agree() -> None:
        assert pool.free_queue() == ref.free_queue()
        assert pool.num_free == ref.num_free
        assert [pool.cached(k) for k in shared] == [ref.cached(k) for k in shared]
        own = {b.id for blocks, start, stop in held for b in blocks[start:stop]} | private_free
        assert [r for b, r in enumerate(pool.ref) if b not in own] == [r for b, r in enumerate(ref.ref) if b not in own]

    for _ in range(300):
        op = rng.random()
        if op < 0.4 and ref.num_free:
            hits = pool.longest_hit(rng.sample(shared, rng.randint(1, len(shared))))
            if len({b.id for b in hits}) < len(hits):  # (a hash several blocks hold found twice: not a prompt)
                continue
            assert [b.id for b in hits] == ref.longest_hit([b.key for b in hits])
            pool.touch(hits)
            for b in hits:
                ref.touch(b.id)
            if pool.num_free < 1:
                held.append([hits, len(hits), len(hits)])
                agree()
                continue
            count = rng.randint(1, pool.num_free)
            names = [rng.choice(shared) for _ in range(rng.randint(0, count))]
            own = rng.randint(0, count - len(names))
            new = pool.take_cached(count, names, own)
            taken = [ref.take() for _ in range(count)]
            assert [b.id for b in new] == taken
            for b, k in zip(taken, [*names, *[("own", next(unique)) for _ in range(own)]]):
                ref.cache(b, k)
            private_free -= set(taken)
            start = len(hits) + len(names)
            held.append([hits + new, start, start + own])
        elif op < 0.6 and held and ref.num_free:  # a running request's new blocks; some of its first uncached fill
            req = rng.choice(held)
            new = pool.take(rng.randint(1, ref.num_free))
            assert [b.id for b in new] == [ref.take() for _ in new]
            private_free -= {b.id for b in new}
            req[0] += new
            blocks, start, stop = req
            fill = rng.randint(0, len(blocks) - stop)
            for b in blocks[stop:stop + fill]:
                ref.cache(b.id, ("own", next(unique)))
            req[2] += fill
        elif held:
            blocks, start, stop = held.pop(rng.randrange(len(held)))
            ids = [b.id for b in blocks]
            own_ids = set(ids[start:stop])
            pool.release(blocks, (start, stop) if stop > start else None)
            ref.release(ids)
            private_free |= own_ids
        agree()
    for blocks, start, stop in held:
        pool.release(blocks, (start, stop) if stop > start else None)
    assert pool.num_free == usable


def _cache_hit_or_release(rng, op, ref, flat, held, keys, *, cache_below: float, hit_below: float) -> None:
    """The random walks' other operations, on both pools: register some held blocks under a few shared hashes, hit
    cached ones (held or free), or release a request's blocks."""
    if op < cache_below and held:
        blocks = rng.choice(held)
        picked = rng.sample(blocks, rng.randint(1, len(blocks)))
        names = [rng.choice(keys) for _ in picked]
        for b, k in zip(picked, names):
            ref.cache(b, k)
        flat.cache(picked, names)
    elif op < hit_below:
        hits = list(dict.fromkeys(ref.longest_hit(rng.sample(keys, rng.randint(1, len(keys))))))  # (touched once)
        for b in hits:
            ref.touch(b)
        flat.touch(hits)
        if hits:
            held.append(hits)
    elif held:
        blocks = held.pop(rng.randrange(len(held)))
        ref.release(blocks)
        flat.release(blocks)


class _ById:
    """A LinkedBlockPool operated by block ids (its Block objects looked up by id, ids returned)."""

    def __init__(self, pool: LinkedBlockPool):
        self.pool = pool

    def __getattr__(self, name):
        return getattr(self.pool, name)

    def take(self, count: int) -> list[int]:
        return [b.id for b in self.pool.take(count)]

    def touch(self, blocks) -> None:
        self.pool.touch([self.pool.blocks[b] for b in blocks])

    def release(self, blocks) -> None:
        self.pool.release([self.pool.blocks[b] for b in blocks])

    def cache(self, blocks, keys) -> None:
        self.pool.cache([self.pool.blocks[b] for b in blocks], keys)


def _pool_state(pool: BlockPool | LinkedBlockPool) -> tuple:
    """Free queue, hashes and lookups (the blocks of each hash several hold) by block id."""
    def ids(blocks):
        return [getattr(b, "id", b) for b in blocks]

    return (pool.free_queue(), pool.key_of, {k: pool.cached(k) for k in pool.first},
            {k: ids(v) for k, v in pool.dups.items()})


# --------------------------------------------------------------------------- steady decode steps


def _step_time(kind: str):
    """A step time and the batches it was called with: times from every StepBatch field (and, for
    "count", from the number of calls), so the calls must come with the same batches in the same order."""
    calls: list[sim.StepBatch] = []

    def f(b: sim.StepBatch) -> float:
        calls.append(b)
        if kind == "count":
            return 0.004 + (len(calls) % 7) * 1e-4 + math.sqrt(b.kv_tokens_read + 1) * 1e-6
        return (0.003 + 1.7e-6 * b.prefill_tokens + 3.1e-5 * b.decode_seqs + 2.3e-9 * b.kv_tokens_read
                + 1.3e-5 * b.num_seqs + 7.7e-12 * b.attention_pairs)

    return (None if kind == "none" else f), calls


def _sessions(seed: int) -> Traffic:
    """Prompts of shared hash blocks (some shorter copies), arriving in bursts."""
    rng = random.Random(seed)
    prefixes = [[f"p{i}b{k}" for k in range(rng.randrange(1, 5))] for i in range(4)]
    rows, t = [], 0.0
    for i in range(150):
        keys = list(rng.choice(prefixes)) + [f"r{i}b{k}" for k in range(rng.randrange(0, 3))]
        segs = [Segment(k, 64) for k in keys[:-1]] + [Segment(keys[-1], rng.randrange(1, 65))]
        t += rng.choice([0.001, 0.05, 0.5])
        rows.append(Turn(f"r{i}", 0, tuple(segs), rng.randrange(1, 80), arrival_s=t))
    return Traffic(tuple(rows), "sessions")


LOADS = {
    # name: (config, load builder, step time)
    "open-roomy": (dict(num_blocks=4000, block_size=16),
                   lambda: open_loop(poisson_arrivals(0.05, 200, 1), Lengths(300, 150, "lognormal", 0.6, 7),
                                     shared_prefix_tokens=64), "linear"),
    "open-preempting": (dict(num_blocks=300, block_size=16, max_num_batched_tokens=1024),
                        lambda: open_loop(poisson_arrivals(0.5, 200, 2), Lengths(300, 150, "lognormal", 0.6, 7),
                                          shared_prefix_tokens=64), "count"),
    "closed-waiting-for-kv": (dict(num_blocks=90, block_size=8, max_num_seqs=256),
                              lambda: closed_loop(40, Lengths(200, 120, "uniform", 0.5, 3), 4, shared_prefix=0.3), "linear"),
    "closed-max-num-seqs": (dict(num_blocks=2000, block_size=16, max_num_seqs=6),
                            lambda: closed_loop(20, Lengths(64, 90, "normal", 0.4, 1), 3, think_time=0.02,
                                                client_delay=lambda n: (n % 5) * 0.003), "count"),
    "closed-old-rules": (dict(num_blocks=300, block_size=16, admit_full_prompt=False, uncached_blocks_first=False,
                              prefix_stats_at_admission=False, max_num_batched_tokens=512),
                         lambda: closed_loop(48, Lengths(256, 128, "lognormal", 0.4), 3, shared_prefix=0.5), "linear"),
    "closed-no-caching": (dict(num_blocks=300, block_size=16, prefix_caching=False, max_model_len=1200),
                          lambda: closed_loop(48, Lengths(256, 128, "lognormal", 0.4), 3, shared_prefix=0.5), "none"),
    "closed-budget-of-seqs": (dict(num_blocks=400, block_size=16, max_num_batched_tokens=30),
                              lambda: closed_loop(40, Lengths(20, 80), 2), "linear"),
    "sessions-evicting": (dict(num_blocks=40, block_size=16, max_num_seqs=8),
                          lambda: traffic_load(_sessions(1), 16), "count"),
    "sessions-chunked": (dict(num_blocks=30, block_size=32, max_num_batched_tokens=96, max_num_seqs=4),
                         lambda: traffic_load(_sessions(2), 32), "linear"),
    "agent-think-times": (dict(num_blocks=2000, block_size=16),
                          lambda: traffic_load(agent_traffic(30, 5, 2, 512, 64, 80, think_s=0.5, session_rate_per_s=2.0,
                                                             seed=3, think_distribution="exponential",
                                                             arrival_distribution="poisson"), 16), "linear"),
}


@pytest.mark.parametrize("name", list(LOADS))
def test_steady_steps_at_once_are_the_steps_one_by_one(name, monkeypatch):
    cfg, build, kind = LOADS[name]
    config = SchedulerConfig(**cfg)
    fast_time, fast_calls = _step_time(kind)
    fast_steps = []
    original = sim._Scheduler._decode_steps

    def counted(self, max_steps):
        fast_steps.append(original(self, max_steps))
        return fast_steps[-1]

    monkeypatch.setattr(sim._Scheduler, "_decode_steps", counted)
    fast = sim.simulate(config, build(), fast_time)
    plain_time, plain_calls = _step_time(kind)
    trace: list[tuple] = []
    plain = sim.simulate(config, build(), plain_time, trace=trace)  # a trace takes every step one by one
    assert sum(fast_steps) > 0  # the fast path ran (most steps, in most of these loads)
    assert fast_calls == plain_calls
    for f in dataclasses.fields(fast):
        assert getattr(fast, f.name) == getattr(plain, f.name), f.name
    # floats to the bit (== would take -0.0 for 0.0)
    assert [t.hex() for r in fast.requests for t in r.token_times] == [t.hex() for r in plain.requests for t in r.token_times]
    assert [(s, t.hex(), u.hex()) for s, t, u in fast.kv_fill] == [(s, t.hex(), u.hex()) for s, t, u in plain.kv_fill]


def test_arrivals_and_ends_inside_a_decode_run_are_the_steps_one_by_one(monkeypatch):
    """A request that arrives during a decode run is admitted in the run, beside the decoding requests
    (`_Scheduler._admit_in_run`), and the run goes on with it decoding, or ends with that step (a chunked prompt, a
    one-token output, a request still waiting, no room left); a request that samples its last token ends there and
    the run goes on without it (`_sync_decoded`, then `_finish`). Across the loads above, every result equals the
    steps one by one (`test_steady_steps_at_once_are_the_steps_one_by_one`); here: such admissions and ends happened
    in each of these loads (closed loops too: a request's successor arrives as it ends, and the run admits it in the
    next step), and both outcomes of an admission happened."""
    outcomes: list[bool] = []
    ends: list[int] = []
    original, original_sync = sim._Scheduler._admit_in_run, sim._Scheduler._sync_decoded

    def counted(self, num, kv, step, now):
        result = original(self, num, kv, step, now)
        outcomes.append(result[3])
        return result

    def synced(self, req, step, synced, step_ends):
        ends.append(step)
        return original_sync(self, req, step, synced, step_ends)

    monkeypatch.setattr(sim._Scheduler, "_admit_in_run", counted)
    monkeypatch.setattr(sim._Scheduler, "_sync_decoded", synced)
    folded = {}
    for name in ("open-roomy", "open-preempting", "closed-waiting-for-kv", "closed-max-num-seqs", "closed-no-caching",
                 "sessions-evicting", "sessions-chunked", "agent-think-times"):
        cfg, build, kind = LOADS[name]
        before, ends_before = len(outcomes), len(ends)
        fast = sim.simulate(SchedulerConfig(**cfg), build(), _step_time(kind)[0])
        folded[name] = len(outcomes) - before
        assert len(ends) > ends_before, name
        plain = sim.simulate(SchedulerConfig(**cfg), build(), _step_time(kind)[0], trace=[])  # (one by one: no runs)
        assert len(outcomes) - before == folded[name]
        for f in dataclasses.fields(fast):
            assert getattr(fast, f.name) == getattr(plain, f.name), (name, f.name)
    assert all(folded.values()), folded
    assert True in outcomes and False in outcomes


def test_a_request_arriving_while_decodes_spend_the_budget_waits_for_it_in_both_paths(monkeypatch):
    """30 one-token prompts at 0 and a 31st at 10.5, a budget of 30 tokens and steps of 1: step 0 admits the 30
    (30 tokens), which then decode one token each, the whole budget, for 80 steps; the 31st is seen at the start of
    step 11 (time 11) and cannot be tried (vLLM's ``while token_budget > 0``, scheduler.py@0.32.0): its first wait
    for the budget, with no wait for KV (31 x 6 blocks of 16 fit the 400). The steady steps run at once record it
    as the steps one by one do."""
    config = SchedulerConfig(num_blocks=400, block_size=16, max_num_batched_tokens=30)
    build = lambda: open_loop([0.0] * 30 + [10.5], Lengths(1, 80))  # noqa: E731
    fast_steps: list[int] = []
    original = sim._Scheduler._decode_steps

    def counted(self, max_steps):
        fast_steps.append(original(self, max_steps))
        return fast_steps[-1]

    with monkeypatch.context() as m:
        m.setattr(sim._Scheduler, "_decode_steps", counted)
        fast = sim.simulate(config, build())
    trace: list[tuple] = []
    plain = sim.simulate(config, build(), trace=trace)
    assert fast_steps[1] > 0  # the steps from 1 ran at once (the arrival at step 11 among them)
    for res in (fast, plain):
        assert (res.first_budget_wait_step, res.first_budget_wait_time) == (11, 11.0)
        assert not res.waited_for_kv and not res.preempted
    assert ("budget", 30) in trace  # the 31st request (number 30) waited at the head of the queue


def _random_case(seed: int):
    """A small pool (evicting, often preempting), random limits and rules, and one of three random loads:
    sessions of shared prefixes arriving in bursts, an open loop of drawn lengths, or a closed loop."""
    rng = random.Random(f"case:{seed}")
    B = rng.choice([1, 4, 8, 16])
    kind = rng.choice(["sessions", "open", "closed"])
    if kind == "sessions":
        prefixes = [[f"p{i}b{k}" for k in range(rng.randrange(1, 4))] for i in range(rng.randint(1, 4))]
        rows, t = [], 0.0
        for i in range(rng.randint(20, 80)):
            keys = list(rng.choice(prefixes)) + [f"r{i}b{k}" for k in range(rng.randrange(0, 3))]
            segs = [Segment(k, rng.choice([B, 2 * B, 3 * B + 1])) for k in keys[:-1]] + [Segment(keys[-1], rng.randint(1, 3 * B))]
            t += rng.choice([0.0, 0.001, 0.02, 0.3])
            rows.append(Turn(f"r{i}", 0, tuple(segs), rng.randint(1, 8 * B), arrival_s=t))
        traffic = Traffic(tuple(rows), "random sessions")
        need = max(-(-(r.prompt_tokens + r.output_tokens - 1) // B) for r in rows)
        build = lambda: traffic_load(traffic, B)  # noqa: E731
    else:
        mean_p, mean_o = rng.randint(2, 6 * B), rng.randint(2, 10 * B)
        lengths = Lengths(mean_p, mean_o, rng.choice(["fixed", "uniform", "lognormal"]), 0.5, seed)
        n = rng.randint(10, 60)
        shared, think = rng.choice([0, B, 3 * B]), rng.choice([0.0, 0.01])
        if kind == "open":
            arrivals = poisson_arrivals(rng.choice([0.05, 0.3, 2.0]), n, seed)
            build = lambda: open_loop(arrivals, lengths, shared_prefix_tokens=shared)  # noqa: E731
            numbers = range(n)
        else:
            streams = rng.randint(1, 12)
            per = rng.randint(1, 4)
            build = lambda: closed_loop(streams, lengths, per, shared_prefix_tokens=shared,  # noqa: E731
                                        think_time=think)
            numbers = range(streams * per)
        need = max(-(-(sum(lengths(i)) - 1) // B) for i in numbers)
    config = SchedulerConfig(
        num_blocks=need + 1 + rng.randint(0, 2 * need), block_size=B,
        max_num_seqs=rng.choice([2, 4, 256]), max_num_batched_tokens=rng.choice([max(8, 2 * B), 64, 1 << 20]),
        admit_full_prompt=rng.random() < 0.7, prefix_caching=rng.random() < 0.85,
        uncached_blocks_first=rng.random() < 0.7, prefix_stats_at_admission=rng.random() < 0.7)
    return config, build, rng.choice(["none", "linear", "count"])


def _fast_and_one_by_one(seed: int, monkeypatch) -> tuple[bool, bool, bool]:
    """Random case ``seed`` run the fast way and one step at a time (a trace turns the fast path off): every
    result identical, floats to the bit. Returns whether it evicted a cached block, preempted, and ran
    steady steps at once."""
    config, build, kind = _random_case(seed)
    fast_steps: list[int] = []
    original = sim._Scheduler._decode_steps

    def counted(self, max_steps):
        fast_steps.append(original(self, max_steps))
        return fast_steps[-1]

    evicted: list[int] = []
    take, take_cached = LinkedBlockPool.take, LinkedBlockPool.take_cached

    def counting_take(self, count=1):
        evicted.append(sum(self.key_of[b] is not None for b in self.free_queue()[:count]))
        return take(self, count)

    def counting_take_cached(self, count, keys, own=0):
        if (keys or own) and self.caching:  # (else it calls `take`, counted there)
            evicted.append(sum(self.key_of[b] is not None for b in self.free_queue()[:count]))
        return take_cached(self, count, keys, own)

    pools: list[tuple] = []  # each run's pool at its end (before `simulate` unlinks it), block for block
    unlink = LinkedBlockPool.unlink

    def kept_unlink(self):
        pools.append(_pool_state(self))
        unlink(self)

    monkeypatch.setattr(LinkedBlockPool, "unlink", kept_unlink)
    fast_time, fast_calls = _step_time(kind)
    with monkeypatch.context() as m:
        m.setattr(sim._Scheduler, "_decode_steps", counted)
        fast = sim.simulate(config, build(), fast_time)
    plain_time, plain_calls = _step_time(kind)
    with monkeypatch.context() as m:
        m.setattr(LinkedBlockPool, "take", counting_take)
        m.setattr(LinkedBlockPool, "take_cached", counting_take_cached)
        plain = sim.simulate(config, build(), plain_time, trace=[])
    assert fast_calls == plain_calls
    a, b = pools
    assert a == b
    for f in dataclasses.fields(fast):
        assert getattr(fast, f.name) == getattr(plain, f.name), f.name
    assert [t.hex() for r in fast.requests for t in r.token_times] == [t.hex() for r in plain.requests for t in r.token_times]
    assert [(s, t.hex(), u.hex()) for s, t, u in fast.kv_fill] == [(s, t.hex(), u.hex()) for s, t, u in plain.kv_fill]
    return sum(evicted) > 0, plain.preemptions > 0, sum(fast_steps) > 0


@pytest.mark.parametrize("seed", range(60))
def test_random_small_pools_fast_is_one_by_one(seed, monkeypatch):
    """Random workloads on pools small enough to evict and preempt: the fast path (steady steps at once, their
    new blocks in one take) gives what the steps one by one give."""
    _fast_and_one_by_one(seed, monkeypatch)


def test_random_small_pools_cover_eviction_preemption_and_steady_steps(monkeypatch):
    """The random cases are not all easy ones: many evict cached blocks, many preempt, most run steady steps
    at once (counts over the 60 seeds)."""
    covered = [_fast_and_one_by_one(seed, monkeypatch) for seed in range(60)]
    evicting, preempting, steady = (sum(c[i] for c in covered) for i in range(3))
    print(f"evicting {evicting}, preempting {preempting}, steady {steady} of 60")
    assert evicting >= 15 and preempting >= 10 and steady >= 40, (evicting, preempting, steady)


# --------------------------------------------------------------------------- the hasher


class _BlockAtATime:
    """BlockHasher as it was: one (parent, spans) -> id lookup per block."""

    def __init__(self, block_size: int):
        self.block_size, self.ids = block_size, {}

    def prompt_keys(self, segments) -> tuple[int, ...]:
        B, out, parent, spans, filled = self.block_size, [], 0, [], 0
        for seg in segments:
            at = 0
            while at < seg.tokens:
                take = min(B - filled, seg.tokens - at)
                spans.append((seg.key, at, at + take))
                at += take
                filled += take
                if filled == B:
                    parent = self.ids.setdefault((parent, tuple(spans)), len(self.ids) + 1)
                    out.append(parent)
                    spans, filled = [], 0
        return tuple(out)


@pytest.mark.parametrize("seed", range(40))
def test_block_hasher_ids_are_the_block_at_a_time_ids(seed):
    """The same ids, values included (shorter and longer copies of segments, at every offset)."""
    rng = random.Random(seed)
    B = rng.choice([1, 2, 3, 4, 7, 16])
    names = [f"k{i}" for i in range(rng.randint(1, 6))]
    fast, slow = BlockHasher(B), _BlockAtATime(B)
    for _ in range(60):
        segments = [Segment(rng.choice(names), rng.randint(1, 5 * B)) for _ in range(rng.randint(1, 7))]
        assert fast.prompt_keys(segments) == slow.prompt_keys(segments)
        assert len(fast) == len(slow.ids)


def test_hash_ids_beyond_the_prompt_blocks():
    """Hash ids are whatever a SimTurn carries. Request 0's 20-token prompt has one full block but four ids:
    its decode fills blocks 1-3 under ids 2-4, which request 2 (arriving at step 1, waiting for KV: it needs
    5 blocks, 1 of them a hit, and 3 are free) looks up. In step 12 block 1 fills, the hit grows to 2
    blocks and request 2 is admitted: steady steps must not run past that step."""
    turns = [SimTurn(0, 20, 60, keys=(1, 2, 3, 4), arrival=0.0), SimTurn(1, 1, 15, arrival=0.0),
             SimTurn(2, 65, 1, keys=(1, 2, 3, 4), arrival=1.0)]
    config = SchedulerConfig(num_blocks=7, block_size=16)
    fast = sim.simulate(config, session_load(turns))
    assert fast.requests[2].admitted_step == 12 and fast.requests[2].waited_for_kv
    assert fast == sim.simulate(config, session_load(turns), trace=[])


def test_a_decode_batch_is_the_step_batch():
    """Steady steps make their batches without StepBatch's __init__: the same fields, equality, hash and repr."""
    for num, kv in [(1, 17), (256, 10**9), (3, 0)]:
        fast, plain = decode_batch(num, kv), sim.StepBatch(0, num, kv, num, kv)
        assert type(fast) is sim.StepBatch
        assert fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
        assert dataclasses.asdict(fast) == dataclasses.asdict(plain)
        assert [type(getattr(fast, f.name)) for f in dataclasses.fields(fast)] == [int] * 5


def test_a_simulation_leaves_no_cycles_behind():
    """The linked pool's blocks form a ring of reference cycles; `simulate` breaks it, so a simulation's
    pool is freed when it returns, not by a later full collection (which finds nothing left)."""
    import gc

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        sim.simulate(SchedulerConfig(num_blocks=50, block_size=4), closed_loop(3, Lengths(10, 10), 2))
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("seed", range(20))
def test_keys_of_a_range_are_each_blocks_key(seed):
    """`_keys` (hash ids, then the shared prefix's and the request's own blocks, inline) is `_key` block by block."""
    rng = random.Random(seed)
    B = rng.choice([1, 4, 16])
    prompt = rng.randint(1, 10 * B)
    keys = tuple(range(100, 100 + rng.randint(0, prompt // B + 2)))
    tl = sim.RequestTimeline(0, prompt, 5 * B, rng.randint(0, prompt), 0.0)
    req = sim._Req(tl, 7, 0, 0, keys)
    for _ in range(30):
        start = rng.randint(0, 12)
        stop = rng.randint(start, 16)
        assert list(sim._keys(req, start, stop, B)) == [sim._key(req, k, B) for k in range(start, stop)]


# --------------------------------------------------------------------------- blocks no other request asks for


@pytest.mark.parametrize("seed", range(20))
def test_shared_count_is_the_ids_another_prompt_has(seed):
    """`BlockHasher.shared_count`: a prompt's leading ids that some other prompt also got, counted by brute force
    over every prompt; every id after them is the prompt's alone."""
    rng = random.Random(f"shared:{seed}")
    B = rng.choice([1, 2, 4, 16])
    names = [f"k{i}" for i in range(rng.randint(1, 8))]
    hasher = BlockHasher(B)
    prompts = [hasher.prompt_keys([Segment(rng.choice(names), rng.randint(1, 5 * B)) for _ in range(rng.randint(1, 6))])
               for _ in range(50)]
    holders: dict[int, int] = {}  # id -> how many prompts have it
    for keys in prompts:
        for k in set(keys):
            holders[k] = holders.get(k, 0) + 1
    for keys in prompts:
        alone = [holders[k] == 1 for k in keys]
        n = hasher.shared_count(keys)
        assert not any(alone[:n]) and all(alone[n:]), (keys, n)


def _readmitted_hits_own_blocks(load, trace) -> int:
    """Admissions of a preempted request that hit blocks of its own (past its turn's shared ids)."""
    preempted, count = set(), 0
    for op in trace:
        if op[0] == "preempt":
            preempted.add(op[1])
        elif op[0] == "admit" and op[1] in preempted and len(op[3]) > load.turns[op[1]].shared_keys:
            count += 1
    return count


def test_private_blocks_change_nothing():
    """Blocks under hashes no other request has stay out of the prefix-cache map (`LinkedBlockPool.PRIVATE`):
    every result, and every block of every table and hit (the trace), is what the same loads give with every
    hash in the map (``shared_keys`` None). Random session loads on small pools: many preempt, and requests
    readmitted after a preemption hit their own blocks (promoted into the map when preempted)."""
    own_hits = cases = 0
    for seed in range(200):
        config, build, _ = _random_case(seed)
        load = build()
        if not load.turns:
            continue
        cases += 1
        everything = session_load([dataclasses.replace(t, shared_keys=None) for t in load.turns])
        assert any(t.shared_keys < len(t.keys) for t in load.turns)
        trace_private: list[tuple] = []
        trace_all: list[tuple] = []
        assert sim.simulate(config, load) == sim.simulate(config, everything)
        assert sim.simulate(config, load, trace=trace_private) == sim.simulate(config, everything, trace=trace_all)
        assert trace_private == trace_all
        own_hits += _readmitted_hits_own_blocks(load, trace_private)
    assert cases >= 40 and own_hits >= 50, (cases, own_hits)
