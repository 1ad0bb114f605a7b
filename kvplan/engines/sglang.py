"""SGLang behind the engine door: its pool (kvplan/sglang/pool.py) under its rules by release (kvplan/sglang/rules.py).

The weights per GPU are kvplan's estimate of the checkpoint as loaded, the same as the vLLM plan of the same
deployment prices (the TP split and the replicas are that plan's too), so two engines' pools differ only by their
own rules."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from kvplan.deploy import ResolvedModel, plan_deployment
from kvplan.engines.base import EngineCapacity, EngineOptions, EnginePool, engine
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection
from kvplan.plan.schema import Settings
from kvplan.sglang.pool import SglangPool, size_pool
from kvplan.sglang.rules import KNOWN_VERSIONS, NEWEST_KNOWN, rules_for
from kvplan.sglang.startup_log import parse_sglang_log
from kvplan.units import cdiv, format_share


@engine
class Sglang:
    name = "sglang"
    label = "SGLang"
    known_versions = KNOWN_VERSIONS
    newest_known = NEWEST_KNOWN
    own_options = ("mem_fraction_static", "page_size")

    def size(self, model: ResolvedModel, gpus: GpuSelection, settings: Settings, version: str | None,
             options: EngineOptions = EngineOptions()) -> EnginePool:
        if options.given(*self.own_options):
            raise KvplanError(f"{', '.join(options.given(*self.own_options))} is not an SGLang flag",
                              "SGLang's are --mem-fraction-static and --page-size")
        rules = rules_for(version)
        if options.page_size is not None and not 1 <= options.page_size <= 4096:
            raise KvplanError(f"invalid --page-size {options.page_size!r}", "give SGLang's page size, 1 to 4096 tokens")
        plan = plan_deployment(model, gpus, settings, None, suggest=False)  # the split, shared with vLLM's plan
        deployed = settings.replace(tensor_parallel_size=plan.tensor_parallel_size, max_model_len=plan.max_model_len)
        weights = plan.weights_bytes
        if plan.replicas > 1:  # SGLang's --dp-size replicates the model (vLLM shards MoE experts over DP ranks)
            one = GpuSelection(gpus.device, plan.tensor_parallel_size * plan.pipeline_parallel_size)
            weights = plan_deployment(model, one, deployed.replace(data_parallel_size=1), None, suggest=False).weights_bytes
        pool = size_pool(model.arch, gpus.device, deployed, rules, weights,
                         mem_fraction_static=options.mem_fraction_static, page_size=options.page_size or 1)
        per_request = cdiv(plan.request_tokens, pool.page_size) * pool.page_size
        needed = per_request * plan.concurrency
        fits = pool.tokens >= max(needed, 1) and plan.concurrency <= pool.max_running_requests
        if pool.tokens <= 0:
            verdict = "DOES NOT FIT: the loaded weights leave no memory for SGLang's KV pool"
        elif fits:
            verdict = (f"FITS: {plan.concurrency} request(s) of {plan.request_tokens:,} tokens hold {needed:,} of "
                       f"{pool.tokens:,} tokens ({format_share(1 - needed / pool.tokens, free=True)} headroom)")
        elif plan.concurrency > pool.max_running_requests:
            verdict = f"DOES NOT FIT: {plan.concurrency} requests at once, SGLang runs at most {pool.max_running_requests}"
        else:
            verdict = (f"DOES NOT FIT: {plan.concurrency} request(s) of {plan.request_tokens:,} tokens need {needed:,} "
                       f"tokens, the pool holds {pool.tokens:,}")
        return EnginePool(
            engine=self.name, engine_label=rules.label, model=plan.model, gpu=plan.gpu, gpu_count=plan.gpu_count,
            tensor_parallel_size=plan.tensor_parallel_size, replicas=plan.replicas, kv_cache_dtype=pool.kv_dtype.name,
            kv_bytes_per_token_per_gpu=pool.cell_bytes, page_tokens=pool.page_size, memory_terms=pool.memory_terms(),
            kv_memory_bytes_per_gpu=max(0, pool.rest_bytes[1]), pool_tokens=pool.tokens, pool_pages=pool.tokens // pool.page_size,
            max_model_len=pool.context_len,
            requests_at_context=round(pool.tokens / pool.context_len, 4) if pool.context_len else 0.0,
            max_running_requests=pool.max_running_requests, request_tokens=plan.request_tokens,
            concurrency=plan.concurrency, fits=fits, verdict=verdict, startup_lines=pool.startup_lines(),
            launch_command=launch_command(plan.model, pool, plan.tensor_parallel_size, plan.replicas, settings, options),
            engine_flags={"--mem-fraction-static": f"{pool.mem_fraction_static:g}", "--page-size": str(pool.page_size),
                          "--chunked-prefill-size": str(pool.chunked_prefill_size),
                          "--max-running-requests": str(pool.max_running_requests)},
            notes=_notes(pool, plan.weights_source))


    def server_command(self, model: str, host: str, port: int, served_model_name: str | None, args: Any,
                       prefix: Sequence[str] | None = None) -> list[str]:
        raise KvplanError("kvplan does not launch SGLang yet", "start `python -m sglang.launch_server ...` (kvplan size "
                          "--engine sglang prints the line) and attach with kvplan bench --url")

    def capacity_from_log(self, text: str) -> EngineCapacity:
        """The pool SGLang prints (`max_total_num_tokens=`, else the first pool line's `#tokens`), in pages of its
        page size (server_args; 1 by default)."""
        log = parse_sglang_log(text)
        tokens = log.max_total_num_tokens if log.max_total_num_tokens is not None else log.pool_tokens
        if tokens is None:
            return EngineCapacity()
        return EngineCapacity(num_blocks=tokens // log.page_size, block_size=log.page_size, kv_cache_tokens=tokens,
                              source="log")

    def capacity_from_metrics(self, cache_info: Mapping[str, str]) -> EngineCapacity:
        return EngineCapacity()  # kvplan reads no pool size from SGLang's /metrics (kvplan/sglang/metric_names.py)


def launch_command(model: str, pool: SglangPool, tp: int, replicas: int, settings: Settings,
                   options: EngineOptions) -> str:
    """`python -m sglang.launch_server` with the flags the pool was sized with (SGLang's defaults left out)."""
    args = ["python", "-m", "sglang.launch_server", "--model-path", model]
    if tp > 1:
        args += ["--tp-size", str(tp)]
    if replicas > 1:
        args += ["--dp-size", str(replicas)]
    if settings.max_model_len:
        args += ["--context-length", str(pool.context_len)]
    if pool.kv_dtype_flag != "auto":
        args += ["--kv-cache-dtype", pool.kv_dtype_flag]
    if options.mem_fraction_static is not None:
        args += ["--mem-fraction-static", f"{options.mem_fraction_static:g}"]
    if options.page_size is not None:
        args += ["--page-size", str(options.page_size)]
    return shlex.join(args)


def _notes(pool: SglangPool, weights_source: str) -> list[str]:
    low, high = pool.tokens_range
    return [
        f"{pool.rules.label} rules (docs/engines-sglang-rules.md); the pool is {low:,}-{high:,} tokens over the range "
        "of the memory a rank holds before loading (its CUDA context and communicators, assumed 0.4-1.5 GiB)"
        + (" and of the prefill CUDA graphs' reserve (SGLang turns them off for some architectures)"
           if pool.rules.prefill_graph_reserve and pool.fraction_how != "given" else ""),
        f"weights: {weights_source}",
        "SGLang profiles no activation peak: 1 - mem_fraction_static of the memory free before loading is all it "
        "keeps back for activations and CUDA graphs",
    ]
