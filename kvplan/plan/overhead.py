"""The non-KV memory vLLM's profile run finds: activation peak, non-torch memory, CUDA graphs.

Model (per device), from how vLLM profiles (`v1/worker/gpu_model_runner.py::profile_run`,
docs/vllm-accounting.md section 8): the dummy forward of ``max_num_batched_tokens`` (MNBT)
tokens split over ``R = min(MNBT, max_num_seqs)`` requests keeps the last hidden state of each
request and the whole ``[MNBT, hidden]`` output; the forward's intermediates are freed before
``_dummy_sampler_run`` turns the ``R`` last states into ``[R, vocab]`` logits and samples with
top-k/top-p (fp32 logits, their softmax, sorted copies and indices). The peak is the sampler's
working set plus the retained hidden states, unless the forward pass itself peaks higher:

    sampler    = sampler_bytes_per_logit * R * vocab_size + MNBT * hidden_size * dtype_bytes
    forward    = MNBT * (3 * mlp_width + 3 * hidden_size) * dtype_bytes
    activation = max(sampler, forward)

Multimodal models first push one item of the processor's largest size through their encoder
(kvplan/model/encoders.py); the peak is then the larger of the encoder's own peak and the
activation above on top of what the encoder pass leaves allocated.

The forward term is read off the model code, not fitted: an MLP turns ``[T, hidden]`` into
``[T, 2 * intermediate]`` (gate_up_proj), then ``[T, intermediate]`` (SiluAndMul), next to the
residual, normed and output hidden states (`model_executor/models/llama.py::LlamaMLP`; fused
MoE's caches are ``[T * top_k, 2N]`` and ``[T * top_k, N]``). It dominates where the sampler
is small: the V0 engine profiled ``max_model_len`` tokens at once (Llama-3.1-8B at 20,000
tokens: 20,000 x (3 x 14,336 + 3 x 4,096) x 2 B = 2.06 GiB; the log measured 2.07 GiB).

``non_torch`` (NCCL, cuBLAS workspaces, the CUDA context's growth) depends on whether ranks
talk to each other, so it has one value for TP = 1 and one for TP > 1. CUDA graphs are
subtracted only from vLLM 0.20 (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``).

The coefficients are fitted by `kvplan.validate.fit` on the public start-up reports only
(``kvplan validate --fit``); ``profiles/overhead.json`` stores them with the fit's residuals
and provenance. Ranges: the activation range is the envelope of the fitted reports' ratios
of measured to modelled sampler memory; the non-torch range is the largest deviation of a
fitted report from its group's value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.paths import PROFILES_DIR
from kvplan.units import GiB

#: Memory an engine's process holds before its weights load (CUDA context, NCCL), which SGLang's free memory P and
#: TensorRT-LLM's profiled peak leave out or count apart. One public log (sglang PR #4826, "Load weight end ...
#: avail mem=131.08 GB, mem usage=8.13 GB" on a ~140 GiB card, so 139.21 GiB free before loading against an H200's
#: ~139.96 GiB total) shows ~0.75 GiB; the range is an assumption.
STARTUP_BYTES = (round(0.4 * GiB), round(0.75 * GiB), round(1.5 * GiB))  # low, estimate, high

OVERHEAD_FILE = PROFILES_DIR / "overhead.json"


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
    # The activation range: sampler memory between (1 - low) and (1 + high) times the estimate.
    sampler_spread_low: float
    sampler_spread_high: float
    non_torch_bytes_single: int
    non_torch_bytes_multi: int
    non_torch_spread_bytes: int
    cudagraph_bytes: tuple[int, int, int]  # low, typical, high (subtracted from vLLM 0.20)
    source: str
    calibration: str | None = None  # set when a user calibration shifted non_torch

    @property
    def sampler_relative_spread(self) -> float:
        """The wider side of the activation range (kept for callers that want one number)."""
        return max(self.sampler_spread_low, self.sampler_spread_high)

    @staticmethod
    def sampler_logits(max_num_seqs: int, max_num_batched_tokens: int, vocab_size: int) -> int:
        """``[R, vocab]`` logits of the dummy sampler run, R = min(MNBT, max_num_seqs)."""
        return min(max_num_seqs, max_num_batched_tokens) * vocab_size

    def activation(self, max_num_seqs: int, vocab_size: int, max_num_batched_tokens: int,
                   hidden_size: int, dtype_bytes: int, samples: bool = True, mlp_width: int = 0,
                   encoder_peak: int = 0, encoder_retained: int = 0) -> Estimate:
        """The profile run's torch peak increase on one device. ``max_num_seqs`` is the number
        of rows the sampler sees (callers pass min(max_num_seqs, MNBT)); ``mlp_width`` the
        per-rank, per-token MLP intermediate width. A multimodal encoder pass runs first
        (kvplan.model.encoders): its own peak ``encoder_peak``, and ``encoder_retained`` bytes it
        leaves allocated under the text dummy run and the sampler run."""
        hidden = max_num_batched_tokens * hidden_size * dtype_bytes
        forward = max_num_batched_tokens * (3 * mlp_width + 3 * hidden_size) * dtype_bytes if mlp_width else 0

        def peak(text: float) -> int:
            return int(max(encoder_peak, encoder_retained + text))

        if not samples:  # a pipeline stage before the last runs no sampler
            return Estimate.exact(peak(max(hidden, forward)))
        sampler = self.sampler_bytes_per_logit * max_num_seqs * vocab_size
        return Estimate(
            peak(max(sampler + hidden, forward)),
            peak(max(sampler * (1 - self.sampler_spread_low) + hidden, forward)),
            peak(max(sampler * (1 + self.sampler_spread_high) + hidden, forward)),
        )

    def non_torch(self, world_size: int) -> Estimate:
        mid = self.non_torch_bytes_single if world_size == 1 else self.non_torch_bytes_multi
        return Estimate(mid, max(0, mid - self.non_torch_spread_bytes), mid + self.non_torch_spread_bytes)

    def cudagraphs(self) -> Estimate:
        low, mid, high = self.cudagraph_bytes
        return Estimate(mid, low, high)

    def calibrated(self, offset_bytes: int, label: str) -> OverheadModel:
        """This model shifted by a measured residual (a user calibration): the difference
        between what a real start-up measured and what this model predicted for it."""
        return replace(
            self,
            non_torch_bytes_single=self.non_torch_bytes_single + offset_bytes,
            non_torch_bytes_multi=self.non_torch_bytes_multi + offset_bytes,
            calibration=label,
        )


def overhead_from_dict(data: dict, source: str) -> OverheadModel:
    """The model from ``profiles/overhead.json``'s fields (see `kvplan.validate.fit`)."""
    low, high = data["sampler_spread"]
    return OverheadModel(
        sampler_bytes_per_logit=float(data["sampler_bytes_per_logit"]),
        sampler_spread_low=float(low),
        sampler_spread_high=float(high),
        non_torch_bytes_single=int(data["non_torch_gib_single"] * GiB),
        non_torch_bytes_multi=int(data["non_torch_gib_multi"] * GiB),
        non_torch_spread_bytes=int(data["non_torch_spread_gib"] * GiB),
        cudagraph_bytes=tuple(int(x * GiB) for x in data["cudagraph_gib"]),  # type: ignore[arg-type]
        source=str(data.get("source", source)),
    )


@lru_cache(maxsize=4)
def load_overhead(path: str | None = None) -> OverheadModel:
    file = Path(path) if path else OVERHEAD_FILE
    try:
        return overhead_from_dict(json.loads(file.read_text()), file.name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KvplanError(f"cannot read the overhead model {file}: {exc}") from None
