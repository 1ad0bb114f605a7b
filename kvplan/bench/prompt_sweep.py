"""`kvplan bench --prompt-sweep COUNT[:MAX_TOKENS]`: one stream sends prompts of COUNT lengths spread over the
engine's context, two output tokens each (`SWEEP_OUTPUT_TOKENS`), and records each request's TTFT and the gap to its
second token (a decode step of one sequence over the prompt) in RUN/prompt_sweep.json, which `kvplan calibrate --bench
RUN` fits beside the run's points.

Why: at one stream the engine is idle when a request comes, so TTFT is the time outside the steps plus the
prefill of its prompt, a line in the prompt length; a workload's own prompts span too few lengths to price a
prompt token (a 64-token lognormal workload: 54-75 tokens between its halves' medians; three 64 + 64 calibrations
on the CPU engine charged 0.046-0.202 ms a token where the engine's 1-stream requests show 0.108-0.136). A sweep
over the context pins that price, which prefill-heavy and decode-heavy predictions lean on. Its decode steps, over
contexts the workload's never reach, price reading a token's KV, which a short workload cannot tell from a step's
fixed cost (two 64 + 64 calibrations on the CPU engine: one charged 7.40 ms a step and nothing for the KV read).

Each length is sent twice in a row and the second one recorded: a CPU engine's first run of a new batch shape
was ~25% slower (kernels set up for it), a cost a long-running server has long paid. Prompts are the run's own
token ids (its nonce), so no prefix-cache hit shortens one.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvplan.bench import store as st
from kvplan.bench.workload import RequestSpec
from kvplan.errors import KvplanError
from kvplan.paths import load_user_json
from kvplan.traffic.tokens import token_ids

PROMPT_SWEEP_FILE = "prompt_sweep.json"
#: Output tokens a sweep request asks for: its TTFT is the first; with one, the only chunk also carries the finish
#: reason, and a token that detokenizes to no text (a byte of a UTF-8 character: the CPU engine's dummy-weight model
#: on 2026-12-05) left the client no token to time. The second costs one decode step after the TTFT.
SWEEP_OUTPUT_TOKENS = 2
#: Lengths a sweep may ask for at most (each is two requests at one stream).
MAX_SWEEP_LENGTHS = 256
#: Requests a stored sweep may hold (a crafted file is refused, not read whole into a fit).
MAX_SWEEP_REQUESTS = 10_000


class SweepRequest(BaseModel):
    """One request of the sweep: its prompt, its TTFT (seconds) as the client measured it, and the gap to its second
    token (one decode step of one sequence over the prompt; None: not recorded, a sweep from before 2026-12-06)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(ge=1)
    ttft_s: float = Field(gt=0, allow_inf_nan=False)
    itl_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class PromptSweep(BaseModel):
    """RUN/prompt_sweep.json: the sweep's requests, the lengths asked, and how each was sent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1
    max_tokens: int = Field(ge=1)  # output tokens each request asked for
    lengths: list[int]  # prompt lengths asked, ascending
    requests: list[SweepRequest] = Field(max_length=MAX_SWEEP_REQUESTS)
    note: str = "one stream, an idle engine; each length sent twice, the second recorded"

    def points(self) -> list[tuple[int, float]]:
        """(prompt tokens, TTFT s) of every recorded request."""
        return [(r.prompt_tokens, r.ttft_s) for r in self.requests]

    def decode_steps(self) -> list[tuple[int, float]]:
        """(prompt tokens, s) of the decode step after each recorded request's first token, where recorded."""
        return [(r.prompt_tokens, r.itl_s) for r in self.requests if r.itl_s is not None]


