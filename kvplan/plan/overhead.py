"""The non-KV memory vLLM's profile run finds: activation peak, non-torch memory, CUDA graphs.

Model (per device), from how vLLM profiles (`v1/worker/gpu_model_runner.py::profile_run`):
the dummy forward of ``max_num_batched_tokens`` tokens is followed by a dummy sampler run
over ``max_num_seqs`` rows of full-vocabulary logits (fp32 logits, their softmax, sorted
copies and indices for top-k/top-p). The forward pass's intermediates are freed before the
sampler runs, so the peak is the sampler's working set plus the retained hidden states:

    activation = sampler_bytes_per_logit * max_num_seqs * vocab_size
                 + max_num_batched_tokens * hidden_size * dtype_bytes

``non_torch`` (NCCL, cuBLAS workspaces, the CUDA context's growth) depends on whether ranks
talk to each other, so it has one value for TP = 1 and one for TP > 1. The coefficients
are fitted, by `kvplan.validate.fit`, on the public start-up reports only; the fit and its
residuals are stored in ``profiles/overhead.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.units import GiB

OVERHEAD_FILE = Path(__file__).resolve().parent.parent.parent / "profiles" / "overhead.json"


@dataclass(frozen=True)
class Estimate:
    """A memory term as a point estimate and a range."""

    bytes: int
    low: int
    high: int

    @staticmethod
    def exact(value: int) -> Estimate:
        return Estimate(value, value, value)

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.bytes + other.bytes, self.low + other.low, self.high + other.high)


@dataclass(frozen=True)
class OverheadModel:
    """Fitted coefficients of the overhead model, with their provenance."""

    sampler_bytes_per_logit: float
    sampler_relative_spread: float  # the range printed around the activation estimate
    non_torch_bytes_single: int
    non_torch_bytes_multi: int
    non_torch_spread_bytes: int
    cudagraph_bytes: tuple[int, int, int]  # low, typical, high (subtracted from vLLM 0.20)
    source: str

    def activation(self, max_num_seqs: int, vocab_size: int, max_num_batched_tokens: int,
                   hidden_size: int, dtype_bytes: int, samples: bool = True) -> Estimate:
        """The profile run's torch peak increase on one device."""
        hidden = max_num_batched_tokens * hidden_size * dtype_bytes
        if not samples:  # a pipeline stage before the last runs no sampler
            return Estimate.exact(hidden)
        sampler = self.sampler_bytes_per_logit * max_num_seqs * vocab_size
        spread = self.sampler_relative_spread * sampler
        return Estimate(int(sampler + hidden), int(sampler - spread + hidden), int(sampler + spread + hidden))

    def non_torch(self, world_size: int) -> Estimate:
        mid = self.non_torch_bytes_single if world_size == 1 else self.non_torch_bytes_multi
        return Estimate(mid, max(0, mid - self.non_torch_spread_bytes), mid + self.non_torch_spread_bytes)

    def cudagraphs(self) -> Estimate:
        low, mid, high = self.cudagraph_bytes
        return Estimate(mid, low, high)


@lru_cache(maxsize=4)
def load_overhead(path: str | None = None) -> OverheadModel:
    file = Path(path) if path else OVERHEAD_FILE
    try:
        data = json.loads(file.read_text())
        return OverheadModel(
            sampler_bytes_per_logit=float(data["sampler_bytes_per_logit"]),
            sampler_relative_spread=float(data["sampler_relative_spread"]),
            non_torch_bytes_single=int(data["non_torch_gib_single"] * GiB),
            non_torch_bytes_multi=int(data["non_torch_gib_multi"] * GiB),
            non_torch_spread_bytes=int(data["non_torch_spread_gib"] * GiB),
            cudagraph_bytes=tuple(int(x * GiB) for x in data["cudagraph_gib"]),  # type: ignore[arg-type]
            source=str(data.get("source", file.name)),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KvplanError(f"cannot read the overhead model {file}: {exc}") from None
