"""What each request asks for: prompt and output lengths, unique token-id prompts.

Prompts are lists of token ids sent to ``/v1/completions`` (no tokenizer needed, the prompt
is exactly ``prompt_tokens`` long), or text for ``/v1/chat/completions``. Every request of a
run gets a prompt no other request shares (its tokens are drawn from a generator seeded by
the run's nonce and the request's number), so prefix caching cannot fake capacity; with
``shared_prefix`` > 0 the first ``round(shared_prefix * prompt)`` tokens are the same for all requests of
the run (and differ from every other run's).

Lengths: ``fixed`` (every request ``prompt`` + ``output``), ``uniform`` in
``[x (1 - spread), x (1 + spread)]``, ``normal`` with std ``spread * x``, ``lognormal`` with
median ``x`` and sigma ``spread``; all clipped to >= 1. A JSONL trace gives one request per
line: ``{"prompt_tokens": 512, "output_tokens": 128}`` (cycled if the run needs more).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvplan.errors import KvplanError
from kvplan.plan.simulate import draw_lengths
from kvplan.traffic.tokens import TOKEN_ID_RANGE
from kvplan.traffic.tokens import token_ids as _token_ids

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
APIS = ("completions", "chat")


_WORDS = ["time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part", "child",
    "eye", "woman", "place", "work", "week", "case", "point", "government", "company", "number", "group",
    "problem", "fact", "river", "stone", "light", "garden", "music", "paper", "window", "table"]


@dataclass(frozen=True)
class RequestSpec:
    """One request: token-id prompt (completions) or text (chat), and max_tokens."""

    index: int
    prompt_tokens: int  # asked length (exact for token ids; the server's usage counts chat)
    max_tokens: int
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 512
    output_tokens: int = 128
    distribution: str = "fixed"
    spread: float = 0.25
    shared_prefix: float = 0.0  # fraction of the prompt all requests share
    trace: tuple[tuple[int, int], ...] = ()  # (prompt, output) pairs from a JSONL trace
    api: str = "completions"
    seed: int = 0
    token_id_range: tuple[int, int] = TOKEN_ID_RANGE
    nonce: str = field(default="", compare=False)  # per run: prompts differ between runs too

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise KvplanError(f"invalid distribution {self.distribution!r}", f"use one of {', '.join(DISTRIBUTIONS)}")
        if self.api not in APIS:
            raise KvplanError(f"invalid --api {self.api!r}", "use completions or chat")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise KvplanError("prompt and output lengths must be at least 1 token")
        if not 0.0 <= self.shared_prefix < 1.0:
            raise KvplanError(f"invalid --shared-prefix {self.shared_prefix}", "use a fraction in [0, 1)")
        if self.spread < 0:
            raise KvplanError(f"invalid --spread {self.spread}", "use a number >= 0")

    @property
    def identical(self) -> bool:
        """Every request has the same lengths and nothing shared: the block rule predicts exactly."""
        return self.distribution == "fixed" and not self.trace and self.shared_prefix == 0 and self.api == "completions"

    @property
    def rule_lengths(self) -> tuple[int, int]:
        """(prompt, output) the block rule predicts with: the lengths asked, or a trace's mean ones."""
        if self.trace:
            return (round(sum(p for p, _ in self.trace) / len(self.trace)),
                    round(sum(o for _, o in self.trace) / len(self.trace)))
        return self.prompt_tokens, self.output_tokens

    def describe(self) -> str:
        if self.trace:
            return f"trace of {len(self.trace)} requests"
        text = f"prompt {self.prompt_tokens}, output {self.output_tokens}"
        if self.distribution != "fixed":
            text += f" ({self.distribution}, spread {self.spread:g})"
        if self.shared_prefix:
            text += f", shared prefix {self.shared_prefix:.0%}"
        return text + f", /v1/{'chat/completions' if self.api == 'chat' else 'completions'}"

    def lengths(self, index: int) -> tuple[int, int]:
        """(prompt, output) of request ``index`` (kvplan.plan.simulate.draw_lengths: the simulator
        replays the same draws)."""

        trace = self.trace or ()
        return draw_lengths(index, self.prompt_tokens, self.output_tokens, self.distribution, self.spread,
                            self.seed, trace)

    def request(self, index: int) -> RequestSpec:
        """The request number ``index`` of the run (unique prompt)."""
        prompt, output = self.lengths(index)
        shared = int(round(self.shared_prefix * prompt))
        lo, hi = self.token_id_range
        # The shared prefix is the run's own too (the nonce): a previous run's cached blocks never serve it.
        if self.api == "chat":
            words = _text_words(f"chat:{self.seed}:{self.nonce}:shared", shared) + [f"r{self.nonce}x{index}"]
            words += _text_words(f"chat:{self.seed}:{self.nonce}:{index}", max(0, prompt - shared - 1))
            return RequestSpec(index, prompt, output, prompt_text=" ".join(words))
        shared_ids = _token_ids(f"ids:{self.seed}:{self.nonce}:shared", shared, lo, hi)
        own_ids = _token_ids(f"ids:{self.seed}:{self.nonce}:{index}", prompt - shared, lo, hi)
        return RequestSpec(index, prompt, output, prompt_token_ids=tuple(shared_ids + own_ids))


def _text_words(key: str, n: int) -> list[str]:
    rng = random.Random(key)
    return [rng.choice(_WORDS) for _ in range(n)]
