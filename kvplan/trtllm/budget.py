"""TensorRT-LLM's KV budget from the GPU and the settings (PyTorch backend): the profiled peak, term by term
(docs/engines-trtllm-rules.md section 8).

TensorRT-LLM sizes its pool in two passes (`_torch/pyexecutor/py_executor_creator.py@000429d`, `_util.py@b35ac1b`
``KvCacheCreator``): a small estimation pool, a full executor (its warm-up captures the CUDA graphs), one dummy prefill
of ``max_num_tokens`` tokens, then

    peak   = torch peak + (CUDA total - free - torch allocated)      `configure_kv_cache_capacity`
    budget = (CUDA total - peak + the estimation pool) x fraction    `_cal_max_memory`

The estimation pool is allocated by the C++ manager, outside torch, so it is in the peak's non-torch part and added
back: it cancels. What is left is

    budget = fraction x (CUDA total - weights - dummy-prefill activation - CUDA context and communicators - CUDA graphs)

with ``max_tokens = int(budget) // cell (estimator)`` and ``ceil(max_tokens / tokens_per_block)`` blocks
(kvplan/trtllm/pool.py). Pass 2 rebuilds the manager with ``min(max_tokens, fraction x free now / cell (manager))``
(`resource_manager.py@b35ac1b` `calculate_max_num_blocks`); the first pass's executor and CUDA graphs are freed by
then, so "free now" is the CUDA total less the weights and the context, and the profiled figure is the smaller one
unless the two cells differ (KV heads < TP).

The terms:
- **weights**: kvplan's estimate of the checkpoint as loaded (the same as the vLLM and SGLang plans of it).
- **dummy-prefill activation**: the torch peak of one forward over ``max_num_tokens`` tokens above what was allocated
  before it. A dense model's MLP is `_torch/modules/gated_mlp.py@01503f5` ``GatedMLP.forward``: ``h1 =
  gate_up_proj(x)`` ([T, 2 x intermediate / TP]), ``h2 = swiglu(h1)`` ([T, intermediate / TP]), ``down_proj(h2)``: the
  shapes kvplan's vLLM forward term is read off (kvplan/plan/overhead.py: ``T x (3 x mlp_width + 3 x hidden) x dtype``),
  so that term is used. The LM head sees only each request's last token (`_torch/modules/logits_processor.py@89fd9b7`:
  ``hidden_states = hidden_states[last_tokens]`` unless context logits are asked for) and the dummy requests ask for
  one token each (``max_tokens=1``), so there is no sampler term. A mixture-of-experts model's MoE layer is
  TensorRT-LLM's fused MoE (CUTLASS, the default backend): its workspace, output, the layer's hidden states, router
  and shared expert, read term by term in kvplan/trtllm/moe.py; the larger of that and a dense layer's term (where
  the model has dense layers too). A multimodal model's dummy request carries its encoder's input
  (``_create_dummy_mm_context_request``, a 2025 `_util.py`, index id 843526953), not read: its activation is an
  input the user gives. ``--dummy-activation-gib`` overrides either.
- **CUDA context and communicators**: the memory a process holds before it loads anything; the same assumed range
  kvplan's SGLang pool uses (kvplan/plan/overhead.py ``STARTUP_BYTES``: 0.75 GiB, 0.4-1.5, from sglang PR #4826's log).
- **CUDA graphs**: on by default (``cuda_graph_config: Optional[CudaGraphConfig] = Field(default_factory=
  CudaGraphConfig)``, `llmapi/llm_args.py`, the mid-2025 text, index id 1090804222) and captured in the first pass's
  warm-up, before the profile, so in its non-torch memory; kvplan's
  prior for CUDA-graph memory (profiles/overhead.json ``cudagraph_gib``: 0.6 GiB, 0.25-1.5; a prior, not a TensorRT-LLM
  measurement). It also stands for the torch buffers the warm-up leaves allocated beyond the weights (0.20 GiB in
  report tr001: 63.52 GiB in torch against 63.32 GiB of weights).

Not modelled: a unified-memory GPU's host use (the OS shares the memory and counts as used), VSWA pools, speculative
decoding's draft model, a multimodal encoder's reserve (2026 commits), ``max_gpu_total_bytes`` (it acts on VSWA pools
only in 1.2.0rc2: `_util.py@b35ac1b` computes ``max_tokens`` before applying it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError
from kvplan.model.arch import Architecture
from kvplan.plan.overhead import STARTUP_BYTES, Estimate, load_overhead
from kvplan.plan.schema import MemoryTerm
from kvplan.trtllm.moe import dense_layer_bytes, moe_layer_bytes, moe_shape
from kvplan.trtllm.pool import TrtllmCell, blocks_for
from kvplan.units import cdiv

#: ``max_num_tokens`` when not given: ``BuildConfig.max_num_tokens: int = 8192`` (`tensorrt_llm/builder.py@008b2b8`),
#: the LLM API's and ``trtllm-serve``'s default; the dummy prefill's size.
DEFAULT_MAX_NUM_TOKENS = 8192
#: The largest max_num_tokens kvplan takes (a bound on hostile input, far above any GPU's one forward pass).
MAX_NUM_TOKENS_LIMIT = 1 << 24


@dataclass(frozen=True)
class TrtllmBudget:
    """The profiled budget on one GPU, each term a point estimate and a range (bytes)."""

    cuda_total: int
    fraction: float
    weights: int
    activation: Estimate
    activation_how: str
    context: Estimate
    graphs: Estimate
    estimation_pool_bytes: int  # the first pass's pool: in the peak and added back
    estimation_pool_tokens: int

    @property
    def peak(self) -> Estimate:
        """What TensorRT-LLM's "Peak memory during memory usage profiling (torch + non-torch)" would print."""
        return Estimate.exact(self.weights + self.estimation_pool_bytes) + self.activation + self.context + self.graphs

    def budget_bytes(self) -> tuple[int, int, int]:
        """``(CUDA total - peak + estimation pool) x fraction``: (point, low, high); the low end takes the high peak."""
        rest = self.cuda_total + self.estimation_pool_bytes
        peak = self.peak
        return tuple(max(0, int((rest - p) * self.fraction)) for p in (peak.bytes, peak.high, peak.low))  # type: ignore[return-value]

    def free_at_rebuild(self) -> int:
        """The free memory pass 2 sees: the first executor, its pool and its CUDA graphs are freed by then."""
        return self.cuda_total - self.weights - self.context.bytes

    def memory_terms(self) -> list[MemoryTerm]:
        point, low, high = self.budget_bytes()
        f = self.fraction
        return [
            MemoryTerm("CUDA total", self.cuda_total, self.cuda_total, self.cuda_total, +1, "cudaMemGetInfo's total"),
            MemoryTerm("weights", self.weights, self.weights, self.weights, -1,
                       "per GPU, kvplan's estimate of the checkpoint as loaded"),
            MemoryTerm("dummy prefill activation", self.activation.bytes, self.activation.low, self.activation.high,
                       -1, self.activation_how),
            MemoryTerm("CUDA context and communicators", self.context.bytes, self.context.low, self.context.high, -1,
                       "assumed 0.75 GiB, 0.4-1.5 (kvplan's SGLang prior)"),
            MemoryTerm("CUDA graphs", self.graphs.bytes, self.graphs.low, self.graphs.high, -1,
                       "kvplan's CUDA-graph prior (0.6 GiB, 0.25-1.5), captured before the profile"),
            MemoryTerm("estimation pool (in the peak, added back)", self.estimation_pool_bytes,
                       self.estimation_pool_bytes, self.estimation_pool_bytes, 0,
                       f"{self.estimation_pool_tokens:,} tokens: it cancels"),
            MemoryTerm(f"x free_gpu_memory_fraction {f:g}", point, low, high, 0,
                       "(CUDA total - peak + estimation pool) x fraction"),
        ]


