"""A block-level simulator of vLLM V1's scheduler. Pure: no torch, no I/O.

It replays, step by step, what `v1/core/sched/scheduler.py`, `kv_cache_manager.py` and
`block_pool.py` do with KV blocks (docs/vllm-accounting.md section 9), for the workloads
`kvplan bench` sends (fixed lengths, length distributions, traces; closed-loop streams or
arrivals at a rate):

- Block 0 is the null block: ``num_blocks - 1`` are usable. Free blocks sit in one LRU
  queue; a block whose tokens are full keeps its hash (prefix caching) until it is evicted.
- Each step first schedules the RUNNING requests in order: a request asks for slots for all
  its tokens not yet computed (decode: one; a prefill: a chunk within the token budget,
  ``max_num_batched_tokens``). When a block cannot be allocated, the newest running request
  is preempted (recompute: its blocks are freed, it goes to the front of the queue), until
  the allocation fits or the request preempted itself.
- Then, only if nothing was preempted in this step, WAITING requests are admitted in order
  while fewer than ``max_num_seqs`` run and budget is left: from vLLM 0.19 the blocks of the
  request's whole prompt must be free (``scheduler_reserve_full_isl``; `rules.admit_full_prompt`),
  before that only its first chunk's. Full blocks of a prefix already cached are hits: a hit
  on a block another request holds costs nothing (a shared prefix counts once); a hit on a
  free cached block is taken off the free queue (it costs a block, saves the compute).
- A step that completes a request's prompt (or a decode step) samples one token; the last
  sampled token's KV is never written, so a request peaks at ``cdiv(P + M - 1, B)`` blocks.

Steady stretches (every running request decoding, nothing to admit) are run many steps at once, with
the results of running them one by one (`_Scheduler._decode_steps`).

Time: every step takes ``step_time(batch)`` (kvplan.plan.steptime; 1.0 per step when not
given, so times are in steps). A request arriving at time ``t`` is first seen by the step
that starts at or after ``t``. Closed-loop streams send the next request when the previous
one finishes (optionally after ``think_time``, and a per-request ``client_delay``).

Client timing: a real client and API server are late by a varying amount (on a busy host, stalls
of tens to hundreds of steps), which regroups which requests overlap; an onset the lockstep
simulation predicts can then move by a level from run to run. `timing_verdict` and
`proven_onsets` tell the onsets no such timing can move from the ones it can.

Not modelled: async scheduling's output placeholders (one step of lookahead on GPUs),
speculative decoding, several KV cache groups (one full-attention group here; sliding-window and
chunked-local groups: kvplan.plan.hybrid_sim; recurrent-state groups: not modelled), the
0.33 watermark, priority scheduling, the API server's own delays (beyond ``client_delay``).
"""

from __future__ import annotations

import gc
import math
import random
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from heapq import heappop, heappush

from kvplan.errors import KvplanError
from kvplan.plan.block_pool import BlockPool, LinkedBlockPool, PoolState
from kvplan.plan.hybrid_cache import HybridGroups
from kvplan.plan.steplog import StepBatch, StepLog, decode_pricer
from kvplan.stats import percentiles
from kvplan.units import cdiv

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Lengths:
    """(prompt, output) of request number ``index``, drawn exactly as `kvplan bench` draws them
    (kvplan.bench.workload.Workload.lengths: the same seeds, the same clipping), or cycled from
    a trace of (prompt, output) pairs."""

    prompt: int = 512
    output: int = 128
    distribution: str = "fixed"
    spread: float = 0.25
    seed: int = 0
    trace: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise KvplanError(f"invalid distribution {self.distribution!r}", f"use one of {', '.join(DISTRIBUTIONS)}")
        if self.prompt < 1 or self.output < 1:
            raise KvplanError("prompt and output lengths must be at least 1 token")

    def __call__(self, index: int) -> tuple[int, int]:
        return draw_lengths(index, self.prompt, self.output, self.distribution, self.spread, self.seed, self.trace)


def draw_lengths(index: int, prompt: int, output: int, distribution: str = "fixed", spread: float = 0.25,
                 seed: int = 0, trace: tuple[tuple[int, int], ...] | list = ()) -> tuple[int, int]:
    """(prompt, output) tokens of request ``index``: the one definition bench sends and the
    simulator replays (seeded per request, so any request can be redrawn alone)."""
    if trace:
        return tuple(trace[index % len(trace)])  # type: ignore[return-value]
    if distribution == "fixed":
        return prompt, output
    rng = random.Random(f"len:{seed}:{index}")
    return _draw(rng, prompt, distribution, spread), _draw(rng, output, distribution, spread)


#: The longest request a distribution draws (as a trace's: kvplan.traffic.loaders.MAX_TRACE_TOKENS): a
#: lognormal with a wide spread would otherwise draw 10^40 tokens, or overflow.
MAX_DRAWN_TOKENS = 1 << 24


def _draw(rng: random.Random, mean: int, distribution: str, spread: float) -> int:
    if distribution == "uniform":
        value = rng.uniform(mean * (1 - spread), mean * (1 + spread))
    elif distribution == "normal":
        value = rng.gauss(mean, spread * mean)
    else:  # lognormal: median `mean`, sigma `spread`
        value = math.exp(min(rng.gauss(math.log(mean), spread), math.log(MAX_DRAWN_TOKENS)))
    return max(1, min(MAX_DRAWN_TOKENS, int(round(value))))


@dataclass(frozen=True)
class SimTurn:
    """One turn of a session as the simulator replays it: lengths, the hash ids of its prompt's full
    blocks (kvplan.plan.prefix_cache.BlockHasher: equal ids are equal vLLM block hashes), and when it
    arrives: at ``arrival`` (absolute), else ``think`` after the previous turn of its session ends."""

    session: int
    prompt: int
    output: int
    keys: tuple[int, ...] = ()
    arrival: float | None = None
    think: float = 0.0
    # How many of ``keys`` (a prefix) another turn of the load it was made for also has (`traffic_load`); the rest
    # only this turn asks for, so the simulator keeps them out of the prefix-cache map (`LinkedBlockPool.PRIVATE`).
    # None: any may be shared.
    shared_keys: int | None = None


@dataclass(frozen=True)
class Load:
    """Who sends what, when.

    ``closed`` (``streams`` > 0): each stream sends ``requests_per_stream`` requests one after
    the other; request ``k`` of stream ``s`` is number ``first_index + k * streams + s`` (as
    bench numbers them). ``open``: request ``first_index + i`` arrives at ``arrivals[i]``.
    A request shares its first ``round(shared_prefix * prompt)`` tokens (or
    ``min(prompt, shared_prefix_tokens)``) with every other request.

    ``client_delay(number)``, when given, is added to request ``number``'s arrival (closed loop:
    its stream's first send, or the previous request's end plus ``think_time``): the time the
    client and the API server take before the engine's scheduler sees it. A real client's delay
    varies from request to request, which reorders arrivals by a step or more;
    ``onset_margins`` uses it to tell robust onsets from borderline ones."""

    lengths: Callable[[int], tuple[int, int]]
    streams: int = 0
    requests_per_stream: int = 1
    arrivals: tuple[float, ...] = ()
    first_index: int = 0
    shared_prefix: float = 0.0
    shared_prefix_tokens: int = 0
    think_time: float = 0.0
    client_delay: Callable[[int], float] | None = None
    # Sessions (traffic with reuse): request number i is turns[i]; a session's turns in order.
    turns: tuple[SimTurn, ...] = ()

    def __post_init__(self) -> None:
        if self.streams < 0 or self.requests_per_stream < 1:
            raise KvplanError("a load needs >= 0 streams and >= 1 request per stream")
        if not self.streams and not self.arrivals and not self.turns:
            raise KvplanError("a load needs streams (closed loop), arrival times (open loop) or sessions")
        if not 0.0 <= self.shared_prefix < 1.0:
            raise KvplanError(f"invalid shared prefix fraction {self.shared_prefix}", "use a fraction in [0, 1)")

    @property
    def num_requests(self) -> int:
        if self.turns:
            return len(self.turns)
        return self.streams * self.requests_per_stream if self.streams else len(self.arrivals)

    def shared_tokens(self, prompt: int) -> int:
        if self.shared_prefix_tokens:
            return min(prompt, self.shared_prefix_tokens)
        return int(round(self.shared_prefix * prompt))