def parse_prompt_sweep(text: str, max_model_len: int | None) -> tuple[int, int]:
    """'16' or '16:480' -> (COUNT lengths, MAX_TOKENS the longest); MAX_TOKENS defaults to the engine's
    max_model_len less the output tokens (a request may not exceed it)."""
    count_text, _, max_text = text.partition(":")
    try:
        count = int(count_text)
        longest = int(max_text) if max_text else (max_model_len - SWEEP_OUTPUT_TOKENS if max_model_len else 0)
    except ValueError:
        raise KvplanError(f"invalid --prompt-sweep {text!r}", "use COUNT or COUNT:MAX_TOKENS, e.g. 16 or 16:4000") from None
    if not 2 <= count <= MAX_SWEEP_LENGTHS:
        raise KvplanError(f"invalid --prompt-sweep {text!r}: COUNT must be 2 to {MAX_SWEEP_LENGTHS}")
    if not max_text and not max_model_len:
        raise KvplanError("--prompt-sweep COUNT needs the engine's --max-model-len to spread its lengths over",
                          "give the longest prompt: --prompt-sweep COUNT:MAX_TOKENS")
    if longest < count:
        raise KvplanError(f"invalid --prompt-sweep {text!r}: MAX_TOKENS must be at least COUNT")
    if max_model_len and longest + SWEEP_OUTPUT_TOKENS > max_model_len:
        raise KvplanError(f"--prompt-sweep {text!r}: a {longest}-token prompt and its {SWEEP_OUTPUT_TOKENS} output tokens "
                          f"exceed the engine's max_model_len {max_model_len}",
                          f"use MAX_TOKENS <= {max_model_len - SWEEP_OUTPUT_TOKENS}")
    return count, longest


def sweep_lengths(count: int, longest: int) -> list[int]:
    """``count`` prompt lengths evenly spaced up to ``longest``: longest x k / count for k = 1..count."""
    return sorted({max(1, round(longest * k / count)) for k in range(1, count + 1)})


def sweep_specs(lengths: list[int], nonce: str, id_range: tuple[int, int], first_index: int) -> list[RequestSpec]:
    """The sweep's requests in order: each length twice (request numbers from ``first_index``), SWEEP_OUTPUT_TOKENS
    output tokens."""
    lo, hi = id_range
    specs = []
    for k, n in enumerate(x for x in lengths for _ in range(2)):
        index = first_index + k
        ids = tuple(token_ids(f"sweep:{nonce}:{index}", n, lo, hi))
        specs.append(RequestSpec(index, n, SWEEP_OUTPUT_TOKENS, prompt_token_ids=ids))
    return specs


def sweep_from_records(lengths: list[int], specs: list[RequestSpec], records) -> PromptSweep:
    """The sweep of ``records`` (kvplan.bench.loadgen.RequestRecord of ``specs``, from `sweep_specs`): the second
    request of each length (odd positions), when it finished."""
    second = {s.index: s.prompt_tokens for k, s in enumerate(specs) if k % 2 == 1}
    kept = sorted((r for r in records if r.index in second and r.ok and r.ttft_s is not None and r.ttft_s > 0),
                  key=lambda r: r.index)
    return PromptSweep(max_tokens=SWEEP_OUTPUT_TOKENS, lengths=lengths,
                       requests=[SweepRequest(prompt_tokens=second[r.index], ttft_s=r.ttft_s, itl_s=_decode_step(r))
                                 for r in kept])


def _decode_step(record) -> float | None:
    """The gap from a request's first token to its second (None without one: a single delivery, or a gap of 0)."""
    gaps = record.itl_s
    return gaps[0] if gaps and gaps[0] > 0 and math.isfinite(gaps[0]) else None


def write_prompt_sweep(store: st.RunStore, sweep: PromptSweep) -> Path:
    """RUN/prompt_sweep.json, by the run folder's atomic writer (never through a link, secrets masked)."""
    return store.write_text(PROMPT_SWEEP_FILE, sweep.model_dump_json(indent=2) + "\n")


def read_prompt_sweep(run_dir: Path) -> PromptSweep | None:
    """RUN/prompt_sweep.json, or None when the run has none; a malformed file is one clear error."""
    file = run_dir / PROMPT_SWEEP_FILE
    if not file.is_file():
        return None
    data = load_user_json(file, "prompt sweep")
    try:
        return PromptSweep.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the file"
        raise KvplanError(f"{file}: {where}: {first.get('msg', 'invalid')}",
                          "run kvplan bench --prompt-sweep again, or remove the file") from None
