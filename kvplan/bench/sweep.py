"""Which concurrencies to run: predicted onset -> bracket -> bisect. Pure (the point runner is passed in).

The prediction is the planner's BlockRule (kvplan/plan/blocks.py) applied to the block count
the *engine* reports and the workload's lengths; the sweep does not re-derive it. Two onsets
are searched, each the smallest concurrency where an event is measured:

- **first KV wait**: some request waits for KV blocks (see ``PointOutcome.waited_for_kv``);
- **first preemption**: ``vllm:num_preemptions_total`` grew during the point.

Both events are assumed monotonic in concurrency (more streams never relieve KV pressure), so
once a point with the event and one below it without are found, bisection finds the boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.plan.blocks import BlockRule
from kvplan.units import cdiv
from kvplan.vllm.rules import rules_for

UNLIMITED_SEQS = 1 << 30  # max_num_seqs when it is not known: the rule then ignores it


@dataclass(frozen=True)
class PointOutcome:
    """The two measured events of one point."""

    concurrency: int
    waited_for_kv: bool
    preempted: bool
    failed: bool = False


def waited_for_kv(concurrency: int, max_num_seqs: int | None, peak_waiting: float | None,
                  preemptions: float | None) -> bool:
    """Did some request wait for KV blocks during the point?

    - any preemption: the victim goes back to the waiting queue (scheduler.py, 9.4 of
      docs/vllm-accounting.md), so it waited for KV;
    - or more requests waited than ``max_num_seqs`` alone explains: with ``c`` streams and at
      most ``max_num_seqs`` running, ``c - max_num_seqs`` wait for admission, any more for KV.
      vLLM's gauge counts a request as waiting only when the scheduler did not admit it in the
      step that just ran (stats are made after scheduling), so a short-lived new arrival does
      not count. Requests can also wait for the token budget (``max_num_batched_tokens``) when
      ``c x prompt`` exceeds it, or when Mamba's block-aligned split rounds a waiting request's chunk down to
      no block; the gauge counts them alike. Where the hybrid simulator predicts such waits and no KV wait,
      kvplan.bench.point.budget_wait tells them apart.
    """
    if preemptions:
        return True
    if peak_waiting is None:
        return False
    admission_waits = max(0, concurrency - (max_num_seqs or UNLIMITED_SEQS))
    return peak_waiting > admission_waits


def measured_label(outcome: PointOutcome, max_num_seqs: int | None, waited_for_budget: bool = False) -> str:
    """What held the point back: KV-limited, budget-limited (its waits were for the token budget:
    kvplan.bench.point.budget_wait), admission-limited (max_num_seqs), neither, or failed."""
    if outcome.failed:
        return "failed"
    if outcome.waited_for_kv:
        return "KV-limited"
    if waited_for_budget:
        return "budget-limited"
    if max_num_seqs is not None and outcome.concurrency > max_num_seqs:
        return "admission-limited"
    return "neither"


def block_rule(num_blocks: int, block_size: int, prompt_tokens: int, output_tokens: int,
               max_num_seqs: int | None, vllm_version: str | None = None) -> BlockRule:
    """The planner's rule on the engine's reported pool, by the engine's release (the newest
    known when it did not say): from 0.19 the whole prompt must fit to be admitted."""

    try:
        rules = rules_for(vllm_version)
    except KvplanError:
        rules = rules_for(None)
    return BlockRule(
        admit_full_prompt=rules.admit_full_prompt,
        num_blocks=num_blocks,
        block_size=block_size,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        max_num_seqs=max_num_seqs or UNLIMITED_SEQS,
    )


def default_max_concurrency(rule: BlockRule | None) -> int:
    """Upper end of an automatic sweep: twice the predicted KV-wait onset (at least 8)."""
    if rule is None:
        return 64
    onset = rule.first_kv_wait or (rule.usable_blocks // rule.admit_blocks + 1)
    return max(8, 2 * onset)


def fallback_guess(num_blocks: int | None, block_size: int | None, prompt: int, output: int) -> int:
    if not num_blocks or not block_size:
        return 8
    return max(1, (num_blocks - 1) // cdiv(prompt + output - 1, block_size) + 1)


@dataclass(frozen=True)
class Onset:
    """The smallest concurrency with the event, or None if none up to ``searched_up_to``."""

    first: int | None
    searched_up_to: int
    exact: bool  # the level just below ``first`` was measured without the event


class Sweep:
    """Run points on demand (each concurrency at most once) and search the onsets."""

    def __init__(self, run_point: Callable[[int], PointOutcome], max_concurrency: int,
                 known: dict[int, PointOutcome] | None = None):
        if max_concurrency < 1:
            raise KvplanError("the sweep needs a maximum concurrency >= 1")
        self.run_point = run_point
        self.max_concurrency = max_concurrency
        self.results: dict[int, PointOutcome] = dict(known or {})

    def measure(self, concurrency: int) -> PointOutcome:
        if concurrency not in self.results:
            outcome = self.run_point(concurrency)
            self.results[concurrency] = outcome
            if outcome.failed:
                raise SweepStopped(concurrency)
        return self.results[concurrency]

    def levels(self, levels: list[int]) -> None:
        for c in levels:
            self.measure(c)

    def find(self, event: Callable[[PointOutcome], bool], guess: int) -> Onset:
        """Bracket around ``guess`` (steps 1, 2, 4, ... away from it), then bisect.

        Level 0 counts as a level without the event, so an event already at 1 ends at 1.
        """
        top = self.max_concurrency
        guess = min(max(guess, 1), top)
        step = 1
        if event(self.measure(guess)):
            hi = guess
            while True:
                lo = max(0, hi - step)
                if lo == 0 or not event(self.measure(lo)):
                    break
                hi, step = lo, step * 2
        else:
            lo = guess
            while True:
                hi = min(top, lo + step)
                if hi == lo:
                    return Onset(None, top, exact=True)
                if event(self.measure(hi)):
                    break
                lo, step = hi, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if event(self.measure(mid)):
                hi = mid
            else:
                lo = mid
        return Onset(hi, top, exact=True)


class SweepStopped(Exception):
    """A point failed: the sweep stops there (its finished points are kept)."""

    def __init__(self, concurrency: int):
        super().__init__(concurrency)
        self.concurrency = concurrency


def parse_levels(text: str) -> list[int] | None:
    """``--sweep 1,2,4,8`` -> [1, 2, 4, 8]; ``auto`` -> None."""
    if text.strip().lower() == "auto":
        return None
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise KvplanError(f"invalid --sweep {text!r}", "use auto or a list of concurrencies such as 1,2,4,8") from None
    if not levels or levels[0] < 1:
        raise KvplanError(f"invalid --sweep {text!r}", "concurrencies must be whole numbers >= 1")
    return levels


def first_with(results: dict[int, PointOutcome], event: Callable[[PointOutcome], bool]) -> Onset:
    """Onset from a fixed list of levels: the lowest level with the event."""
    ok = sorted(c for c, r in results.items() if not r.failed)
    for i, c in enumerate(ok):
        if event(results[c]):
            exact = c == 1 or (i > 0 and ok[i - 1] == c - 1)
            return Onset(c, ok[-1], exact)
    return Onset(None, ok[-1] if ok else 0, exact=True)


# ---------------------------------------------------------------- the highest rate holding the SLOs


@dataclass(frozen=True)
class RateSearch:
    """What ``search_rate`` found. The SLO threshold lies in ``[highest_met, first_missed)``."""

    highest_met: float | None  # the highest rate measured meeting the SLOs (None: none did)
    first_missed: float | None  # the lowest rate measured missing them (None: none did, up to the ceiling)
    measured: tuple[tuple[float, bool], ...]  # (rate, met) in the order measured (points known before included)
    stopped: str  # "resolved", "max points", "met up to the ceiling", "missed down to the floor"
    resolution: float

    @property
    def resolved(self) -> bool:
        return self.stopped == "resolved"


class _Budget(Exception):
    pass


def _round_rate(rate: float) -> float:
    """Four significant digits: rates people can read (2.828 rather than 2.8284271247461903)."""
    return float(f"{rate:.4g}")


def search_rate(meets: Callable[[float], bool], start: float = 1.0, resolution: float = 0.1, max_points: int = 12,
                known: dict[float, bool] | None = None, floor: float = 0.001, ceiling: float = 1e6) -> RateSearch:
    """The highest request rate meeting the SLOs, assuming a rate that misses them is never followed by a
    higher one that meets them (monotonic, as queueing makes it).

    Measure ``start``; if it meets the SLOs double the rate until one misses them, else halve it until
    one meets them (the bracket); then bisect between the highest rate met and the lowest missed until
    ``(first_missed - highest_met) / highest_met <= resolution``. At most ``max_points`` rates are measured
    (``known`` ones, e.g. a resumed run's, count and are not measured again); the search never goes
    below ``floor`` or above ``ceiling``. ``meets(rate)`` runs one point; what it raises ends the search.
    Pure: the point runner is passed in."""
    if not start > 0 or not 0 < resolution < 1 or max_points < 1 or not 0 < floor <= start <= ceiling:
        raise KvplanError("invalid rate search settings",
                          "a start rate above 0, a resolution between 0 and 1, at least one point")
    results: dict[float, bool] = {}
    order: list[tuple[float, bool]] = []
    known = dict(known or {})

    def measure(rate: float) -> bool:
        if rate in results:
            return results[rate]
        if len(results) >= max_points:
            raise _Budget
        met = known[rate] if rate in known else bool(meets(rate))
        results[rate] = met
        order.append((rate, met))
        return met

    lo: float | None = None
    hi: float | None = None
    stopped = "resolved"
    try:
        rate = _round_rate(start)
        if measure(rate):
            lo = rate
            while hi is None:
                nxt = _round_rate(lo * 2)
                if nxt > ceiling:
                    stopped = "met up to the ceiling"
                    break
                if measure(nxt):
                    lo = nxt
                else:
                    hi = nxt
        else:
            hi = rate
            while lo is None:
                nxt = _round_rate(hi / 2)
                if nxt < floor:
                    stopped = "missed down to the floor"
                    break
                if measure(nxt):
                    lo = nxt
                else:
                    hi = nxt
        while lo is not None and hi is not None and (hi - lo) / lo > resolution:
            mid = _round_rate((lo + hi) / 2)
            if not lo < mid < hi:
                break  # the rounding cannot split the bracket further
            if measure(mid):
                lo = mid
            else:
                hi = mid
    except _Budget:
        stopped = "max points"
    return RateSearch(lo, hi, tuple(order), stopped, resolution)


def parse_sweep_rate(text: str) -> str | list[float]:
    """``--sweep-rate auto`` -> "auto"; ``1,2,4`` -> [1.0, 2.0, 4.0] (sorted, unique)."""
    import math

    if text.strip().lower() == "auto":
        return "auto"
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise KvplanError(f"invalid --sweep-rate {text!r:.80}", "use auto, or rates in requests/s: 1,2,4,8") from None
    if not values or any(not math.isfinite(v) or v <= 0 or v > 1e6 for v in values):
        raise KvplanError("invalid request rate", "rates are requests per second, above 0: 0.5, 2, 8")
    return sorted(set(values))
