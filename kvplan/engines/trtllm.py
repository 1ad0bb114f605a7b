"""TensorRT-LLM (PyTorch backend) behind the engine door: its pool from the GPU and the settings.

The budget is ``free_gpu_memory_fraction`` of what the profiling pass leaves (kvplan/trtllm/budget.py: the CUDA total
less the weights, the dummy prefill's activation, the CUDA context and the CUDA graphs); the pool is that budget in
blocks of ``tokens_per_block`` (kvplan/trtllm/pool.py). The weights per GPU are kvplan's estimate of the checkpoint as
loaded, the same the vLLM plan of the same deployment prices, so two engines' pools differ only by their own rules.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from kvplan.deploy import ResolvedModel, plan_deployment
from kvplan.engines.base import EngineCapacity, EngineOptions, EnginePool, engine
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection
from kvplan.plan.schema import Settings
from kvplan.trtllm.budget import DEFAULT_MAX_NUM_TOKENS, TrtllmBudget, pool_tokens_of, profiled_budget
from kvplan.trtllm.pool import TrtllmCell, cell_of, pool_gib
from kvplan.trtllm.rules import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_TOKENS_PER_BLOCK,
    READ_RELEASES,
    parse_version,
)
from kvplan.trtllm.startup_log import parse_trtllm_log
from kvplan.units import GiB, cdiv, format_share

_OWN = ("free_gpu_memory_fraction", "tokens_per_block", "max_num_tokens", "dummy_activation_bytes")


@engine
class Trtllm:
    name = "trtllm"
    label = "TensorRT-LLM"
    known_versions = READ_RELEASES
    newest_known = READ_RELEASES[-1]
    own_options = _OWN

    def size(self, model: ResolvedModel, gpus: GpuSelection, settings: Settings, version: str | None,
             options: EngineOptions = EngineOptions()) -> EnginePool:
        if options.given(*_OWN):
            raise KvplanError(f"{', '.join(options.given(*_OWN))} is not a TensorRT-LLM flag",
                              "TensorRT-LLM's are --free-gpu-memory-fraction, --tokens-per-block, --max-num-tokens "
                              "and --dummy-activation-gib")
        if version is not None and parse_version(version) < (1, 0, 0):
            raise KvplanError(f"kvplan has no TensorRT-LLM budget rules for {version}",
                              "its PyTorch backend's profiling was read from 1.0 on (1.1.0rc3, 1.2.0rc2, 2026 "
                              "commits); give --engine-version 1.0 or later")
        if options.tokens_per_block is not None and not 1 <= options.tokens_per_block <= 1024:
            raise KvplanError(f"invalid --tokens-per-block {options.tokens_per_block!r}", "give 1 to 1024 tokens")
        plan = plan_deployment(model, gpus, settings, None, suggest=False)  # the split, shared with vLLM's plan
        if plan.pipeline_parallel_size > 1 or plan.replicas > 1:
            raise KvplanError("kvplan sizes TensorRT-LLM at tensor parallel only", "give --tp equal to the GPUs")
        tp = plan.tensor_parallel_size
        cell = cell_of(model.arch, tp, None if settings.kv_cache_dtype == "auto" else settings.kv_cache_dtype)
        fraction = (options.free_gpu_memory_fraction if options.free_gpu_memory_fraction is not None
                    else DEFAULT_FREE_GPU_MEMORY_FRACTION)
        tpb = options.tokens_per_block if options.tokens_per_block is not None else DEFAULT_TOKENS_PER_BLOCK
        max_num_tokens = options.max_num_tokens if options.max_num_tokens is not None else DEFAULT_MAX_NUM_TOKENS
        # max_seq_len: the given one, else inferred from the config (the log's "using inferred value")
        max_seq_len = settings.max_model_len or model.arch.max_position_embeddings or max_num_tokens + 1
        budget = profiled_budget(model.arch, cell, gpus.device.cuda_total_bytes, plan.weights_bytes, tp,
                                 fraction=fraction, tokens_per_block=tpb, max_num_tokens=max_num_tokens,
                                 max_seq_len=max_seq_len, activation_bytes=options.dummy_activation_bytes,
                                 config=model.config.config)
        point, low, high = budget.budget_bytes()
        tokens = pool_tokens_of(budget, point, cell, tpb)
        per_request = cdiv(plan.request_tokens, tpb) * tpb
        needed = per_request * plan.concurrency
        fits = tokens >= max(needed, 1) and plan.concurrency <= DEFAULT_MAX_BATCH_SIZE
        if tokens <= 0:
            verdict = "DOES NOT FIT: the profiled peak leaves no memory for TensorRT-LLM's KV pool"
        elif fits:
            verdict = (f"FITS: {plan.concurrency} request(s) of {plan.request_tokens:,} tokens hold {needed:,} of "
                       f"{tokens:,} tokens ({format_share(1 - needed / tokens, free=True)} headroom)")
        elif plan.concurrency > DEFAULT_MAX_BATCH_SIZE:
            verdict = f"DOES NOT FIT: {plan.concurrency} requests at once, max_batch_size is {DEFAULT_MAX_BATCH_SIZE}"
        else:
            verdict = (f"DOES NOT FIT: {plan.concurrency} request(s) of {plan.request_tokens:,} tokens need {needed:,} "
                       f"tokens, the pool holds {tokens:,}")
        low_tokens, high_tokens = (pool_tokens_of(budget, b, cell, tpb) for b in (low, high))
        return EnginePool(
            engine=self.name, engine_label=f"TensorRT-LLM {version or self.newest_known} (PyTorch backend)",
            model=plan.model, gpu=plan.gpu, gpu_count=plan.gpu_count, tensor_parallel_size=tp, replicas=1,
            kv_cache_dtype=cell.dtype, kv_bytes_per_token_per_gpu=cell.manager_bytes, page_tokens=tpb,
            memory_terms=budget.memory_terms(), kv_memory_bytes_per_gpu=tokens * cell.manager_bytes,
            pool_tokens=tokens, pool_pages=tokens // tpb, max_model_len=max_seq_len,
            requests_at_context=round(tokens / max_seq_len, 4) if max_seq_len else 0.0,
            max_running_requests=DEFAULT_MAX_BATCH_SIZE, request_tokens=plan.request_tokens,
            concurrency=plan.concurrency, fits=fits, verdict=verdict,
            startup_lines=startup_lines(budget, point, tokens, cell, tpb),
            launch_command=launch_command(plan.model, tp, settings, options),
            engine_flags={"free_gpu_memory_fraction": f"{fraction:g}", "tokens_per_block": str(tpb),
                          "max_num_tokens": str(max_num_tokens), "max_batch_size": str(DEFAULT_MAX_BATCH_SIZE)},
            notes=[f"the pool is {low_tokens:,}-{high_tokens:,} tokens over the ranges of the assumed CUDA context and "
                   "CUDA graphs",
                   f"weights: {plan.weights_source}",
                   f"bytes a token: {cell.manager_bytes:,} in the pool, {cell.estimator_bytes:,} in the budget's "
                   f"division ({cell.dtype}: {cell.dtype_how})",
                   "TensorRT-LLM pools sliding-window layers for the whole sequence unless max_attention_window is "
                   "set (its VSWA split is not modelled)" if cell.sliding_as_full else
                   "rules: docs/engines-trtllm-rules.md sections 1 and 8"]
            + (["unified memory: what the host holds of it (the OS, page cache, other processes) counts as used in "
                "TensorRT-LLM's profile and is not in this budget"] if gpus.device.unified_memory else []))

    def server_command(self, model: str, host: str, port: int, served_model_name: str | None, args: Any,
                       prefix: Sequence[str] | None = None) -> list[str]:
        raise KvplanError("kvplan does not launch TensorRT-LLM", "start `trtllm-serve` and attach with kvplan bench --url")

    def capacity_from_log(self, text: str) -> EngineCapacity:
        """The pool TensorRT-LLM prints: the last 'Allocated ... paged KV cache (N)' line's tokens, in blocks of
        its tokens per block where the log states them."""
        log = parse_trtllm_log(text)
        if log.pool is None:
            return EngineCapacity()
        per_block = log.tokens_per_block
        return EngineCapacity(num_blocks=log.pool.tokens // per_block if per_block else None, block_size=per_block,
                              kv_cache_tokens=log.pool.tokens, source="log")

    def capacity_from_metrics(self, cache_info: Mapping[str, str]) -> EngineCapacity:
        return EngineCapacity()  # kvplan reads no pool size from TensorRT-LLM's metrics


def startup_lines(budget: TrtllmBudget, budget_bytes: int, tokens: int, cell: TrtllmCell, tpb: int) -> list[str]:
    """The lines TensorRT-LLM prints about its budget and pool (`_util.py@b35ac1b` `_cal_max_memory`;
    `kvCacheManager.cpp@b35ac1b`), with kvplan's figures."""
    return [
        f"Peak memory during memory usage profiling (torch + non-torch): {budget.peak.bytes / GiB:.2f} GiB, available "
        f"KV cache memory when calculating max tokens: {budget_bytes / GiB:.2f} GiB, fraction is set "
        f"{budget.fraction:g}, kv size is {cell.estimator_bytes}. device total memory {budget.cuda_total / GiB:.2f} "
        f"GiB, , tmp kv_mem {budget.estimation_pool_bytes / GiB:.2f} GiB",
        f"Estimated max memory in KV cache : {budget_bytes / GiB:.2f} GiB",
        f"Number of tokens per block: {tpb}.",
        f"[MemUsageChange] Allocated {pool_gib(tokens, cell):.2f} GiB for max tokens in paged KV cache ({tokens}).",
    ]


def launch_command(model: str, tp: int, settings: Settings, options: EngineOptions) -> str:
    """`trtllm-serve` with the flags the pool was sized with (TensorRT-LLM's defaults left out; tokens_per_block
    has no flag: it goes in the --extra_llm_api_options YAML's kv_cache_config)."""
    args = ["trtllm-serve", model, "--backend", "pytorch"]
    if tp > 1:
        args += ["--tp_size", str(tp)]
    if settings.max_model_len:
        args += ["--max_seq_len", str(settings.max_model_len)]
    if options.max_num_tokens is not None:
        args += ["--max_num_tokens", str(options.max_num_tokens)]
    if options.free_gpu_memory_fraction is not None:
        args += ["--kv_cache_free_gpu_memory_fraction", f"{options.free_gpu_memory_fraction:g}"]
    return shlex.join(args)
