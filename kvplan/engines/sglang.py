"""SGLang behind the engine door: its pool (kvplan/sglang/pool.py) under its rules by release (kvplan/sglang/rules.py).

The weights per GPU are kvplan's estimate of the checkpoint as loaded, the same as the vLLM plan of the same
deployment prices (the TP split and the replicas are that plan's too), so two engines' pools differ only by their
own rules."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvplan.deploy import ResolvedModel, plan_deployment
from kvplan.engines.base import EngineCapacity, EngineOptions, EnginePool, engine
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection
from kvplan.model.weights import attention_bytes
from kvplan.plan.schema import Settings
from kvplan.sglang.pool import SglangPool, pool_kind, size_pool, swa_memory_disabled
from kvplan.sglang.rules import KNOWN_VERSIONS, NEWEST_KNOWN, rules_for
from kvplan.sglang.startup_log import parse_sglang_log
from kvplan.sglang.weights import absorbed_kv_b_bytes
from kvplan.units import cdiv, format_share


@engine
class Sglang:
    name = "sglang"
    label = "SGLang"
    known_versions = KNOWN_VERSIONS
    newest_known = NEWEST_KNOWN
    own_options = ("mem_fraction_static", "page_size", "swa_full_tokens_ratio", "enable_dp_attention",
                   "mamba_full_memory_ratio")

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
        tp = plan.tensor_parallel_size
        # The release (and, for gpt-oss on SM100, the GPU) decides whether a sliding-window model gets the hybrid pool.
        kind = pool_kind(model.arch, rules.version, bool(swa_memory_disabled(model.arch, rules, gpus.device)))
        nsa = kind == "nsa"
        if options.swa_full_tokens_ratio is not None and kind != "swa":
            raise KvplanError("--swa-full-tokens-ratio is for a model of sliding-window layers (SGLang's hybrid pool)",
                              "drop it")
        if options.mamba_full_memory_ratio is not None and kind != "mamba":
            raise KvplanError("--mamba-full-memory-ratio is for a Mamba / linear-attention hybrid (SGLang's state "
                              "pool)", "drop it")
        dp_attention = options.enable_dp_attention or nsa
        if dp_attention:
            # Attention data-parallel over the TP group (--dp-size = TP; SGLang sets it itself for DeepSeek NSA,
            # server_args.py@0.5.3 .. @0.5.4.post3): each GPU holds the attention weights (the NSA indexer's
            # included) and the input embedding whole (`VocabParallelEmbedding(enable_tp=not
            # is_dp_attention_enabled())`, models/deepseek_v2.py@0.5.3.post1), and the norms and MoE routers, which
            # no TP splits (RMSNorm, MoEGate's own Parameter); the experts, dense MLPs and lm_head stay split.
            arch = model.arch
            whole = (attention_bytes(arch.params, arch.model_dtype_bytes, arch.quantization)
                     + (arch.params.embedding + arch.params.other) * arch.model_dtype_bytes)
            weights += whole - whole // (tp * plan.pipeline_parallel_size)
        # MLA's w_kc / w_vc, made after loading beside kv_b_proj (kvplan/sglang/weights.py)
        absorbed = absorbed_kv_b_bytes(model.config.config, 1 if dp_attention else tp)
        weights += absorbed
        config = model.config.config
        ranks = (config.get("kv_lora_rank"), config.get("qk_rope_head_dim"))
        pool = size_pool(model.arch, gpus.device, deployed, rules, weights,
                         mem_fraction_static=options.mem_fraction_static, page_size=options.page_size or 1,
                         swa_full_tokens_ratio=options.swa_full_tokens_ratio,
                         dp_attention_size=tp if options.enable_dp_attention else 0,
                         mla_ranks=ranks if all(isinstance(x, int) and x > 0 for x in ranks) else None,
                         mamba_full_memory_ratio=options.mamba_full_memory_ratio)
        pool = replace(pool, absorbed_kv_b_bytes=absorbed)
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
            kv_memory_bytes_per_gpu=pool.kv_budget_bytes(), pool_tokens=pool.tokens, pool_pages=pool.tokens // pool.page_size,
            max_model_len=pool.context_len,
            requests_at_context=round(pool.tokens / pool.context_len, 4) if pool.context_len else 0.0,
            max_running_requests=pool.max_running_requests, request_tokens=plan.request_tokens,
            concurrency=plan.concurrency, fits=fits, verdict=verdict, startup_lines=pool.startup_lines(),
            launch_command=launch_command(plan.model, pool, plan.tensor_parallel_size, plan.replicas, settings, options),
            engine_flags=_flags(pool, tp),
            pool_split=pool.pool_tokens(), pool_bytes_per_gpu=pool.pool_bytes(),
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
    if options.page_size is not None and pool.kind != "nsa":
        args += ["--page-size", str(options.page_size)]
    if options.swa_full_tokens_ratio is not None:
        args += ["--swa-full-tokens-ratio", f"{options.swa_full_tokens_ratio:g}"]
    if options.mamba_full_memory_ratio is not None:
        args += ["--mamba-full-memory-ratio", f"{options.mamba_full_memory_ratio:g}"]
    if options.enable_dp_attention:
        args += ["--enable-dp-attention", "--dp-size", str(tp)]
    return shlex.join(args)


def _flags(pool: SglangPool, tp: int) -> dict[str, str]:
    flags = {"--mem-fraction-static": f"{pool.mem_fraction_static:g}", "--page-size": str(pool.page_size),
             "--chunked-prefill-size": str(pool.chunked_prefill_size),
             "--max-running-requests": str(pool.max_running_requests)}
    if pool.kind == "swa":
        flags["--swa-full-tokens-ratio"] = f"{pool.swa_full_tokens_ratio:g}"
    if pool.kind == "mamba":
        flags["--mamba-full-memory-ratio"] = f"{pool.mamba_full_memory_ratio:g}"
    if pool.dp_attention:
        flags |= {"--enable-dp-attention": "on", "--dp-size": str(tp)}
    return flags


def _notes(pool: SglangPool, weights_source: str) -> list[str]:
    low, high = pool.tokens_range
    kind = []
    if pool.kind == "swa" and pool.swa is not None:
        kind = [f"hybrid sliding-window pool: {pool.swa.full_layers} full-attention layers at "
                f"{pool.swa.full_cell:,} B a token hold full_layer_tokens={pool.tokens:,}, {pool.swa.swa_layers} "
                f"sliding-window layers at {pool.swa.swa_cell:,} B hold swa_layer_tokens={pool.swa_tokens:,} "
                f"(ratio {pool.swa_full_tokens_ratio:g}); {pool.how}; a request's context counts against the full "
                "pool"]
    elif pool.kind == "mamba" and pool.mamba_state_bytes is not None:
        kind = [f"Mamba / GDN hybrid: {pool.how} (the full-attention layers only); a request holds one state slot, "
                f"{sum(pool.mamba_state_bytes):,} B on each GPU (conv bf16); running requests at most "
                f"max_mamba_cache_size // {pool.rules.mamba_slots_per_request}"]
    elif pool.kind == "kv" and "window layers" in pool.how:
        kind = [f"one pool: {pool.how}"]
    elif pool.kind == "nsa":
        kind = [f"NSA pool (DeepSeek-V3.2, page 64, DP attention over the TP group): the budget divided by "
                f"{pool.cell_bytes:,} B a token" + (" (latent and indexer keys)" if pool.rules.nsa_indexer_in_pool
                                                  else " (the latent alone: 0.5.3)") + f"; {pool.how}"]
    return kind + [
        f"{pool.rules.label} rules (docs/engines-sglang-rules.md); the pool is {low:,}-{high:,} tokens over the range "
        "of the memory a rank holds before loading (its CUDA context and communicators, assumed 0.4-1.5 GiB)"
        + (" and of the prefill CUDA graphs' reserve (SGLang turns them off for some architectures)"
           if pool.rules.prefill_graph_reserve and pool.fraction_how != "given" else ""),
        f"weights: {weights_source}",
        "SGLang profiles no activation peak: 1 - mem_fraction_static of the memory free before loading is all it "
        "keeps back for activations and CUDA graphs",
    ]