def dummy_request_lengths(max_num_tokens: int, max_seq_len: int) -> list[int]:
    """The dummy prefill's requests: ``max_num_tokens`` split into requests of ``min(max_num_tokens, max_seq_len -
    1)`` tokens, the last one the remainder (`_util.py@b35ac1b` ``_create_dummy_context_requests(max(1,
    net_max_seq_len - 1))``)."""
    each = min(max_num_tokens, max(1, max_seq_len - 1))
    full, rest = divmod(max_num_tokens, each)
    return [each] * full + ([rest] if rest else [])


def estimation_pool_tokens(max_num_tokens: int, max_seq_len: int, tokens_per_block: int,
                           overlap_scheduler: bool = True) -> int:
    """The first pass's pool (`_util.py@b35ac1b` ``_get_token_num_for_estimation``, no speculation, beam 1): each
    dummy request's tokens + 1 generated (+ 1 more with the overlap scheduler, on by default), in whole blocks."""
    extra = 2 if overlap_scheduler else 1
    each = min(max_num_tokens, max(1, max_seq_len - 1))
    full, rest = divmod(max_num_tokens, each)  # dummy_request_lengths, counted without listing them
    blocks = full * cdiv(each + extra, tokens_per_block) + (cdiv(rest + extra, tokens_per_block) if rest else 0)
    return blocks * tokens_per_block