def closed_loop(streams: int, lengths: Callable[[int], tuple[int, int]], requests_per_stream: int = 1,
                first_index: int = 0, shared_prefix: float = 0.0, shared_prefix_tokens: int = 0,
                think_time: float = 0.0, client_delay: Callable[[int], float] | None = None) -> Load:
    return Load(lengths, streams=streams, requests_per_stream=requests_per_stream, first_index=first_index,
                shared_prefix=shared_prefix, shared_prefix_tokens=shared_prefix_tokens, think_time=think_time,
                client_delay=client_delay)


def session_load(turns: Sequence[SimTurn], client_delay: Callable[[int], float] | None = None) -> Load:
    """Sessions: every turn with an ``arrival`` is sent then; a turn without one ``think`` after the
    previous turn of its session ends (request number = position in ``turns``)."""
    turns = tuple(turns)
    if not turns:
        raise KvplanError("a session load needs at least one turn")
    seen: set[int] = set()
    for t in turns:
        if t.arrival is None and t.session not in seen:
            raise KvplanError(f"the first turn of session {t.session} has no arrival time")
        seen.add(t.session)
    return Load(lambda i: (turns[i].prompt, turns[i].output), turns=turns, client_delay=client_delay)


def poisson_arrivals(rate: float, num_requests: int, seed: int = 0) -> tuple[float, ...]:
    """Arrival times of a Poisson process of ``rate`` requests per time unit (seeded)."""
    if rate <= 0 or num_requests < 1:
        raise KvplanError("an arrival rate must be > 0 and the run needs >= 1 request")
    rng = random.Random(f"arrivals:{seed}")
    t, out = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(rate)
        out.append(t)
    return tuple(out)


def open_loop(arrivals: Sequence[float], lengths: Callable[[int], tuple[int, int]], first_index: int = 0,
              shared_prefix: float = 0.0, shared_prefix_tokens: int = 0) -> Load:
    return Load(lengths, arrivals=tuple(sorted(arrivals)), first_index=first_index, shared_prefix=shared_prefix,
                shared_prefix_tokens=shared_prefix_tokens)


# --------------------------------------------------------------------------- scheduler


@dataclass(frozen=True)
class SchedulerConfig:
    """The engine's pool and limits (the reported ``num_blocks`` includes the null block)."""

    num_blocks: int
    block_size: int
    max_num_seqs: int = 1 << 30
    max_num_batched_tokens: int = 1 << 30
    admit_full_prompt: bool = True  # vLLM >= 0.19 (rules.admit_full_prompt)
    prefix_caching: bool = True
    max_model_len: int | None = None
    uncached_blocks_first: bool = True  # freed uncached blocks reused first (rules.free_uncached_first)
    prefix_stats_at_admission: bool = True  # hit counters at admission only (rules.prefix_stats_at_admission)
    #: The KV cache groups that take blocks from this pool when there are several (sliding-window, chunked-local or
    #: recurrent-state layers beside full attention: a request holds blocks in each); None: one full-attention group,
    #: this module's pool. `simulate` refuses a config with groups: kvplan.plan.hybrid_sim.simulate_groups runs it.
    kv_groups: HybridGroups | None = None

    def __post_init__(self) -> None:
        if self.num_blocks < 2 or self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise KvplanError("the simulator needs >= 2 blocks, a block size and limits >= 1")

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @classmethod
    def from_capacity(cls, cap, num_blocks: int | None = None) -> SchedulerConfig:
        """From a kvplan.plan.capacity.Capacity (one replica), its KV cache groups included (`kv_groups`); a
        KvplanError names a group the hybrid simulator does not model, whose requests' blocks kvplan cannot count."""
        groups = HybridGroups.of_capacity(cap)
        return cls(num_blocks=num_blocks or cap.num_blocks, block_size=cap.block_size,
                   max_num_seqs=cap.limits.max_num_seqs, max_num_batched_tokens=cap.limits.max_num_batched_tokens,
                   admit_full_prompt=cap.rules.admit_full_prompt, prefix_caching=cap.prefix_caching,
                   max_model_len=cap.max_model_len, uncached_blocks_first=cap.rules.free_uncached_first,
                   prefix_stats_at_admission=cap.rules.prefix_stats_at_admission,
                   kv_groups=None if groups.full_attention_only else groups)


@dataclass
class RequestTimeline:
    """One request's life, in steps and in time units (as the step time gives them)."""

    index: int
    prompt_tokens: int
    output_tokens: int
    shared_tokens: int
    arrival_time: float
    arrival_step: int | None = None  # the first step that could see it
    admitted_step: int | None = None
    admitted_time: float | None = None  # start of its first scheduled step
    first_token_step: int | None = None
    token_times: list[float] = field(default_factory=list)
    finish_step: int | None = None
    preemptions: int = 0
    waited_for_kv: bool = False
    peak_blocks: int = 0
    cached_tokens: int = 0  # prefix-cache hit at its first admission (tokens it did not compute)
    session: int = -1  # its session (session loads)

    @property
    def queueing_delay(self) -> float | None:
        return None if self.admitted_time is None else self.admitted_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def e2e(self) -> float | None:
        return self.token_times[-1] - self.arrival_time if self.finish_step is not None else None

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot(self) -> float | None:
        if self.finish_step is None or len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


@dataclass
class SimResult:
    config: SchedulerConfig
    requests: list[RequestTimeline]
    steps: int
    duration: float
    preemptions: int
    first_kv_wait_step: int | None
    first_kv_wait_time: float | None
    first_preemption_step: int | None
    first_preemption_time: float | None
    peak_waiting: int  # requests waiting after a step's scheduling (vLLM's gauge)
    peak_running: int
    peak_used_blocks: int
    kv_fill: Sequence[tuple[int, float, float]]  # (step, time at its end, used / usable), one per step (`StepLog`)
    step_batches: Sequence[StepBatch]
    # vLLM's prefix-cache counters (`PrefixCacheStats.record` at admission, v1/metrics/stats.py@0.32.0):
    # tokens looked up and found by requests never preempted (vllm:prefix_cache_queries / _hits), and
    # the same for re-admitted preempted requests, which vLLM keeps apart.
    prefix_queries: int = 0
    prefix_hits: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    # The first step that left a request waiting for the token budget, not for KV blocks (`_step`): vLLM's
    # waiting gauge counts it all the same (`Scheduler.make_stats`, v1/core/sched/scheduler.py@0.32.0).
    first_budget_wait_step: int | None = None
    first_budget_wait_time: float | None = None
    # The pool this load left for the next one on the same engine: kept only when the simulation was given a
    # ``start`` (None otherwise). State to carry, not a figure of this load: left out of equality and repr.
    pool_after: CarriedPool | None = field(default=None, repr=False, compare=False)

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None

    @property
    def waited_for_kv(self) -> bool:
        return self.first_kv_wait_step is not None

    @property
    def preempted(self) -> bool:
        return self.preemptions > 0

    @property
    def waited_for_budget(self) -> bool:
        return self.first_budget_wait_step is not None

    @property
    def peak_kv_fill(self) -> float:
        return self.peak_used_blocks / self.config.usable_blocks

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_times) for r in self.requests)

    @property
    def throughput(self) -> float:
        """Output tokens per time unit over the run."""
        return self.output_tokens / self.duration if self.duration > 0 else 0.0

    def values(self, metric: str) -> list[float]:
        """Every request's ``ttft``, ``itl`` (each gap), ``tpot``, ``e2e`` or ``queueing_delay``."""
        values: list[float] = []
        for r in self.requests:
            v = getattr(r, metric)
            if isinstance(v, list):
                values.extend(v)
            elif v is not None:
                values.append(v)
        return values

    def percentiles(self, metric: str, qs: Sequence[float] = (50, 90, 99)) -> dict[str, float | None]:
        """p50/p90/p99 of ``ttft``, ``itl``, ``tpot``, ``e2e`` or ``queueing_delay``."""
        return dict(zip((f"p{q:g}" for q in qs), percentiles(self.values(metric), qs)))

    def mean(self, metric: str) -> float | None:
        values = self.values(metric)
        return sum(values) / len(values) if values else None


