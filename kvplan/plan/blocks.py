"""The engine's block rule for identical requests: when they wait, when they are preempted.

Pure. This is what `kvplan bench` predicts onsets with, from the engine's *reported* block
count. The rule is vLLM V1's scheduler (`v1/core/sched/scheduler.py`, `kv_cache_manager.py`,
`block_pool.py`; docs/vllm-accounting.md section 9), confirmed on the CPU engine:

- Block 0 is the null block: ``usable = num_blocks - 1``.
- A waiting request is admitted only if the blocks for its whole prompt are free
  (``cdiv(P, B)``; before 0.19.1 only its first prefill chunk had to fit), and only while
  fewer than ``max_num_seqs`` run.
- A running request grows one slot per generated token; the last sampled token's KV is
  never written, so it peaks at ``cdiv(P + M - 1, B)`` blocks.
- When a running request cannot grow, the last admitted one is preempted (recomputed
  later); waiting requests are never admitted in a step that preempted.

Released together, ``k = min(c, max_num_seqs, usable // admit)`` requests start; all grow in
lockstep, so they preempt iff ``k * peak > usable``. Any ``c`` with ``c * peak > usable``
makes some request wait for KV (not admitted, or preempted back to the queue).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.units import cdiv


@dataclass(frozen=True)
class BlockRule:
    """Identical requests of ``prompt`` + ``output`` tokens on a pool of ``num_blocks``."""

    num_blocks: int
    block_size: int
    prompt_tokens: int
    output_tokens: int
    max_num_seqs: int
    admit_full_prompt: bool = True
    max_num_batched_tokens: int | None = None  # the first chunk, when only it must fit

    def __post_init__(self) -> None:
        if self.num_blocks < 2 or self.block_size < 1 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise KvplanError("the block rule needs >= 2 blocks, a block size, a prompt and >= 1 output token")

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def admit_blocks(self) -> int:
        """Free blocks a waiting request needs to be admitted."""
        first = self.prompt_tokens
        if not self.admit_full_prompt and self.max_num_batched_tokens:
            first = min(first, self.max_num_batched_tokens)
        return cdiv(first, self.block_size)

    @property
    def peak_blocks(self) -> int:
        """Blocks one request holds at its last decode step."""
        return cdiv(self.prompt_tokens + self.output_tokens - 1, self.block_size)

    def admitted_together(self, concurrency: int) -> int:
        return min(concurrency, self.max_num_seqs, self.usable_blocks // self.admit_blocks)

    def preempts(self, concurrency: int) -> bool:
        return self.admitted_together(concurrency) * self.peak_blocks > self.usable_blocks

    def waits_for_kv(self, concurrency: int) -> bool:
        return min(concurrency, self.max_num_seqs) * self.peak_blocks > self.usable_blocks

    @property
    def first_kv_wait(self) -> int | None:
        """Smallest concurrency at which some request waits for KV blocks."""
        c = self.usable_blocks // self.peak_blocks + 1
        return c if c <= self.max_num_seqs else None

    @property
    def first_preemption(self) -> int | None:
        """Smallest concurrency at which running requests are preempted (None: never)."""
        k_max = min(self.max_num_seqs, self.usable_blocks // self.admit_blocks)
        if k_max * self.peak_blocks <= self.usable_blocks:
            return None
        return self.usable_blocks // self.peak_blocks + 1

    def kv_fill(self, concurrency: int) -> float:
        """Predicted peak share of usable blocks in use (vLLM's kv_cache_usage_perc)."""
        return min(1.0, min(concurrency, self.max_num_seqs) * self.peak_blocks / self.usable_blocks)

    def label(self, concurrency: int) -> str:
        """KV-limited, admission-limited (max_num_seqs) or neither."""
        return load_label(self.waits_for_kv(concurrency), concurrency, self.max_num_seqs)


def load_label(waits_for_kv: bool, concurrency: int, max_num_seqs: int, waits_for_budget: bool = False) -> str:
    """What holds a closed-loop load back: "KV-limited" (it waits for blocks), "budget-limited" (a request waits for
    the token budget, max_num_batched_tokens, and none for blocks: the hybrid simulator's, kvplan.plan.hybrid_rule),
    "admission-limited" (more streams than max_num_seqs) or "neither"; one rule for the one-group block rule and
    the hybrid simulator's."""
    if waits_for_kv:
        return "KV-limited"
    if waits_for_budget:
        return "budget-limited"
    if concurrency > max_num_seqs:
        return "admission-limited"
    return "neither"