def dense_activation(arch: Architecture, tp: int, max_num_tokens: int) -> Estimate:
    """The dummy prefill's torch peak for a dense model: kvplan's forward term (kvplan/plan/overhead.py) at
    ``max_num_tokens`` tokens, no sampler (one logit row a request)."""
    return load_overhead().activation(1, arch.vocab_size, max_num_tokens, arch.hidden_size, arch.model_dtype_bytes,
                                      samples=False, mlp_width=arch.mlp_activation_width // tp)


def moe_activation(arch: Architecture, config: Mapping[str, Any], tp: int, max_num_tokens: int) -> tuple[Estimate, str]:
    """The dummy prefill's torch peak for a mixture-of-experts model (kvplan/trtllm/moe.py): the larger of an MoE
    layer's and, where the model has them, a dense layer's; and how it was priced."""
    shape = moe_shape(arch, config)
    dtype = arch.model_dtype_bytes
    moe = moe_layer_bytes(shape, max_num_tokens, tp, dtype)
    dense = dense_layer_bytes(shape, max_num_tokens, tp, dtype)
    how = (f"one forward of {max_num_tokens:,} tokens: the MoE layer's peak (fused MoE CUTLASS workspace for "
           f"{shape.top_k} of {shape.experts} experts, expert width {shape.expert_intermediate // tp:,} a rank, "
           f"hidden {shape.hidden:,}; {shape.scheme}"
           + (f"; shared experts {shape.shared_intermediate:,} wide" if shape.shared_intermediate else "") + ")"
           + (f", above a dense layer's {dense:,} B" if dense and moe >= dense else
              f"; a dense layer's (MLP width {shape.dense_intermediate // tp:,}) is larger" if dense else ""))
    return Estimate.exact(max(moe, dense)), how


def profiled_budget(arch: Architecture, cell: TrtllmCell, cuda_total: int, weights: int, tp: int, *,
                    fraction: float, tokens_per_block: int, max_num_tokens: int, max_seq_len: int,
                    activation_bytes: int | None = None, config: Mapping[str, Any] | None = None) -> TrtllmBudget:
    """TensorRT-LLM's profiled budget on one GPU. ``activation_bytes``: the dummy prefill's activation as the user
    gives it (required for a multimodal model; it overrides kvplan's for any). ``config``: the model's config.json,
    which a mixture-of-experts model's routing is read from."""
    if not 0 < fraction <= 1:
        raise KvplanError(f"invalid free_gpu_memory_fraction {fraction!r}", "give a fraction in (0, 1]")
    if not 1 <= max_num_tokens <= MAX_NUM_TOKENS_LIMIT:
        raise KvplanError(f"invalid max_num_tokens {max_num_tokens!r}",
                          f"give TensorRT-LLM's max_num_tokens, 1 to {MAX_NUM_TOKENS_LIMIT:,}")
    if activation_bytes is not None:
        activation, how = Estimate.exact(activation_bytes), "given"
    elif arch.params.towers:
        raise KvplanError(
            "kvplan does not price TensorRT-LLM's dummy prefill for a multimodal model (its profiling request carries "
            "the encoder's input: `_create_dummy_mm_context_request` in `_torch/pyexecutor/_util.py`)",
            "give the activation with --dummy-activation-gib (a start-up log prints it: 'Memory dynamically allocated "
            "during inference (inside torch)')")
    elif arch.num_experts:
        if config is None:
            raise KvplanError("kvplan prices TensorRT-LLM's MoE dummy prefill from the model's config, and none was given",
                              "give the activation with --dummy-activation-gib")
        activation, how = moe_activation(arch, config, tp, max_num_tokens)
    else:
        activation = dense_activation(arch, tp, max_num_tokens)
        how = (f"one forward of {max_num_tokens:,} tokens: T x (3 x MLP width {arch.mlp_activation_width // tp:,} + 3 x "
               f"hidden {arch.hidden_size:,}) x {arch.model_dtype_bytes} B (GatedMLP's shapes)")
    low, mid, high = STARTUP_BYTES
    graphs = load_overhead().cudagraphs()
    est_tokens = estimation_pool_tokens(max_num_tokens, max_seq_len, tokens_per_block)
    return TrtllmBudget(cuda_total=cuda_total, fraction=fraction, weights=weights, activation=activation,
                        activation_how=how, context=Estimate(mid, low, high), graphs=graphs,
                        estimation_pool_bytes=est_tokens * cell.manager_bytes, estimation_pool_tokens=est_tokens)


def pool_tokens_of(budget: TrtllmBudget, budget_bytes: int, cell: TrtllmCell, tokens_per_block: int) -> int:
    """The pool's tokens: ``max_tokens = int(budget) // cell (estimator)``, pass 2's min with ``fraction x free now /
    cell (manager)``, then whole blocks rounded up."""
    max_tokens = budget_bytes // cell.estimator_bytes
    at_rebuild = int(budget.fraction * budget.free_at_rebuild() / cell.manager_bytes)
    return blocks_for(min(max_tokens, at_rebuild), tokens_per_block) * tokens_per_block


__all__ = ["DEFAULT_MAX_NUM_TOKENS", "TrtllmBudget", "dense_activation", "dummy_request_lengths",
           "estimation_pool_tokens", "moe_activation", "pool_tokens_of", "profiled_budget"]