class _Req:
    __slots__ = ("tl", "prompt", "output", "shared", "generated", "computed", "blocks", "stream", "k", "rid",
                 "num_cached", "keys", "private_from", "own_from")

    def __init__(self, tl: RequestTimeline, rid: int, stream: int, k: int, keys: tuple[int, ...] = (),
                 private_from: float = math.inf):
        self.tl, self.rid, self.stream, self.k, self.keys = tl, rid, stream, k, keys
        self.prompt, self.output, self.shared = tl.prompt_tokens, tl.output_tokens, tl.shared_tokens
        self.generated = 0
        self.computed = 0
        self.blocks: list = []  # its blocks (the pool's Block objects, or ids)
        self.num_cached = 0  # leading blocks already offered to the prefix cache (vLLM: num_cached_block)
        # Its blocks from this one on have hashes no other request has (`LinkedBlockPool.PRIVATE`; inf: none known).
        self.private_from = private_from
        self.own_from = math.inf  # its first PRIVATE block in ``blocks`` (past the hits of its last admission)

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated


def _key(req: _Req, k: int, block_size: int) -> Hashable:
    """A full block's identity: a session turn's prompt blocks by their hash ids (as they are: ints, which
    never equal the tuples below); the shared prefix's blocks the same for all requests; any other block
    (output included) the request's own."""
    if k < len(req.keys):
        return req.keys[k]
    if (k + 1) * block_size <= req.shared:
        return ("shared", k)
    return ("req", req.rid, k)


def _keys(req: _Req, start: int, stop: int, block_size: int) -> Sequence[Hashable]:
    """`_key` of blocks ``start`` to ``stop - 1`` (a slice of the hash ids where it can)."""
    given = len(req.keys)
    if stop <= given:
        return req.keys[start:stop]
    out = list(req.keys[start:given])  # then `_key`'s other two cases, inline (generated blocks: millions)
    shared_blocks, rid = req.shared // block_size, req.rid  # (k + 1) * B <= shared  <=>  k < shared // B
    out += [("shared", k) if k < shared_blocks else ("req", rid, k) for k in range(max(start, given), stop)]
    return out


@dataclass(frozen=True)
class CarriedPool:
    """The prefix cache that loads run one after another on one engine pass on (a bench's warm-up, then its points):
    the pool's blocks and hashes (`PoolState`), and how many requests the earlier loads numbered, so a later load's
    own blocks (`_key`: ``("req", rid, k)``) never take an earlier one's hash. ``EMPTY_POOL``: a fresh engine."""

    state: PoolState = PoolState()
    requests: int = 0


EMPTY_POOL = CarriedPool()


def simulate(config: SchedulerConfig, load: Load, step_time: Callable[[StepBatch], float] | None = None,
             max_steps: int = 5_000_000, trace: list[tuple] | None = None,
             start: CarriedPool | None = None) -> SimResult:
    """Run ``load`` through vLLM V1's scheduler on ``config``'s pool until every request ends.

    ``trace``, when given, receives every block-pool operation in order, for replaying them on vLLM's
    own KVCacheManager (tests/vllm_facing/test_block_pool_parity.py): ``("admit", request, num_tokens,
    hit_blocks, new_tokens, block_table)``, ``("alloc", request, num_tokens, new_tokens, block_table)``,
    ``("preempt", request)``, ``("finish", request)``; and ``("budget", request)`` when a step leaves ``request``,
    the head of the queue, waiting for the token budget (no pool operation: `_budget_stopped`).

    ``start``: the load begins on the pool an earlier one left (its ``pool_after``), as vLLM's pool carries over
    from one load to the next on a running engine; None: on an empty pool, and ``pool_after`` is not kept."""
    if config.kv_groups is not None and not config.kv_groups.full_attention_only:  # (a caller's slip: this pool
        # would count one group's blocks a request)
        raise ValueError("a pool of several KV cache groups is simulated by kvplan.plan.hybrid_sim.simulate_groups")
    with paused_gc():
        scheduler = _Scheduler(config, load, step_time, trace, start)
        try:
            result = scheduler.run(max_steps)
            if start is not None:
                result.pool_after = CarriedPool(scheduler.pool.state(), scheduler.counter)
            return result
        finally:
            scheduler.pool.unlink()


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off for a while (on again after, if it was on). A large simulation
    makes millions of objects that live to its end (batches, times, timelines) and no garbage cycles,
    yet each full collection walks every one of them: a tenth of its time at 100,000 requests.

    On again, the objects made meanwhile go straight to the oldest generation (`gc.freeze` then
    `gc.unfreeze`: two list splices), instead of the first young collection after walking them all (0.2-0.34 s
    measured after a 20,000-request simulation); a cycle among them waits for the next full collection. Not when the
    process keeps frozen objects of its own (a server may freeze its startup objects): unfreezing them
    would undo that."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


