"""What a simulation records of every step: the batch it ran (the step-time model's input), the time it ended and the
share of the pool in use then. Pure.

The steps are kept in columns, not as an object and a tuple per step: a steady decode run (`_Scheduler._decode_steps`)
is one entry, ``(requests, tokens read by its first step)``, whose step ``j`` reads ``j x requests`` more tokens; every
other step keeps its `StepBatch`. Why: a 100,000-request trace runs 1.9 million steps, and with a `StepBatch` and a
tuple held per step its simulation peaked at 1.60 GB of RSS, 1.26 GB without (benchmarks/bench_working_set.py
--simulate). Readers see the same values as before
through two sequences, `StepLog.batches` and `StepLog.kv_fill`, which make each item when it is read."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepBatch:
    """What one engine step computes: the step-time model's input. (Slots: steady runs make millions, at a third of a
    dict-backed object's memory.)"""

    prefill_tokens: int  # tokens of prompts (and recomputed tokens) in the step
    decode_seqs: int  # requests decoding one token
    kv_tokens_read: int  # context tokens attended over all scheduled requests
    num_seqs: int
    attention_pairs: int = 0  # (query, key) pairs: sum of n x (computed + (n + 1) / 2)


new_batch = object.__new__
set_prefill, set_decode, set_kv, set_seqs, set_pairs = (
    StepBatch.__dict__[name].__set__ for name in ("prefill_tokens", "decode_seqs", "kv_tokens_read", "num_seqs",
                                                   "attention_pairs"))


def decode_batch(num: int, kv: int) -> StepBatch:
    """``StepBatch(0, num, kv, num, kv)``, an equal object made in about half the time: the frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (which looks the name up) after parsing its
    arguments; this sets the slots directly, and steady steps make millions."""
    batch = new_batch(StepBatch)
    set_prefill(batch, 0)
    set_decode(batch, num)
    set_kv(batch, kv)
    set_seqs(batch, num)
    set_pairs(batch, kv)
    return batch


def decode_pricer(step_time: Callable[[StepBatch], float] | None) -> Callable[[int, int], float]:
    """The seconds of a steady decode step of ``num`` requests reading ``kv`` tokens (`decode_batch`), as ``step_time``
    prices it: through its ``decode_seconds`` when it has one (kvplan.plan.steptime.StepTimeModel: the same float, to
    the bit, with no batch made: steady runs price millions of steps), else on the batch; 1.0 a step without a model."""
    if step_time is None:
        return lambda num, kv: 1.0
    fast = getattr(step_time, "decode_seconds", None)
    if fast is not None:
        return fast
    return lambda num, kv: step_time(decode_batch(num, kv))


class StepLog:
    """Every step of one simulation, in order: ``ends[step]`` (time at its end), ``fills[step]`` (used / usable blocks
    after its scheduling) and its batch (`batch`)."""

    def __init__(self) -> None:
        self.ends = array("d")
        self.fills = array("d")
        self._starts = array("q")  # the first step of each entry of ``_parts``
        self._parts: list[StepBatch | tuple[int, int]] = []  # a step's batch, or a decode run's (requests, first kv)

    def __len__(self) -> int:
        return len(self.ends)

    def add(self, batch: StepBatch, end: float, fill: float) -> None:
        """One step."""
        self._starts.append(len(self.ends))
        self._parts.append(batch)
        self.ends.append(end)
        self.fills.append(fill)

    def add_decode_run(self, num: int, kv: int, ends: Sequence[float], fills: Sequence[float]) -> None:
        """``len(ends)`` steps of ``num`` decoding requests, the first reading ``kv`` tokens and each next one ``num``
        more (`decode_batch`)."""
        self._starts.append(len(self.ends))
        self._parts.append((num, kv))
        self.ends.extend(ends)
        self.fills.extend(fills)

    def batch(self, step: int) -> StepBatch:
        if not 0 <= step < len(self.ends):
            raise IndexError(f"step {step} of {len(self.ends)}")
        part_at = bisect_right(self._starts, step) - 1
        part = self._parts[part_at]
        if part.__class__ is tuple:
            num, kv = part  # type: ignore[misc]
            return decode_batch(num, kv + (step - self._starts[part_at]) * num)
        return part  # type: ignore[return-value]

    def iter_batches(self) -> Iterator[StepBatch]:
        starts, parts, total = self._starts, self._parts, len(self.ends)
        for at, part in enumerate(parts):
            if part.__class__ is tuple:
                num, kv = part  # type: ignore[misc]
                stop = starts[at + 1] if at + 1 < len(parts) else total
                for j in range(stop - starts[at]):
                    yield decode_batch(num, kv + j * num)
            else:
                yield part  # type: ignore[misc]

    @property
    def batches(self) -> Sequence[StepBatch]:
        return _Batches(self)

    @property
    def kv_fill(self) -> Sequence[tuple[int, float, float]]:
        """(step, time at its end, used / usable blocks), one per step."""
        return _KvFill(self)


class _StepView(Sequence):
    """A read-only sequence over a `StepLog`'s steps, equal to any sequence of equal items (a list of them too)."""

    __slots__ = ("_log",)
    __hash__ = None  # type: ignore[assignment]  (equal to lists)

    def __init__(self, log: StepLog):
        self._log = log

    def _item(self, step: int):
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._log.ends)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self._item(step) for step in range(*index.indices(len(self)))]
        step = index + len(self) if index < 0 else index
        if not 0 <= step < len(self):
            raise IndexError(f"step {index} of {len(self)}")
        return self._item(step)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"<{type(self).__name__[1:]} of {len(self):,} steps>"


class _Batches(_StepView):
    __slots__ = ()

    def _item(self, step: int) -> StepBatch:
        return self._log.batch(step)

    def __iter__(self) -> Iterator[StepBatch]:
        return self._log.iter_batches()


class _KvFill(_StepView):
    __slots__ = ()

    def _item(self, step: int) -> tuple[int, float, float]:
        return step, self._log.ends[step], self._log.fills[step]

    def __iter__(self) -> Iterator[tuple[int, float, float]]:
        return zip(range(len(self._log.ends)), self._log.ends, self._log.fills)