class _Scheduler:
    """One simulation: vLLM V1's scheduler step (`Scheduler.schedule`, v1/core/sched/scheduler.py) over the
    block pool. A step schedules the running requests first (preempting from the back when the pool is out
    of blocks), then admits waiting ones while the token budget and the pool allow, then applies the
    step's results (tokens computed, tokens sampled, requests finished and their successors sent).

    The pool: `LinkedBlockPool` (a request's ``blocks`` are its `Block` objects; the trace records ids), or
    what a subclass names in ``pool_class`` (the hybrid scheduler: `BlockPool`, ids)."""

    pool_class: type = LinkedBlockPool
    #: How a running request's chunk of ``n`` tokens from ``computed`` is cut, ``(req, computed, n) -> n``; None: not
    #: cut (the hybrid scheduler with a recurrent-state group: Mamba's block-aligned split).
    _cut_chunk: Callable[[_Req, int, int], int] | None = None

    def __init__(self, config: SchedulerConfig, load: Load, step_time: Callable[[StepBatch], float] | None,
                 trace: list[tuple] | None, start: CarriedPool | None = None):
        self.config, self.load, self.step_time, self.trace = config, load, step_time, trace
        self.B = config.block_size
        self.usable = config.usable_blocks
        self.pool = self.pool_class(self.usable, config.prefix_caching, config.uncached_blocks_first)
        self.timelines: list[RequestTimeline] = []
        self.counter = 0
        if start is not None:  # the pool an earlier load left, requests numbered on from its count
            if start.state.free:
                self.pool.restore(start.state)
            self.counter = start.requests
        self.delay = load.client_delay or (lambda number: 0.0)
        self.next_turn: dict[int, int] = {}  # request number -> its session's next turn, sent on its end
        self.pending_q: deque[tuple[float, int, _Req]] = deque(self._first_arrivals())
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.now = 0.0
        self.step = 0
        self.preemptions = 0
        self.first_wait_step = self.first_wait_time = self.first_pre_step = self.first_pre_time = None
        self.first_budget_step = self.first_budget_time = None
        self.peak_waiting = self.peak_running = self.peak_used = 0
        self.log = StepLog()  # every step's batch, end and KV fill
        self.finished = 0
        self.queries = self.hits_tokens = self.pre_queries = self.pre_hits = 0

    # ---------------------------------------------------------------- requests

    def _make(self, number: int, arrival: float, stream: int, k: int) -> _Req:
        config, load, B, usable = self.config, self.load, self.B, self.usable
        prompt, output = load.lengths(number)
        keys = load.turns[number].keys if load.turns else ()
        if prompt < 1 or output < 1:
            raise KvplanError(f"request {number}: prompt and output must be >= 1 token")
        if config.max_model_len and prompt + output > config.max_model_len:
            raise KvplanError(f"request {number}: {prompt} + {output} tokens exceed max_model_len "
                              f"{config.max_model_len} (vLLM refuses its prompt or cuts its output)")
        if cdiv(prompt + output - 1, B) > usable:
            raise KvplanError(f"request {number} needs {cdiv(prompt + output - 1, B)} blocks; the pool has "
                              f"{usable} usable: it could never finish")
        tl = RequestTimeline(number, prompt, output, load.shared_tokens(prompt), arrival,
                             session=load.turns[number].session if load.turns else -1)
        self.timelines.append(tl)
        self.counter += 1
        return _Req(tl, self.counter, stream, k, keys, self._private_from(number, keys, tl.shared_tokens))

    def _private_from(self, number: int, keys: tuple[int, ...], shared_tokens: int) -> float:
        """The first of request ``number``'s blocks whose hash no other request has: past the hash ids other turns
        share (`SimTurn.shared_keys`; all when not known) and the shared prefix's blocks (`_key`: the rest are
        ``("req", rid, k)``, its own). inf where the pool keeps every hash in its map (`BlockPool`)."""
        if not isinstance(self.pool, LinkedBlockPool) or not self.config.prefix_caching:
            return math.inf
        shared_ids = self.load.turns[number].shared_keys if self.load.turns else None
        if shared_ids is None:
            shared_ids = len(keys)
        shared_blocks = shared_tokens // self.B
        return shared_ids if shared_blocks <= len(keys) else shared_blocks  # (shared-prefix blocks past the ids)

    def _first_arrivals(self) -> list[tuple[float, int, _Req]]:
        """The requests known before the first step, by (time, stream): sessions' turns with an arrival, each
        stream's first request, or the open loop's arrivals."""
        load, delay = self.load, self.delay
        pending = []
        if load.turns:
            last_of: dict[int, int] = {}
            for number, t in enumerate(load.turns):
                if t.arrival is not None:
                    at = t.arrival + delay(number)
                    pending.append((at, number, self._make(number, at, t.session, number)))
                else:
                    self.next_turn[last_of[t.session]] = number
                last_of[t.session] = number
        elif load.streams:
            for s in range(load.streams):
                number = load.first_index + s
                pending.append((delay(number), s, self._make(number, delay(number), s, 0)))
        else:
            for i, t in enumerate(load.arrivals):
                number = load.first_index + i
                pending.append((t + delay(number), i, self._make(number, t + delay(number), -1, 0)))
        pending.sort(key=lambda x: (x[0], x[1]))
        return pending

    # ---------------------------------------------------------------- the pool

    def _allocate(self, req: _Req, num_tokens: int) -> bool:
        need = cdiv(num_tokens, self.B) - len(req.blocks)
        if need > self.pool.num_free:
            return False
        if need > 0:
            req.blocks += self.pool.take(need)
        return True

    def _cache_full(self, req: _Req, upto: int) -> None:
        """Offer the request's newly full blocks to the cache, each once (as vLLM caches a block
        when it is allocated for tokens that fill it, never again)."""
        full = min(upto, req.num_tokens) // self.B
        if full > req.num_cached:
            self._cache(req, req.num_cached, full)
            req.num_cached = full

    def _cache(self, req: _Req, start: int, stop: int) -> None:
        """Blocks ``start`` to ``stop - 1`` of the request cached: under their hashes, or, from its ``private_from``
        on, as ``PRIVATE`` (nothing to tell the pool: they are ``own_from`` to ``num_cached``, `LinkedBlockPool`)."""
        mid = min(max(start, req.private_from), stop)
        if mid > start:
            self.pool.cache(req.blocks[start:mid], _keys(req, start, mid, self.B))

    def _free(self, req: _Req) -> None:
        """Its blocks back to the pool, its last block first (a hybrid pool frees group by group); its PRIVATE ones
        as one run."""
        own = (int(req.own_from), req.num_cached) if req.num_cached > req.own_from else None
        self.pool.release(req.blocks, own)
        req.blocks = []

    def _preempt(self, req: _Req) -> None:
        if self.trace is not None:
            self.trace.append(("preempt", req.tl.index))
        if req.num_cached > req.own_from:  # its own hashes into the map: it looks them up when readmitted
            start = int(req.own_from)  # (its PRIVATE blocks: those before are hits, already in the map)
            self.pool.promote(req.blocks[start:req.num_cached], _keys(req, start, req.num_cached, self.B))
            req.own_from = math.inf  # (none left)
        self._free(req)
        req.computed = 0
        req.num_cached = 0
        req.tl.preemptions += 1
        req.tl.waited_for_kv = True
        self.preemptions += 1
        if self.first_pre_step is None:
            self.first_pre_step, self.first_pre_time = self.step, self.now
        self._waited()
        self.waiting.appendleft(req)

    def _take_arrivals(self, step: int, now: float) -> float:
        """The pending requests arrived by ``now`` join the waiting queue (seen at ``step``); the next arrival's
        time (inf: none left)."""
        pending, waiting = self.pending_q, self.waiting
        while pending and pending[0][0] <= now:
            _, _, req = pending.popleft()
            req.tl.arrival_step = step
            waiting.append(req)
        return pending[0][0] if pending else math.inf

    def _end_run(self, steps: int, done: list[_Req], step: int, now: float,
                 budget_wait: tuple[int, float] | None) -> int:
        """A run of ``steps`` steady steps (`_decode_steps`) ends: the first budget wait it saw recorded (when its
        step was run here, not left to `_step`), the requests that sampled their last token finished at its last
        step's end ``now``, the clock at ``step``. Returns ``steps``."""
        if budget_wait is not None and budget_wait[0] < step:
            self._waited_for_budget(*budget_wait)
        self.step = step - 1  # the last step's results
        self._finish(done, now)
        self.step, self.now = step, now
        return steps

    def _waited(self) -> None:
        if self.first_wait_step is None:
            self.first_wait_step, self.first_wait_time = self.step, self.now

    def _waited_for_budget(self, step: int, now: float) -> None:
        if self.first_budget_step is None:
            self.first_budget_step, self.first_budget_time = step, now

    # ---------------------------------------------------------------- one step

    def _schedule_running(self, scheduled: list[tuple[_Req, int, int]], budget: int) -> tuple[int, bool]:
        """Running requests first, in order; out of blocks, the last running one is preempted (until the
        request itself is). Returns the budget left and whether anything was preempted."""
        config, running = self.config, self.running
        needs_room, scheduled_hook = self._needs_room, self._scheduled  # (bound once: called per request)
        cut = self._cut_chunk
        preempted_now = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.computed
            n = min(req.prompt + req.generated - computed, budget)
            if config.max_model_len:
                n = min(n, config.max_model_len - 1 - computed)
            if cut is not None and n > 0:
                n = cut(req, computed, n)
            if n <= 0:
                i += 1
                continue
            if needs_room(req, computed + n):
                ok, preempted = self._room_for(req, computed + n, n)
                preempted_now |= preempted
                if not ok:
                    break
            scheduled_hook(req, computed + n, n)
            scheduled.append((req, n, computed))
            budget -= n
            i += 1
        return budget, preempted_now

    def _needs_room(self, req: _Req, num_tokens: int) -> bool:
        """Whether a running request must allocate to hold ``num_tokens`` (a new block; else nothing to do)."""
        return -(-num_tokens // self.B) > len(req.blocks)

    def _scheduled(self, req: _Req, num_tokens: int, new_tokens: int) -> None:
        """A running request scheduled up to ``num_tokens``: its newly full blocks cached, the step traced."""
        if num_tokens // self.B > req.num_cached:
            self._cache_full(req, num_tokens)
        if self.trace is not None:
            self.trace.append(("alloc", req.tl.index, req.num_tokens, new_tokens, self.pool.ids(req.blocks)))

    def _room_for(self, req: _Req, num_tokens: int, new_tokens: int) -> tuple[bool, bool]:
        """A running request's slots up to ``num_tokens`` (`_grow`), the newest running request preempted each
        time they do not fit, until they do or the request preempted itself: (allocated, anything preempted)."""
        preempted = False
        while not self._grow(req, num_tokens, new_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            preempted = True
            if victim is req:
                return False, True
        return True, preempted

    def _grow(self, req: _Req, num_tokens: int, new_tokens: int) -> bool:
        return self._allocate(req, num_tokens)

    def _admit_waiting(self, scheduled: list[tuple[_Req, int, int]], budget: int) -> bool:
        """Waiting requests in order, while the budget, max_num_seqs and the pool allow; True when the
        head of the queue waits for KV blocks."""
        config, pool, B, waiting = self.config, self.pool, self.B, self.waiting
        while waiting and budget > 0 and len(self.running) < config.max_num_seqs:
            req = waiting[0]
            hits = _prefix_hits(pool, req, B) if config.prefix_caching else []
            computed = len(hits) * B
            first_chunk = min(req.num_tokens - computed, budget)
            check = req.num_tokens if config.admit_full_prompt else computed + first_chunk
            # Hits on blocks nobody holds are taken off the free queue: they cost a block. (At most every hit
            # does: when the blocks fit even then, they are not counted.)
            admitted = (cdiv(check, B) <= pool.num_free
                        or cdiv(check, B) - len(hits) + pool.free_among(hits) <= pool.num_free)
            if config.prefix_caching and (admitted or not config.prefix_stats_at_admission):
                if req.tl.preemptions:
                    self.pre_queries, self.pre_hits = self.pre_queries + req.num_tokens, self.pre_hits + computed
                else:
                    self.queries, self.hits_tokens = self.queries + req.num_tokens, self.hits_tokens + computed
            if not admitted:
                return True
            if not req.tl.preemptions:
                req.tl.cached_tokens = computed
            pool.touch(hits)
            req.blocks = list(hits)
            req.computed = computed
            # Its first chunk's new blocks (`admitted` counted them: they fit), the full ones cached as they are
            # taken (`_allocate` then `_cache_full`, in one pass over the blocks: `take_cached`).
            upto = computed + first_chunk
            full = upto // B
            need = cdiv(upto, B) - len(hits)
            if need > 0:
                mid = min(max(len(hits), req.private_from), full)  # (`_cache`'s split: hashes, then PRIVATE)
                keys = _keys(req, len(hits), mid, B) if mid > len(hits) else ()
                req.blocks += pool.take_cached(need, keys, full - mid)
            req.num_cached = max(len(hits), full)
            req.own_from = max(len(hits), req.private_from)
            if self.trace is not None:
                self.trace.append(("admit", req.tl.index, req.num_tokens, pool.ids(hits), first_chunk, pool.ids(req.blocks)))
            waiting.popleft()
            self.running.append(req)
            if req.tl.admitted_step is None:
                req.tl.admitted_step, req.tl.admitted_time = self.step, self.now
            scheduled.append((req, first_chunk, computed))
            budget -= first_chunk
        return False

    def _batch(self, scheduled: list[tuple[_Req, int, int]]) -> StepBatch:
        prefill = decode = kv = pairs = 0
        for r, n, c in scheduled:
            if n == 1 and c == r.prompt + r.generated - 1 and r.generated > 0:
                decode += 1
            else:
                prefill += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
        return StepBatch(prefill, decode, kv, len(scheduled), pairs)

    def _apply_results(self, scheduled: list[tuple[_Req, int, int]], end: float) -> None:
        """Computed tokens advance; a request whose tokens are all computed samples one; a finished one
        frees its blocks and sends its successor (its session's next turn, or its stream's next request)."""
        done: list[_Req] = []
        for req, n, _ in scheduled:
            computed = req.computed = req.computed + n
            if computed >= req.prompt + req.generated:  # (its num_tokens)
                req.generated += 1
                tl = req.tl
                if tl.first_token_step is None:
                    tl.first_token_step = self.step
                tl.token_times.append(end)
                if req.generated >= req.output:
                    done.append(req)
        self._finish(done, end)
        # Peak blocks: only a scheduled request's blocks change in a step (a request preempted in it was not
        # scheduled, and left `running`), and a finished one's peak was taken by `_finish`.
        for req, _, _ in scheduled:
            if len(req.blocks) > req.tl.peak_blocks:
                req.tl.peak_blocks = len(req.blocks)

    def _finish(self, done: list[_Req], end: float) -> None:
        """The requests that sampled their last token in this step (which ends at ``end``), in schedule
        order: their blocks freed, their successors sent."""
        load = self.load
        for req in done:
            req.tl.peak_blocks = max(req.tl.peak_blocks, len(req.blocks))
            self.running.remove(req)
            if self.trace is not None:
                self.trace.append(("finish", req.tl.index))
            self._free(req)
            req.tl.finish_step = self.step
            self.finished += 1
            if req.tl.index in self.next_turn:
                number = self.next_turn[req.tl.index]
                t = load.turns[number]
                nxt = self._make(number, end + t.think + self.delay(number), t.session, number)
                _insert(self.pending_q, (nxt.tl.arrival_time, number, nxt))
            elif load.streams and req.k + 1 < load.requests_per_stream:
                k = req.k + 1
                number = load.first_index + k * load.streams + req.stream
                nxt = self._make(number, end + load.think_time + self.delay(number), req.stream, k)
                _insert(self.pending_q, (nxt.tl.arrival_time, req.stream, nxt))

    # ---------------------------------------------------------------- steady decoding, many steps at once

    def _decode_steps(self, max_steps: int) -> int:
        """Run the steps from this one while the engine is steady, all at once; the number of steps run
        (0: this step is not steady, `_step` runs it).

        Steady: every running request decodes one token (its prompt and any recomputation done), each gets
        its token within the budget, and no waiting request can be admitted: none waits, or the step cannot
        try (``max_num_seqs`` running, or no budget left), or the head of the queue waits for KV blocks and
        cannot stop waiting before a request ends (see `_blocked_head`). A step in which requests arrive (or
        that starts with the head fitting) admits them beside the decoding requests (`_admit_in_run`: their
        batch logged as one step), and the run goes on with them decoding when it can. Such a step is the same every time
        but for its numbers: its batch (``kv_tokens_read`` and ``attention_pairs`` grow by one per request),
        the requests crossing into a new block (their ``computed`` mod B is known), its time. Each step still
        makes its own `StepBatch` and calls ``step_time`` once, in order (a black box; the times add up in
        the same order, so to the same bits), but the log keeps the run as one entry (`StepLog`); what is saved
        is the work per request and step, and the memory per step.

        The run stops before a step that must be taken one by one: one where the pool has fewer free blocks
        than the requests crossing into a block (one would preempt); or after an admission it cannot go on from
        (`_admit_in_run`). A request that samples its last token ends after that step as `_finish` ends it (its
        state brought up to date first, `_sync_decoded`: the others' only at the run's end, `_run_results`), and
        the run goes on without it; when the head of the queue waits for KV blocks or the budget is spent, the
        run ends with that step instead (what the step after may do is `_step`'s to find out).

        Why the pool ends up the same: between an admission or a request's end and the next, the pool only hands
        out new blocks (`take`, in step then running order, one by one; here one `take` of them all before the
        admission or the end, and after the loop: blocks come off the head of the free queue, so one take of n + m
        blocks is a take of n then of m, and in a step the running requests allocate before any admission and
        before its results free anything) and registers full blocks (`cache`). A `take` pops a free block, `cache`
        names a held one, so the two touch different blocks; and the two orders of removing one block from a
        hash's list of blocks and appending another give the same list. So an admission or an end sees the pool
        as the steps one by one leave it, but for blocks the decoding filled and the run has not cached yet: their
        hashes are their requests' own, which no lookup asks for (`_admit_in_run` checks), and an ending request's
        are cached before its blocks are freed (`_sync_decoded`), as its steps would have.
        (tests/plan/test_simulate_equivalence.py compares runs with the steps one by one.)"""
        config, running, waiting, B = self.config, self.running, self.waiting, self.B
        num = len(running)
        budget_left = config.max_num_batched_tokens - num
        if not num or budget_left < 0 or self.trace is not None:  # a trace logs every step's allocations
            return 0
        may_admit = budget_left > 0 and num < config.max_num_seqs
        # The head fits whatever this step takes: it is admitted in this step (the usual arrival: `_admit_in_run`).
        admit_first = may_admit and waiting and cdiv(waiting[0].num_tokens, B) <= self.pool.num_free - num
        steady = self._steady_running()
        if steady is None:
            return 0
        kv, crossing_at, finish_at = steady
        horizon = max_steps - self.step  # steps to run at most
        blocked = False
        if waiting and may_admit and not admit_first:
            if not self._blocked_head(budget_left, len(crossing_at[0])):
                return 0
            blocked = True

        pool, pending, step_time, usable = self.pool, self.pending_q, self.step_time, self.usable
        ends: list[float] = []
        fills: list[float] = []
        kv_first = kv
        now, step = self.now, self.step
        seg_start = 0  # the first step of the log's current decode-run entry (an admission step splits the run)
        synced: dict[_Req, int] = {}  # a request's state is up to date at this step of the run (absent: at its start)
        finish_steps = sorted(finish_at)  # (a heap)
        next_finish = finish_steps[0]
        peak_running = max(self.peak_running, num)
        own_tails: bool | None = None  # no running request's keys reach past its prompt's full blocks (`_admit_in_run`)
        # The steps' new blocks are taken in one `take` before an admission or a request's end and after the loop
        # (steps in order, each in running order, as one by one); ``free`` counts them down meanwhile.
        free = pool.num_free
        crossers: list[_Req] = []
        used = usable - free
        fill = used / usable
        peak_waiting = self.peak_waiting if admit_first else max(self.peak_waiting, len(waiting))  # (after admission)
        # No budget left to try a waiting request (vLLM's ``while token_budget > 0``): it waits for the budget.
        budget_spent = budget_left == 0 and self.first_budget_step is None
        budget_wait = (step, now) if budget_spent and waiting else None
        next_arrival = pending[0][0] if pending else math.inf
        if admit_first:
            next_arrival = now  # (step 0 admits the head as if it had just arrived)
        price = decode_pricer(step_time)  # (the log keeps the run's batches as one entry: `StepLog`)
        j = 0
        while j < horizon:
            if next_arrival <= now and may_admit and not blocked:  # (arrivals seen at this step's start)
                # The arrivals are admitted in this step, beside the decoding requests (`_admit_in_run`).
                crossing = crossing_at[j % B]
                if own_tails is None:
                    own_tails = not any(len(req.keys) > req.prompt // B for req in running)
                if not own_tails or len(crossing) > free:
                    break
                next_arrival = self._take_arrivals(step, now)
                free -= len(crossing)
                crossers += crossing
                self._take_for(crossers)
                crossers = []
                if j > seg_start:
                    self.log.add_decode_run(num, kv_first + seg_start * num, ends[seg_start:], fills[seg_start:])
                end, fill, admitted, goes_on = self._admit_in_run(num, kv, step, now)
                ends.append(end)
                fills.append(fill)
                peak_running = max(peak_running, len(running))
                free = pool.num_free
                used = usable - free
                now = end
                step += 1
                kv += num
                j += 1
                seg_start = j
                for req in admitted:  # (their results to this step are applied: they decode from step j on)
                    synced[req] = j
                if not goes_on:  # the run ends with this step (see `_admit_in_run`)
                    break
                for req in admitted:  # decoding from step j on, computed req.computed there
                    crossing_at[(j - req.computed) % B].append(req)
                    kv += req.computed + 1
                    last = j + req.output - req.generated - 1
                    if last not in finish_at:
                        heappush(finish_steps, last)
                        next_finish = finish_steps[0]
                    finish_at.setdefault(last, []).append(req)
                num += len(admitted)
                kv_first = kv - seg_start * num  # (so that kv_first + seg_start * num is this step's kv)
                fill = used / usable
                budget_left = config.max_num_batched_tokens - num
                may_admit = budget_left > 0 and num < config.max_num_seqs
            else:
                if next_arrival <= now:  # arrivals seen at this step's start (not the first: `run` took them)
                    next_arrival = self._take_arrivals(step, now)  # (they wait for KV too when the head does: below)
                    peak_waiting = max(peak_waiting, len(waiting))
                    if budget_spent and budget_wait is None and waiting:
                        budget_wait = (step, now)
                crossing = crossing_at[j % B]
                if crossing:
                    if len(crossing) > free:  # one of them preempts: a step of its own
                        break
                    free -= len(crossing)
                    crossers += crossing
                    used = usable - free
                    fill = used / usable
                end = now + price(num, kv)
                ends.append(end)
                fills.append(fill)
                now = end
                step += 1
                kv += num
                j += 1
            if j - 1 == next_finish:  # requests sampled their last token in the step just run
                if blocked or budget_spent:  # (the run ends with it; the results below finish them)
                    break
                # They end now, as `_finish` ends them after `_apply_results`: their blocks freed (after this and the
                # earlier steps' new blocks are taken), their successors sent; the run goes on with the others.
                done = finish_at.pop(heappop(finish_steps))
                next_finish = finish_steps[0] if finish_steps else -1
                self._take_for(crossers)
                crossers = []
                self.peak_used = max(self.peak_used, used)
                for req in done:
                    self._sync_decoded(req, j, synced, ends)
                if j > seg_start:
                    self.log.add_decode_run(num, kv_first + seg_start * num, ends[seg_start:], fills[seg_start:])
                    seg_start = j
                self.step, self.now = step - 1, now
                self._finish(done, now)
                self.step = step
                for req in done:
                    crossing_at[(j - req.computed) % B].remove(req)
                    kv -= req.computed + 1
                num -= len(done)
                if not num:
                    break
                kv_first = kv - seg_start * num
                free = pool.num_free
                used = usable - free
                fill = used / usable
                budget_left = config.max_num_batched_tokens - num
                may_admit = budget_left > 0 and num < config.max_num_seqs
                next_arrival = pending[0][0] if pending else math.inf
                if may_admit and waiting:
                    next_arrival = now  # (the next step tries the head, as `_step` would)
        steps = len(ends)
        if not steps:
            return 0
        if steps > seg_start:
            self.log.add_decode_run(num, kv_first + seg_start * num, ends[seg_start:], fills[seg_start:])
        self._take_for(crossers)
        if blocked:
            for req in waiting:
                req.tl.waited_for_kv = True
            self._waited()
        self.peak_used = max(self.peak_used, used)  # (since the run's last end blocks were only taken: the most since)
        self.peak_waiting = max(self.peak_waiting, peak_waiting)
        self.peak_running = peak_running
        return self._end_run(steps, self._run_results(ends, synced), step, now, budget_wait)

    def _steady_running(self) -> tuple[int, list[list[_Req]], dict[int, list[_Req]]] | None:
        """For a decode run (`_decode_steps`): (the tokens its first step reads, the running requests by the step
        mod B in which each crosses into a new block, by the run's step in which each samples its last token), or
        None when one of them does not decode one token now."""
        B = self.B
        # The requests crossing into a new block in step j are those whose computed % B == -j % B: crossing_at[j % B].
        crossing_at: list[list[_Req]] = [[] for _ in range(B)]
        kv = len(self.running)  # kv_tokens_read of the first step: sum of (computed + 1)
        finish_at: dict[int, list[_Req]] = {}
        for req in self.running:
            c = req.computed
            # Decoding: one token left to compute, its first token sampled, the blocks of its computed tokens.
            # (max_model_len never cuts a decode: a request is at most max_model_len tokens, `_make`.)
            # (`_cache_full` keeps num_cached = computed // B: checked, as `_blocked_head` relies on it.)
            if (not req.generated or c != req.prompt + req.generated - 1 or len(req.blocks) != -(-c // B)
                    or req.num_cached != c // B):
                return None
            finish_at.setdefault(req.output - req.generated - 1, []).append(req)
            kv += c
            crossing_at[-c % B].append(req)
        return kv, crossing_at, finish_at

    def _run_results(self, ends: list[float], synced: dict[_Req, int]) -> list[_Req]:
        """A decode run's results for the requests still running at its end (`_sync_decoded` at its last step);
        returns those that sampled their last token, in running order."""
        done: list[_Req] = []
        for req in self.running:
            self._sync_decoded(req, len(ends), synced, ends)
            if req.generated >= req.output:
                done.append(req)
        return done

    def _sync_decoded(self, req: _Req, step: int, synced: dict[_Req, int], ends: list[float]) -> None:
        """A request decoding in a run brought up to date at the run's step ``step``: a token sampled at each step's
        end since it was last (``synced``; absent: since the run's start; one admitted in the run's last step has its
        results from `_admit_in_run`), its newly full blocks cached (as each step would have: `_cache_full`)."""
        start = synced.get(req, 0)
        decoded = step - start
        if decoded:
            c = req.computed = req.computed + decoded
            req.generated += decoded
            req.tl.token_times.extend(ends[start:step])
            full = c // self.B
            if full > req.num_cached:
                k = req.num_cached
                if self.config.prefix_caching and k < req.private_from:  # (PRIVATE blocks need nothing: `_cache`)
                    self._cache(req, k, full)
                req.num_cached = full
        synced[req] = step

    def _take_for(self, crossers: list[_Req]) -> None:
        """The blocks of the requests that crossed into a new block in a decode run, in step then running order, in
        one `take` (blocks come off the head of the free queue: one take of n + m blocks is a take of n then m)."""
        for req, block in zip(crossers, self.pool.take(len(crossers))):
            blocks = req.blocks
            blocks.append(block)
            if len(blocks) > req.tl.peak_blocks:  # (only these requests' blocks changed in the run)
                req.tl.peak_blocks = len(blocks)

    def _admit_in_run(self, num: int, kv: int, step: int, now: float) -> tuple[float, float, list[_Req], bool]:
        """Step ``step`` of a decode run (`_decode_steps`) in which requests arrived: the ``num`` running requests decode
        a token each, reading ``kv`` tokens (each brought up to date only when it or the run ends), and the waiting
        ones are admitted as `_step` admits them (this step's crossing requests have their blocks: running requests
        allocate first). Its batch is logged and its results applied to the admitted requests, as `_step` and
        `_apply_results` would; returns (its end, the pool's fill after admission, the admitted requests, whether the
        run goes on: each of them now decodes as the run's requests do, none has hash ids past its prompt's full
        blocks (the run caches the blocks its decoding fills only when a request or the run ends, which no lookup
        can tell while they are the requests' own), the next step's decoding leaves budget, and no request still
        waits unless ``max_num_seqs`` are running, so that none can be tried before one ends)

        Why the same: `_step` would schedule the running requests first (each one token: no preemption, as the run
        checked their new blocks fit), cache their newly full blocks (their own hashes, which no admission looks up),
        then admit with the budget left; the batch's decoding part is the run's (``num`` requests, ``kv`` tokens)."""
        config = self.config
        self.step, self.now = step, now
        scheduled: list[tuple[_Req, int, int]] = []
        waiting = self.waiting
        if self._admit_waiting(scheduled, config.max_num_batched_tokens - num):
            for req in waiting:
                req.tl.waited_for_kv = True
            self._waited()
        elif waiting and self._budget_stopped(num + sum(n for _, n, _ in scheduled)):  # (the decoding ones' tokens too)
            self._waited_for_budget(step, now)
        used = self.usable - self.pool.num_free
        self.peak_used = max(self.peak_used, used)
        self.peak_waiting = max(self.peak_waiting, len(waiting))
        part = self._batch(scheduled)
        batch = StepBatch(part.prefill_tokens, part.decode_seqs + num, part.kv_tokens_read + kv, part.num_seqs + num,
                          part.attention_pairs + kv)
        end = now + (self.step_time(batch) if self.step_time else 1.0)
        fill = used / self.usable
        self.log.add(batch, end, fill)
        B = self.B
        # Goes on: the next step's decoding tokens leave budget, and no request waits or none can be tried before a
        # request ends (``max_num_seqs`` running: arrivals then wait in the run, as they do in one started so).
        room = num + len(scheduled)
        goes_on = room < config.max_num_batched_tokens and (not waiting or room >= config.max_num_seqs)
        for req, n, _ in scheduled:  # `_apply_results` for the admitted requests
            computed = req.computed = req.computed + n
            if computed >= req.prompt + req.generated:
                req.generated += 1
                if req.tl.first_token_step is None:
                    req.tl.first_token_step = step
                req.tl.token_times.append(end)
            if len(req.blocks) > req.tl.peak_blocks:
                req.tl.peak_blocks = len(req.blocks)
            if (not req.generated or req.generated >= req.output or computed != req.prompt + req.generated - 1
                    or len(req.blocks) != -(-computed // B) or req.num_cached != computed // B
                    or len(req.keys) > req.prompt // B):
                goes_on = False
        return end, fill, [req for req, _, _ in scheduled], goes_on

    def _blocked_head(self, budget: int, first_takes: int) -> bool:
        """Whether the head of the queue waits for KV blocks in this step and every later one until a
        request ends, whatever the running requests' new blocks do to the pool. True when it needs more
        blocks than are free once this step's ``first_takes`` blocks are taken, and it needs no fewer
        later: its need, ``cdiv(check, B) - hits a running request holds``, can only grow, as a `take`
        only evicts (the hits become a prefix of themselves) and the running requests' new full blocks are
        their own (no hash of its prompt: asked here); ``check`` is its whole prompt (``admit_full_prompt``),
        or, without prefix caching, a first chunk of a fixed size. Not so when every failed attempt counts
        in the prefix-cache stats (``prefix_stats_at_admission`` off): those are left to `_step`."""
        config, pool, B = self.config, self.pool, self.B
        if config.prefix_caching and not (config.admit_full_prompt and config.prefix_stats_at_admission):
            return False
        if any(len(req.keys) > req.prompt // B for req in self.running):  # keys beyond the prompt's full blocks
            return False
        head = self.waiting[0]
        if cdiv(head.num_tokens, B) <= pool.num_free - first_takes:  # it fits even with no hit
            return False
        hits = _prefix_hits(pool, head, B) if config.prefix_caching else []
        computed = len(hits) * B
        check = head.num_tokens if config.admit_full_prompt else computed + min(head.num_tokens - computed, budget)
        need = cdiv(check, B) - len(hits) + pool.free_among(hits)  # less the hits others hold
        return need > pool.num_free - first_takes

    # ---------------------------------------------------------------- the loop

    def _step(self) -> None:
        """One step, the general way."""
        waiting = self.waiting
        scheduled: list[tuple[_Req, int, int]] = []  # (request, new tokens, computed before)
        budget, preempted_now = self._schedule_running(scheduled, self.config.max_num_batched_tokens)
        if not preempted_now and self._admit_waiting(scheduled, budget):
            for req in waiting:
                req.tl.waited_for_kv = True
            self._waited()
        elif waiting and not preempted_now and self._budget_stopped(sum(n for _, n, _ in scheduled)):
            self._waited_for_budget(self.step, self.now)
            if self.trace is not None:
                self.trace.append(("budget", waiting[0].tl.index))
        if not scheduled and not self.running and waiting:
            head = waiting[0]
            raise KvplanError(f"request {head.tl.index} can never be admitted: it needs {self._admission_blocks(head)} "
                              f"blocks, the pool has {self.usable} usable")
        self.peak_waiting = max(self.peak_waiting, len(waiting))
        self.peak_running = max(self.peak_running, len(self.running))
        used = self.usable - self.pool.num_free
        self.peak_used = max(self.peak_used, used)
        batch = self._batch(scheduled)
        end = self.now + (self.step_time(batch) if self.step_time else 1.0)
        self._apply_results(scheduled, end)
        self.log.add(batch, end, used / self.usable)
        self.now = end
        self.step += 1

    def _admission_blocks(self, req: _Req) -> int:
        """The blocks admitting ``req`` on an empty pool takes (its whole sequence's)."""
        return cdiv(req.num_tokens, self.B)

    def _budget_stopped(self, scheduled_tokens: int) -> bool:
        """Whether admission, not refused for KV blocks, stopped with a request still waiting because of the token
        budget, the step's requests having been given ``scheduled_tokens``. vLLM's waiting loop stops at ``while
        token_budget > 0`` (the budget spent, tried first), at ``num_running >= max_num_active_reqs`` (max_num_seqs: not
        the budget), at ``allocate_slots`` returning None (KV: `_admit_waiting` said so), or at a chunk of 0 tokens (``if
        num_new_tokens == 0: break``, Mamba's `_mamba_block_aligned_split` rounding the budget left down to no block),
        v1/core/sched/scheduler.py@0.32.0."""
        return len(self.running) < self.config.max_num_seqs or scheduled_tokens >= self.config.max_num_batched_tokens

    def run(self, max_steps: int) -> SimResult:
        total = self.load.num_requests
        pending_q, waiting = self.pending_q, self.waiting
        while self.finished < total:
            if self.step >= max_steps:
                raise KvplanError(f"the simulation did not finish within {max_steps:,} steps")
            self._take_arrivals(self.step, self.now)
            if not self.running and not waiting:
                self.now = max(self.now, pending_q[0][0])  # idle until the next arrival
                continue
            if not self._decode_steps(max_steps):
                self._step()
        return SimResult(
            config=self.config, requests=sorted(self.timelines, key=lambda t: t.index), steps=self.step,
            duration=self.now, preemptions=self.preemptions, first_kv_wait_step=self.first_wait_step,
            first_kv_wait_time=self.first_wait_time, first_preemption_step=self.first_pre_step,
            first_preemption_time=self.first_pre_time, peak_waiting=self.peak_waiting,
            peak_running=self.peak_running, peak_used_blocks=self.peak_used, kv_fill=self.log.kv_fill,
            step_batches=self.log.batches, prefix_queries=self.queries, prefix_hits=self.hits_tokens,
            preempted_queries=self.pre_queries, preempted_hits=self.pre_hits,
            first_budget_wait_step=self.first_budget_step, first_budget_wait_time=self.first_budget_time,
        )


def _insert(q: deque, item: tuple) -> None:
    """Keep the pending arrivals sorted by (time, stream)."""
    if not q or (q[-1][0], q[-1][1]) <= (item[0], item[1]):
        q.append(item)
        return
    items = list(q)
    items.append(item)
    items.sort(key=lambda x: (x[0], x[1]))
    q.clear()
    q.extend(items)


def _prefix_hits(pool: BlockPool | LinkedBlockPool, req: _Req, block_size: int) -> list:
    """`get_computed_blocks`: the longest run of cached full blocks from the start, at most
    ``num_tokens - 1`` tokens (the last token is always computed)."""
    lookups = (req.num_tokens - 1) // block_size
    hits = pool.longest_hit(req.keys[:lookups])  # the hash ids first, in one slice
    if len(hits) == min(lookups, len(req.keys)) < lookups:
        hits += pool.longest_hit(_key(req, k, block_size) for k in range(len(hits), lookups))
    return hits


# --------------------------------------------------------------------------- onsets over concurrency


@dataclass(frozen=True)
class Onsets:
    """The smallest level at which the event happened (None: not up to the top level)."""

    first_kv_wait: int | None
    first_preemption: int | None
    results: dict[int, SimResult]


def sweep_onsets(config: SchedulerConfig, levels: Sequence[int], load_for: Callable[[int], Load],
                 step_time: Callable[[StepBatch], float] | None = None) -> Onsets:
    """Simulate ``load_for(c)`` at each level ``c``; the first levels that wait for KV / preempt."""
    results = {c: simulate(config, load_for(c), step_time) for c in sorted(set(levels))}
    wait = next((c for c, r in results.items() if r.waited_for_kv), None)
    pre = next((c for c, r in results.items() if r.preempted), None)
    return Onsets(wait, pre, results)


def bench_levels_first_index(levels: Sequence[int], requests_per_stream: int, start: int = 0) -> dict[int, int]:
    """The first request number of each point when bench runs ``--sweep`` levels in order
    (without warm-up; with it, pass ``start`` = the warm-up's request count)."""
    out, index = {}, start
    for c in levels:
        out[c] = index
        index += c * requests_per_stream
    return out


# --------------------------------------------------------------------------- timing robustness


@dataclass(frozen=True)
class TimingVerdict:
    """What one closed-loop level does whatever the client's timing.

    The simulator's closed loop sends a stream's next request the moment its previous one ends
    (plus ``think_time``). A real client is late by a varying amount: on a busy host the API
    server and the client stall for tens to hundreds of engine steps (the CPU engine's tests saw
    a 0.25 s stall at ~3 ms a step, after which every stream's tokens came at once and the
    streams sent their next requests together, as one wave). Which requests overlap then
    depends on those delays, and an onset the simulator predicts may move by a level from run to
    run. Two things hold whatever the delays:

    - a closed loop has at most one request of each stream in the engine, so if the largest
      request of every stream fits at its peak at once (a shared prefix's full blocks counted
      once: ``worst_blocks`` <= usable), no request can ever wait for KV or be preempted;
    - the first request of every stream is sent at once at the start (a wave the engine sees
      within a step or two): if that wave alone overflows the pool (preempts, or a request waits
      for KV) no later than the step its first request ends, no later request can have arrived
      to change that, whatever the timing after.

    A level that is neither is timing-dependent: the engine may do either."""

    level: int
    worst_blocks: int
    usable_blocks: int
    first_wave_preempts: bool
    first_wave_waits: bool

    @property
    def never_waits(self) -> bool:
        return self.worst_blocks <= self.usable_blocks

    @property
    def always_waits(self) -> bool:
        return self.first_wave_waits or self.first_wave_preempts

    @property
    def always_preempts(self) -> bool:
        return self.first_wave_preempts

    @property
    def timing_dependent(self) -> bool:
        return not self.never_waits and not self.always_waits


def worst_case_blocks(config: SchedulerConfig, load: Load) -> int:
    """The most KV blocks a closed loop's requests can hold at once: the largest peak of each
    stream (``cdiv(P + M - 1, B)``), the full blocks of the shared prefix counted once."""
    if not load.streams:
        raise KvplanError("worst_case_blocks needs a closed-loop load (streams)")
    B = config.block_size
    shared_max, total = 0, 0
    for s in range(load.streams):
        worst = 0
        for k in range(load.requests_per_stream):
            prompt, output = load.lengths(load.first_index + k * load.streams + s)
            shared = (load.shared_tokens(prompt) // B) if config.prefix_caching else 0
            shared = min(shared, (prompt + output - 2) // B)  # hits stop before the last token
            shared_max = max(shared_max, shared)
            worst = max(worst, cdiv(prompt + output - 1, B) - shared)
        total += worst
    return total + shared_max


def timing_verdict(config: SchedulerConfig, load: Load, spread_steps: int = 1, max_scenarios: int = 400,
                   seed: int = 0) -> TimingVerdict:
    """`TimingVerdict` of a closed-loop ``load`` (simulated in steps: no step time): its worst
    case, and whether its first wave (request 0 of every stream) overflows the pool no later
    than the step the first of them ends, however its arrivals, in stream order, fall on the
    first ``spread_steps`` + 1 steps (bench sends them in stream order and one API server passes
    them on in order; an idle engine may start its first step on the first request alone, and a
    busy API server passes the others on steps later). Every such split is simulated when there
    are at most ``max_scenarios``; else the extreme ones (all at once, each one alone late, the
    first alone early, evenly spread, all but the last early) and seeded random ones."""
    if not load.streams:
        raise KvplanError("timing_verdict needs a closed-loop load (streams)")
    if spread_steps < 0:
        raise KvplanError("spread_steps must be >= 0")
    numbers = [load.first_index + s for s in range(load.streams)]
    preempts = waits = True
    for steps in wave_scenarios(len(numbers), spread_steps, max_scenarios, seed):
        wave = Load(lambda i: load.lengths(numbers[i]), arrivals=tuple(float(t) for t in steps),
                    shared_prefix=load.shared_prefix, shared_prefix_tokens=load.shared_prefix_tokens)
        res = simulate(config, wave)
        first_end = min(r.finish_step for r in res.requests if r.finish_step is not None)
        preempts &= res.first_preemption_step is not None and res.first_preemption_step <= first_end
        waits &= res.first_kv_wait_step is not None and res.first_kv_wait_step <= first_end
        if not (preempts or waits):
            break
    return TimingVerdict(load.streams, worst_case_blocks(config, load), config.usable_blocks, preempts, waits)


def wave_scenarios(n: int, top: int, limit: int, seed: int) -> list[list[int]]:
    """Non-decreasing lists of ``n`` arrival steps in ``0..top`` starting at 0: all of them when
    there are at most ``limit``, else the extremes and seeded random ones (``limit`` in all)."""
    if math.comb(n - 1 + top, top) <= limit:
        out: list[list[int]] = []

        def grow(prefix: list[int]) -> None:
            if len(prefix) == n:
                out.append(prefix)
                return
            for s in range(prefix[-1], top + 1):
                grow(prefix + [s])

        grow([0])
        return out
    found: dict[tuple[int, ...], None] = {}
    for d in range(top + 1):
        found[tuple([0] + [d] * (n - 1))] = None  # the first alone, the rest d steps later
        found[tuple([0] * (n - 1) + [d])] = None  # the last alone, d steps late
        found[tuple(round(i * d / max(1, n - 1)) for i in range(n))] = None  # evenly spread over d
        for k in range(1, n):  # k at once, the rest d steps later
            found[tuple([0] * k + [d] * (n - k))] = None
    rng = random.Random(f"wave:{seed}")
    while len(found) < limit:
        found[tuple([0] + sorted(rng.randint(0, top) for _ in range(n - 1)))] = None
    return [list(s) for s in found]


@dataclass(frozen=True)
class ProvenOnsets:
    """Onsets over a sweep's levels that no client timing can move (`TimingVerdict`): the KV
    wait onset is proven when every level below it can never wait and it always waits; the
    preemption onset is proven when, moreover, that level always preempts. None: no level of
    the sweep waits (proven when every level can never wait), or not proven."""

    first_kv_wait: int | None
    first_preemption: int | None
    wait_proven: bool
    preemption_proven: bool

    @property
    def proven(self) -> bool:
        return self.wait_proven and self.preemption_proven


def proven_onsets(verdicts: Mapping[int, TimingVerdict]) -> ProvenOnsets:
    """`ProvenOnsets` from each level's `TimingVerdict`."""
    for c in sorted(verdicts):
        v = verdicts[c]
        if v.never_waits:
            continue
        if v.always_preempts:
            return ProvenOnsets(c, c, True, True)
        if v.always_waits:
            return ProvenOnsets(c, None, True, False)
        return ProvenOnsets(None, None, False, False)
    return ProvenOnsets(None, None, True, True)
