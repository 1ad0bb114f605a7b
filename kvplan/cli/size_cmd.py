"""`kvplan size`: the planner's answer for one model on one set of GPUs."""

# Annotations evaluated at import, not `from __future__ import annotations`: typer reads the ~40
# options' types on every run, and as strings each would be compiled and evaluated again (a few ms).
from enum import Enum
from typing import Optional

import typer

from kvplan.cli.common import parse_overrides, print_json, user_errors
from kvplan.errors import ExitCode
from kvplan.hardware.host import local_host_memory_bytes
from kvplan.plan.schema import Settings, SizePlan
from kvplan.units import GiB, format_bytes, format_range, format_share, format_tokens, parse_bytes, parse_fraction, parse_tokens
from kvplan.vllm.rules import first_release

EXAMPLES = """
Examples:

  kvplan size meta-llama/Llama-3.1-8B --ctx 32k --gpu 4090

  kvplan size Qwen/Qwen3-32B --ctx 16k --gpu 2xH100 --concurrency 32 --kv-cache-dtype fp8

  kvplan size deepseek-ai/DeepSeek-V3 --gpu 8xH200 --ctx 128k --json

  kvplan size ./my-model/ --gpu-mem 24GiB --prompt 2k --output 512 -c 16 --shared-prefix 1k

  kvplan size openai/gpt-oss-120b --gpu H100 --kv-memory 5.38GiB --vllm-version 0.11.0

  kvplan size Qwen/Qwen3-32B --ctx 32k --gpu 2xH100 --engine all
"""


class Source(str, Enum):
    auto = "auto"
    local = "local"
    hub = "hub"
    bundled = "bundled"


class Usage(str, Enum):
    serve = "serve"
    llm = "llm"


class Layout(str, Enum):
    rules = "rules"
    engine = "engine"


class EngineChoice(str, Enum):
    vllm = "vllm"
    sglang = "sglang"
    trtllm = "trtllm"
    all = "all"


class Emit(str, Enum):
    llm_d_sim = "llm-d-sim"


class StateDtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def _opt_tokens(value: Optional[str], what: str) -> Optional[int]:
    return None if value is None else parse_tokens(value, what)


@user_errors
def size(
    model: str = typer.Argument(..., metavar="MODEL", help="Hub id (org/name), local folder/config.json, or bundled profile."),
    ctx: Optional[str] = typer.Option(None, "--ctx", "--max-model-len", help="Context length (max_model_len): 32k, 131072.", metavar="TOKENS", rich_help_panel="Model and GPUs"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU: H100, 4090, 4xH100, or auto (NVML).", metavar="GPU", rich_help_panel="Model and GPUs"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Number of GPUs (same as the Nx prefix of --gpu).", metavar="N", rich_help_panel="Model and GPUs"),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="Memory of a GPU not in the catalog: 24GiB.", metavar="SIZE", rich_help_panel="Model and GPUs"),
    tp: Optional[int] = typer.Option(None, "--tp", "--tensor-parallel-size", help="Tensor parallel size (default: all GPUs / pp).", metavar="N", rich_help_panel="Parallelism"),
    pp: int = typer.Option(1, "--pp", "--pipeline-parallel-size", help="Pipeline parallel size.", metavar="N", rich_help_panel="Parallelism"),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", "--kv-dtype", help="auto, bfloat16, float16, fp8, fp8_e5m2, fp8_ds_mla, nvfp4...", metavar="DTYPE", rich_help_panel="KV cache"),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="KV block size in tokens (default 16; MLA 64).", metavar="TOKENS", rich_help_panel="KV cache"),
    util: Optional[str] = typer.Option(None, "--gpu-memory-utilization", "--util", help="Fraction of GPU memory vLLM may use (default by version: 0.9, 0.92 from 0.20).", metavar="FRACTION", rich_help_panel="Memory budget"),
    kv_memory: Optional[str] = typer.Option(None, "--kv-memory", "--kv-cache-memory", "--kv-cache-memory-bytes", help="KV cache bytes per GPU, as vLLM's --kv-cache-memory-bytes: 12GiB.", metavar="SIZE", rich_help_panel="Memory budget"),
    weights_memory: Optional[str] = typer.Option(None, "--weights-memory", help="Loaded weights per GPU, if known (vLLM's 'Model loading took').", metavar="SIZE", rich_help_panel="Memory budget"),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="Requests served at once.", metavar="N", rich_help_panel="Workload"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Prompt tokens per request (default: requests fill the context).", metavar="TOKENS", rich_help_panel="Workload"),
    output: Optional[str] = typer.Option(None, "--output", help="Output tokens per request.", metavar="TOKENS", rich_help_panel="Workload"),
    shared_prefix: Optional[str] = typer.Option(None, "--shared-prefix", help="Prefix tokens all requests share (prefix caching).", metavar="TOKENS", rich_help_panel="Workload"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="vLLM's max_num_seqs (default by GPU: 256 or 1024).", metavar="N", rich_help_panel="vLLM scheduler"),
    max_num_batched_tokens: Optional[str] = typer.Option(None, "--max-num-batched-tokens", help="vLLM's max_num_batched_tokens (default by GPU).", metavar="TOKENS", rich_help_panel="vLLM scheduler"),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="No CUDA graphs (vLLM --enforce-eager).", rich_help_panel="vLLM scheduler"),
    disable_hybrid: bool = typer.Option(False, "--disable-hybrid-kv-cache-manager", help="Size sliding/chunked layers as full attention.", rich_help_panel="KV cache"),
    blocks_override: Optional[int] = typer.Option(None, "--num-gpu-blocks-override", help="Pin the block count, as vLLM's flag.", metavar="BLOCKS", rich_help_panel="KV cache"),
    language_model_only: bool = typer.Option(False, "--language-model-only", help="vLLM's --language-model-only (or every --limit-mm-per-prompt modality 0): multimodal towers are not loaded.", rich_help_panel="Memory budget"),
    mm_max_pixels: Optional[int] = typer.Option(None, "--mm-max-pixels", help="The image processor's largest image in pixels, as vLLM's --mm-processor-kwargs '{\"max_pixels\": N}' (sizes the profile run's encoder pass).", metavar="PIXELS", rich_help_panel="Memory budget"),
    skip_mm_profiling: bool = typer.Option(False, "--skip-mm-profiling", help="vLLM's --skip-mm-profiling: the profile run skips the multimodal encoder.", rich_help_panel="Memory budget"),
    speculative_config: Optional[str] = typer.Option(None, "--speculative-config", help="vLLM's --speculative-config JSON as you give vLLM: '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' (draft KV layers, Mamba state, lookahead, draft weights).", metavar="JSON", rich_help_panel="KV cache"),
    draft_layers: int = typer.Option(0, "--draft-layers", help="Speculative decoding: the draft's KV layers, where --speculative-config cannot tell them (a draft model) or without it.", metavar="N", rich_help_panel="KV cache"),
    usage: Usage = typer.Option(Usage.serve, "--usage", help="serve (vllm serve) or llm (offline LLM class): picks vLLM's defaults.", rich_help_panel="vLLM scheduler"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="Accounting rules of this vLLM release (default: newest known).", metavar="VERSION", rich_help_panel="vLLM release and layout"),
    engine: EngineChoice = typer.Option(EngineChoice.vllm, "--engine", help="Size for this engine: vllm, sglang, trtllm (PyTorch backend), or all side by side.", rich_help_panel="vLLM release and layout"),
    engine_version: Optional[str] = typer.Option(None, "--engine-version", help="Release of a non-vLLM --engine (default: the newest kvplan has read; SGLang 0.4.6-0.5.23).", metavar="VERSION", rich_help_panel="vLLM release and layout"),
    mem_fraction_static: Optional[float] = typer.Option(None, "--mem-fraction-static", help="SGLang's --mem-fraction-static (default: SGLang's own heuristic of the GPU).", metavar="FRACTION", rich_help_panel="vLLM release and layout"),
    page_size: Optional[int] = typer.Option(None, "--page-size", help="SGLang's --page-size in tokens (default 1).", metavar="TOKENS", rich_help_panel="vLLM release and layout"),
    swa_full_tokens_ratio: Optional[float] = typer.Option(None, "--swa-full-tokens-ratio", help="SGLang's --swa-full-tokens-ratio: the sliding-window pool's tokens per full pool token (default 0.8).", metavar="RATIO", rich_help_panel="vLLM release and layout"),
    mamba_full_memory_ratio: Optional[float] = typer.Option(None, "--mamba-full-memory-ratio", help="SGLang's --mamba-full-memory-ratio: the Mamba state pool's memory per KV pool memory (default 0.9).", metavar="RATIO", rich_help_panel="vLLM release and layout"),
    enable_dp_attention: bool = typer.Option(False, "--enable-dp-attention", help="SGLang's --enable-dp-attention with --dp-size the TP size: attention data-parallel over the TP group (DeepSeek NSA: on by itself).", rich_help_panel="vLLM release and layout"),
    free_gpu_memory_fraction: Optional[float] = typer.Option(None, "--free-gpu-memory-fraction", help="TensorRT-LLM's kv_cache_config.free_gpu_memory_fraction (default 0.9).", metavar="F", rich_help_panel="vLLM release and layout"),
    tokens_per_block: Optional[int] = typer.Option(None, "--tokens-per-block", help="TensorRT-LLM's kv_cache_config.tokens_per_block (default 32).", metavar="TOKENS", rich_help_panel="vLLM release and layout"),
    max_num_tokens: Optional[int] = typer.Option(None, "--max-num-tokens", help="TensorRT-LLM's max_num_tokens, the size of its profiling prefill (default 8192).", metavar="TOKENS", rich_help_panel="vLLM release and layout"),
    dummy_activation_gib: Optional[float] = typer.Option(None, "--dummy-activation-gib", help="TensorRT-LLM: the profiling prefill's activation in GiB, as a log prints it ('Memory dynamically allocated during inference (inside torch)'); overrides kvplan's own term (dense and MoE models); needed for multimodal models.", metavar="GIB", rich_help_panel="vLLM release and layout"),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of the config.", metavar="REV", rich_help_panel="Model and GPUs"),
    source: Source = typer.Option(Source.auto, "--source", help="auto (local, Hub, bundled), local, hub or bundled.", rich_help_panel="Model and GPUs"),
    offline: bool = typer.Option(False, "--offline", help="Do not contact the Hub (HF_HUB_OFFLINE=1 does the same).", rich_help_panel="Model and GPUs"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a config field: --set num_key_value_heads=8 (repeatable).", metavar="FIELD=VALUE", rich_help_panel="Model and GPUs"),
    prefix_caching: Optional[bool] = typer.Option(None, "--enable-prefix-caching/--no-enable-prefix-caching", "--prefix-caching/--no-prefix-caching", help="vLLM's prefix caching (default on; off also turns Mamba 'align' state caching off).", rich_help_panel="KV cache"),
    async_scheduling: Optional[bool] = typer.Option(None, "--async-scheduling/--no-async-scheduling", help=f"vLLM's async scheduling (on by default from {first_release('async_scheduling_default')}, with --pp > 1 from {first_release('async_scheduling_with_pp')}; from {first_release('inflight_counts_concurrent_batches')} sliding-window layers then hold 2 batches in flight, pp + 1 with --pp > 1).", rich_help_panel="vLLM scheduler"),
    mamba_ssm_cache_dtype: StateDtype = typer.Option(StateDtype.auto, "--mamba-ssm-cache-dtype", help="SSM state dtype of Mamba / linear-attention layers.", rich_help_panel="KV cache"),
    expert_parallel: bool = typer.Option(False, "--enable-expert-parallel", help="vLLM's expert parallel: whole MoE experts per GPU (over all tp x dp GPUs, as without it).", rich_help_panel="Parallelism"),
    dcp: int = typer.Option(1, "--decode-context-parallel-size", "--dcp", help="vLLM's decode context parallel size (a block holds block_size x DCP tokens).", metavar="N", rich_help_panel="Parallelism"),
    layout: Layout = typer.Option(Layout.rules, "--layout", help="rules (kvplan's, per model family) or engine (ask the installed vLLM; needs the [engine] extra).", rich_help_panel="vLLM release and layout"),
    allow_unverified: bool = typer.Option(False, "--allow-unverified-layout", help="Plan a model_type kvplan has no rules for as a plain decoder (marked UNVERIFIED).", rich_help_panel="vLLM release and layout"),
    steptime: Optional[str] = typer.Option(None, "--steptime", metavar="RUN", help="Latency from a step-time model calibrated on a bench run (`kvplan calibrate --bench RUN`) instead of the prior.", rich_help_panel="Workload"),
    kv_offloading_size: Optional[float] = typer.Option(None, "--kv-offloading-size", metavar="GiB", help="vLLM's CPU offload tier, GiB over the engine's ranks: the chunks, host memory and tokens vLLM's native backend gives it.", rich_help_panel="KV cache"),
    host_memory: Optional[str] = typer.Option(None, "--host-memory", metavar="SIZE", help="RAM of the host one engine runs on (2TiB): the CPU offload tier must fit in it (default with --gpu auto: this machine's).", rich_help_panel="KV cache"),
    kv_offloading_backend: Optional[str] = typer.Option(None, "--kv-offloading-backend", metavar="BACKEND", help="native (vLLM's default) or lmcache (its server holds the capacity: nothing to size).", rich_help_panel="KV cache"),
    kv_offloading_eviction_policy: Optional[str] = typer.Option(None, "--kv-offloading-eviction-policy", metavar="POLICY", help="--workload with --kv-offloading-size: the native tier's eviction_policy (kv_connector_extra_config), lru (vLLM's default) or arc.", rich_help_panel="KV cache"),
    kv_offloading_store_threshold: Optional[int] = typer.Option(None, "--kv-offloading-store-threshold", metavar="N", help="--workload with --kv-offloading-size: the native tier's store_threshold (kv_connector_extra_config): a chunk is stored once offered N times (0 or 1, vLLM's default 0: every time).", rich_help_panel="KV cache"),
    pd_decode_tp: Optional[int] = typer.Option(None, "--pd-decode-tp", metavar="N", help="Prefill/decode disaggregation (vLLM's NixlConnector): this deployment prefills, a decode instance at TP N reads the KV; prints the bytes each rank moves and the time per link.", rich_help_panel="KV cache"),
    pd_prompt: Optional[str] = typer.Option(None, "--pd-prompt", metavar="TOKENS", help="--pd-decode-tp: the prompt moved (default: the context length).", rich_help_panel="KV cache"),
    pd_decode_hit: Optional[str] = typer.Option(None, "--pd-decode-hit", metavar="TOKENS", help="--pd-decode-tp: prompt tokens the decode instance's prefix cache already holds (not moved).", rich_help_panel="KV cache"),
    pd_link: Optional[float] = typer.Option(None, "--pd-link-gbs", metavar="GB/s", help="--pd-decode-tp: one NIC's rate in GB/s, beside 200/400/800 Gb/s.", rich_help_panel="KV cache"),
    workload: Optional[str] = typer.Option(None, "--workload", metavar="FILE", help="Traffic with reuse (a Mooncake-style trace, conversations, an agent workload: as kvplan bench --traffic): the prefix-cache hits this pool keeps and the pool 50/90/99% of the achievable hits need.", rich_help_panel="Workload"),
    workload_option: Optional[list[str]] = typer.Option(None, "--workload-option", metavar="KEY=NUMBER", help="--workload: a loader option (repeatable), as kvplan bench --traffic-option.", rich_help_panel="Workload"),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 unless it fits at the low end of the KV budget's range too (the verdict says when it fits at the estimate only).", rich_help_panel="Output"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (schema: kvplan schema).", rich_help_panel="Output"),
    emit: Optional[Emit] = typer.Option(None, "--emit", help="Print the plan as another tool's input instead of the report (with --json: one JSON document of it). llm-d-sim: llm-d-inference-sim's YAML config for one replica: the plan's usable blocks and block size, max-num-seqs, max-model-len, and the step-time model's per-token latency terms (needs --prompt). The simulator's KV cache only counts prefix hits and fails a request whose prompt blocks do not fit: it does not wait or preempt as vLLM does, so kvplan's KV onsets do not show in it.", rich_help_panel="Output"),
    emit_out: Optional[str] = typer.Option(None, "--out", metavar="FILE", help="--emit: write the config to FILE; the report (or the --json plan) goes to stdout as without --emit.", rich_help_panel="Output"),
) -> None:
    """Size the KV cache of MODEL on GPUs: bytes per token, pool, tokens, concurrency, verdict.

    Exit code 0: fits (at the estimate; with --strict, at the low end of the budget range too); 1: does not
    fit at the asked context x concurrency; 2: bad input; 3: internal error.
    """
    from kvplan.deploy import load_draft, load_model, plan_deployment, select_gpus
    from kvplan.errors import KvplanError
    from kvplan.plan.speculative import parse_speculative_config

    source, usage, layout = Source(source).value, Usage(usage).value, Layout(layout).value  # choices, checked by the parser
    mamba_ssm_cache_dtype = StateDtype(mamba_ssm_cache_dtype).value
    if kv_cache_dtype != "auto":
        from kvplan.model.dtypes import kv_dtype

        kv_dtype(kv_cache_dtype)  # validate early, with the list of names
    for name, value in (("--concurrency", concurrency), ("--pp", pp), ("--tp", tp), ("--gpus", gpus),
                        ("--block-size", block_size), ("--max-num-seqs", max_num_seqs),
                        ("--num-gpu-blocks-override", blocks_override), ("--decode-context-parallel-size", dcp)):
        if value is not None and value <= 0:
            raise KvplanError(f"invalid {name}: {value} must be greater than 0")
    if pd_decode_tp is None and (pd_prompt, pd_decode_hit, pd_link) != (None, None, None):
        raise KvplanError("--pd-prompt, --pd-decode-hit and --pd-link-gbs are for --pd-decode-tp",
                          "give the decode instance's TP with --pd-decode-tp N")
    if emit_out is not None and emit is None:
        raise KvplanError("--out is the file of --emit", "add --emit llm-d-sim")
    if emit is not None and prompt is None:
        raise KvplanError("--emit llm-d-sim prices the prompt's prefill and the decode at its context",
                          "give the prompt length with --prompt TOKENS (and --output TOKENS)")
    tier_policy = _tier_policy(kv_offloading_eviction_policy, kv_offloading_store_threshold, kv_offloading_size,
                               kv_offloading_backend, workload)
    selection = select_gpus(gpu, gpus, gpu_mem)
    if tp is None:
        tp = max(1, selection.count // pp)
    settings = Settings(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        max_model_len=_opt_tokens(ctx, "context length"),
        gpu_memory_utilization=None if util is None else parse_fraction(util, "gpu memory utilization"),
        kv_cache_memory_bytes=None if kv_memory is None else parse_bytes(kv_memory, "KV cache memory"),
        num_gpu_blocks_override=blocks_override,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=_opt_tokens(max_num_batched_tokens, "max_num_batched_tokens"),
        enforce_eager=enforce_eager,
        hybrid_kv_cache_manager=False if disable_hybrid else None,
        usage_context=usage,
        weights_bytes=None if weights_memory is None else parse_bytes(weights_memory, "weights memory"),
        speculative=None if speculative_config is None else load_draft(parse_speculative_config(speculative_config),
                                                                       source, True if offline else None),
        draft_layers=draft_layers,
        language_model_only=language_model_only,
        mm_max_pixels=mm_max_pixels,
        skip_mm_profiling=skip_mm_profiling,
        concurrency=concurrency,
        prompt_tokens=_opt_tokens(prompt, "prompt length"),
        output_tokens=None if output is None else parse_tokens(output, "output length", allow_zero=True),
        shared_prefix_tokens=0 if shared_prefix is None else parse_tokens(shared_prefix, "shared prefix", allow_zero=True),
        enable_prefix_caching=prefix_caching,
        async_scheduling=async_scheduling,
        mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
        decode_context_parallel_size=dcp,
        enable_expert_parallel=expert_parallel,
        kv_offloading_size=kv_offloading_size,
        kv_offloading_backend=kv_offloading_backend,
        host_memory_bytes=_host_memory(host_memory, gpu),
        pd_decode_tp=pd_decode_tp,
        pd_prompt_tokens=_opt_tokens(pd_prompt, "--pd-prompt"),
        pd_decode_hit_tokens=0 if pd_decode_hit is None else parse_tokens(pd_decode_hit, "--pd-decode-hit", allow_zero=True),
        pd_link_gb_per_s=pd_link,
    )
    if layout == "engine" and vllm_version is None:
        from kvplan.vllm.engine_layout import installed_vllm_version

        vllm_version = installed_vllm_version()  # the layout and the rules of one release
    resolved = load_model(model, revision, source, True if offline else None, parse_overrides(set_),
                          allow_unverified=allow_unverified, layout=layout, vllm_version=vllm_version)
    engine_name = EngineChoice(engine).value
    sglang_flags = (mem_fraction_static, page_size, swa_full_tokens_ratio, mamba_full_memory_ratio,
                    enable_dp_attention or None)
    trtllm_flags = (free_gpu_memory_fraction, tokens_per_block, max_num_tokens, dummy_activation_gib)
    if engine_name != "vllm" or engine_version or any(flag is not None for flag in sglang_flags + trtllm_flags):
        from kvplan.cli.engine_view import render_pool, render_side_by_side
        from kvplan.engines import ENGINES, EngineOptions, EnginePools, engine_named

        for flag, given in (("--workload", workload), ("--kv-offloading-size", kv_offloading_size),
                            ("--pd-decode-tp", pd_decode_tp), ("--steptime", steptime), ("--strict", strict or None),
                            ("--emit", emit)):
            if given is not None:
                raise KvplanError(f"{flag} is for vLLM plans", "drop it, or size with --engine vllm")
        if engine_name == "all" and engine_version:
            raise KvplanError("--engine-version names a release of one --engine", "give --vllm-version for vLLM, "
                              "and --engine-version with --engine sglang")
        if dummy_activation_gib is not None and not 0 <= dummy_activation_gib < 1e6:
            raise KvplanError(f"invalid --dummy-activation-gib {dummy_activation_gib!r}", "give GiB, 0 or more")
        options = EngineOptions(mem_fraction_static=mem_fraction_static, page_size=page_size,
                                swa_full_tokens_ratio=swa_full_tokens_ratio,
                                mamba_full_memory_ratio=mamba_full_memory_ratio,
                                enable_dp_attention=enable_dp_attention or None,
                                free_gpu_memory_fraction=free_gpu_memory_fraction, tokens_per_block=tokens_per_block,
                                max_num_tokens=max_num_tokens,
                                dummy_activation_bytes=None if dummy_activation_gib is None
                                else round(dummy_activation_gib * GiB))
        names = list(ENGINES) if engine_name == "all" else [engine_name]
        pools, refused = [], {}
        for name in names:
            version = vllm_version if name == "vllm" else engine_version
            # --engine all: each engine gets its own flags; one engine named gets them all (and refuses others')
            chosen = options if len(names) == 1 else options.keep(*engine_named(name).own_options)
            try:
                pools.append(engine_named(name).size(resolved, selection, settings, version, chosen))
            except KvplanError as exc:
                if len(names) == 1 or name == "vllm":
                    raise
                refused[name] = exc.message  # --engine all: the others are still worth showing
        if as_json:
            print_json(EnginePools(pools, refused))
        elif len(names) == 1:
            render_pool(pools[0])
        else:
            render_side_by_side(pools, refused)
        raise typer.Exit(ExitCode.OK if all(p.fits for p in pools) else ExitCode.DOES_NOT_FIT)
    model_steptime = None
    if steptime is not None:
        from pathlib import Path

        from kvplan.bench.steptime_io import load_steptime

        model_steptime = load_steptime(Path(steptime))
    plan = plan_deployment(resolved, selection, settings, vllm_version, steptime=model_steptime)
    if workload is not None:
        plan = plan.replace(workload=_workload_plan(plan, workload, workload_option, *tier_policy))
    elif workload_option:
        raise KvplanError("--workload-option is for --workload", "give the traffic file with --workload FILE")
    if emit is not None:
        _emit_llmd_sim(plan, model_steptime, emit_out, as_json)
    else:
        _print_plan(plan, as_json)
    raise typer.Exit(ExitCode.OK if plan.fits and (plan.fits_across_range or not strict) else ExitCode.DOES_NOT_FIT)


def _emit_llmd_sim(plan: SizePlan, steptime, out: Optional[str], as_json: bool) -> None:
    """--emit llm-d-sim: the config on stdout (YAML, or one JSON document with --json), or in ``out`` with the
    usual report on stdout."""
    import sys

    from kvplan.paths import write_file_safely
    from kvplan.plan.llmd_sim import llmd_sim_config, to_yaml
    from kvplan.term import printable

    export = llmd_sim_config(plan, steptime)  # a refusal (no prompt, a block size it lacks...) before any output
    if out is None and as_json:
        print_json(export.to_json())
    elif out is None:
        sys.stdout.write(to_yaml(export, plan))
    else:
        written = write_file_safely(out, to_yaml(export, plan), "the llm-d-inference-sim config")
        _print_plan(plan, as_json)
        sys.stderr.write(f"llm-d-inference-sim config written to {printable(str(written))}\n")


def _print_plan(plan: SizePlan, as_json: bool) -> None:
    if as_json:
        print_json(plan)
    else:
        render(plan)


def _host_memory(text: Optional[str], gpu: Optional[str]) -> Optional[int]:
    """--host-memory, else this machine's RAM when the GPUs are this machine's (--gpu auto), else unknown."""
    if text is not None:
        return parse_bytes(text, "host memory")
    if gpu is not None and gpu.strip().lower() == "auto":
        return local_host_memory_bytes()
    return None


def _tier_policy(policy: Optional[str], threshold: Optional[int], size: Optional[float], backend: Optional[str],
                 workload: Optional[str]) -> tuple[str, int]:
    """--kv-offloading-eviction-policy / --kv-offloading-store-threshold: checked, with vLLM's defaults."""
    from kvplan.errors import KvplanError
    from kvplan.plan.tier_cache import EVICTION_POLICIES

    for flag, given in (("--kv-offloading-eviction-policy", policy), ("--kv-offloading-store-threshold", threshold)):
        if given is not None and size is None:
            raise KvplanError(f"{flag} is for the CPU offload tier", "give its size with --kv-offloading-size GiB")
        if given is not None and backend == "lmcache":
            raise KvplanError(f"{flag} is a setting of vLLM's native tier, not of LMCache's",
                              "drop it, or use --kv-offloading-backend native")
        if given is not None and workload is None:
            raise KvplanError(f"{flag} is for --workload (the tier's hits on a traffic)",
                              "give the traffic file with --workload FILE")
    if policy is not None and policy not in EVICTION_POLICIES:
        raise KvplanError(f"invalid --kv-offloading-eviction-policy {policy!r}", "vLLM 0.32 has lru and arc")
    if threshold is not None and threshold < 0:
        raise KvplanError(f"invalid --kv-offloading-store-threshold {threshold}", "give a count >= 0")
    return policy or "lru", threshold or 0


def _workload_plan(plan: SizePlan, path: str, options: Optional[list[str]], eviction_policy: str = "lru",
                   store_threshold: int = 0):
    """--workload: the traffic's working set on the plan's pool (one replica's usable blocks)."""
    from pathlib import Path

    from kvplan.cli.bench_cmd import parse_loader_options
    from kvplan.plan.hybrid_cache import HybridGroups
    from kvplan.plan.prefix_cache import workload_plan
    from kvplan.plan.tier_cache import workload_tier
    from kvplan.traffic.loaders import load_traffic

    traffic = load_traffic(Path(path).expanduser(), **parse_loader_options(options, "--workload-option"))
    groups = HybridGroups.of_capacity(plan.capacity)  # refuses KV groups whose prefix cache is not modelled
    usable = plan.capacity.usable_blocks  # less V1's null block
    tier = None
    if plan.offload is not None:  # the native tier: its chunks per KV group (each group's block takes a chunk)
        tier = workload_tier(traffic, plan.block_size, usable, plan.offload.num_chunks // max(1, plan.offload.groups),
                             plan.offload.blocks_per_chunk, eviction_policy, store_threshold)
    return workload_plan(traffic, plan.block_size, usable, groups, tier=tier,
                         max_num_batched_tokens=plan.capacity.limits.max_num_batched_tokens)


def render(plan: SizePlan) -> None:
    """The human report: inputs, per-token cost, budget terms, pool, table, verdict."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from kvplan.term import make_console

    console = make_console()
    console.soft_wrap = True  # lines keep their length (a terminal wraps them); tables still fit the width
    gpus = f"{plan.gpu_count}x {plan.gpu}" if plan.gpu_count > 1 else plan.gpu
    par = f"TP {plan.tensor_parallel_size}" + (f", PP {plan.pipeline_parallel_size}" if plan.pipeline_parallel_size > 1 else "")
    if plan.replicas > 1:
        par += f", {plan.replicas} replicas"
    console.print(f"[bold]{escape(plan.model)}[/] on [bold]{escape(gpus)}[/] ({par}), vLLM {escape(plan.vllm_version)} rules")
    detail = plan.model_source_detail.split(" (from ")[0]  # the profile's source URL is in --json
    console.print(f"  config: {escape(plan.model_source)} - {escape(detail)}")
    layout_style = "bold red" if plan.layout_source.startswith("unverified") else "default"
    console.print(f"  layout: [{layout_style}]{escape(plan.layout_source)}[/]")
    console.print(
        f"  attention: {plan.attention}; KV dtype {plan.kv_cache_dtype}; block {plan.block_size} tokens; "
        f"context {format_tokens(plan.max_model_len)}"
    )
    console.print()
    console.print(
        f"KV bytes per token: [bold]{plan.kv_bytes_per_token:,}[/] (model)  "
        f"{plan.kv_bytes_per_token_per_device:,.0f} per GPU  "
        f"{plan.kv_bytes_per_token_all_devices:,.0f} over all GPUs"
    )
    console.print(f"KV groups per GPU: {escape(describe_groups(plan))}; one block = {format_bytes(plan.block_bytes)}")
    console.print()

    budget = Table(title="KV budget per GPU", title_justify="left", show_edge=False)
    budget.add_column("term", no_wrap=True)
    budget.add_column("GiB", justify="right", no_wrap=True)
    budget.add_column("range", justify="right", no_wrap=True)
    budget.add_column("how", style="dim")
    for term in plan.memory_terms:
        sign = {1: "", -1: "- ", 0: ""}[term.sign]
        rng = "" if term.low_bytes == term.high_bytes else format_range(term.low_bytes / 2**30, term.high_bytes / 2**30)
        budget.add_row(Text(term.name), Text(f"{sign}{term.bytes / 2**30:.2f}"), Text(rng), Text(term.how))
    rng = format_range(plan.available_kv_bytes_low / 2**30, plan.available_kv_bytes_high / 2**30)
    budget.add_row("[bold]= available KV cache[/]", f"[bold]{plan.available_kv_bytes / 2**30:.2f}[/]",
                   rng if plan.available_kv_bytes_low != plan.available_kv_bytes_high else "", "")
    console.print(budget)
    console.print(f"weights: {format_bytes(plan.weights_total_bytes)} in all ({escape(plan.weights_source)})")
    console.print()
    printed = " and ".join(f"[bold]\"{escape(line)}\"[/]" for line in plan.vllm_startup_lines)
    if not printed:
        printed_what = "vLLM stops at start-up before printing its KV cache size (see the verdict)"
    else:
        printed_what = f"vLLM would print {printed}"
    console.print(f"Pool: [bold]{plan.num_blocks:,}[/] blocks -> {printed_what}")
    console.print(
        f"Requests of {_n(plan.request_tokens, 'token')} hold {_n(plan.blocks_per_request, 'block')} each: "
        f"[bold]{plan.max_concurrency_at_request:,}[/] fit at once; at concurrency {plan.concurrency} "
        f"the longest request that fits is {_n(plan.max_context_at_concurrency, 'token')}"
    )
    if plan.table:
        _render_table(console, plan)
    if plan.latency:
        lat = plan.latency
        console.print(
            f"Latency ({escape(str(lat['source']))}): TTFT ~{lat['ttft_ms']:,} ms for one prompt, TPOT ~{lat['tpot_ms']} ms "
            f"at this concurrency, E2E ~{lat['e2e_ms']:,} ms, ~{lat['output_tokens_per_s']:,} output tokens/s per replica"
        )
    console.print()
    if plan.fits and plan.range_note:  # holds at the estimate only: say so beside the verdict
        console.print(f"[bold yellow]FITS at the estimate[/]: {escape(plan.verdict)}")
        console.print(f"  [yellow]but[/] {escape(plan.range_note)}")
    else:
        color = "green" if plan.fits else "red"
        console.print(f"[bold {color}]{'FITS' if plan.fits else 'DOES NOT FIT'}[/]: {escape(plan.verdict)}")
        if plan.range_note:
            console.print(f"  [yellow]note:[/] {escape(plan.range_note)}")
    for s in plan.suggestions:
        mark = "[green]fits[/]" if s.fits else "[red]still short[/]"
        console.print(f"  - {escape(s.change)} ({escape(s.flags)}): {escape(s.result)} [{mark}]")
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if plan.workload is not None:
        _render_workload(console, plan.workload)
    if plan.offload is not None:
        _render_offload(console, plan.offload)
    if plan.pd_transfer is not None:
        _render_pd_transfer(console, plan.pd_transfer)
    label = "vLLM command" if plan.fits else "vLLM command for these settings (does not fit as is)"
    console.print(f"\n{label}:")
    console.print(plan.vllm_serve_command, soft_wrap=True, style="dim", markup=False)


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def describe_groups(plan: SizePlan) -> str:
    """``54 sliding_window layers (...) in 6 groups of 9, 10 full_attention layers (...) in 1 group of 10``: groups
    of one kind and shape together (``in 2 groups of 22 and 21`` where their sizes differ)."""
    sizes: dict[tuple, list[int]] = {}
    for g in plan.kv_groups:
        sizes.setdefault((g.kind, g.detail), []).append(g.layers + g.padding_layers)
    parts = []
    for (kind, detail), of in sizes.items():
        layers = sum(g.layers for g in plan.kv_groups if (g.kind, g.detail) == (kind, detail))
        head = f"{layers} {kind} layers ({detail})"
        each = str(of[0]) if len(set(of)) == 1 else ", ".join(map(str, of[:-1])) + f" and {of[-1]}"
        parts.append(head if len(plan.kv_groups) == 1 else f"{head} in {_n(len(of), 'group')} of {each}")
    padding = sum(g.padding_layers for g in plan.kv_groups)
    return ", ".join(parts) + (f", {padding} padding layers" if padding else "")


def _render_table(console, plan: SizePlan) -> None:
    from rich.table import Table
    from rich.text import Text

    contexts = sorted({c.context_tokens for c in plan.table})
    levels = sorted({c.concurrency for c in plan.table})
    cells = {(c.context_tokens, c.concurrency): c for c in plan.table}
    table = Table(title="Share of the KV pool (context x concurrent requests)", title_justify="left", show_edge=False)
    table.add_column("context", no_wrap=True)
    for level in levels:
        table.add_column(str(level), justify="right", no_wrap=True)
    for ctx in contexts:
        row = []
        for level in levels:
            cell = cells[(ctx, level)]
            pct = format_share(cell.pool_fraction, free=False)
            row.append(Text(pct, style="green" if cell.fits else "red"))  # a Text: no markup to parse
        table.add_row(Text(format_tokens(ctx)), *row)
    console.print(table)


def _render_offload(console, t) -> None:
    from rich.markup import escape

    chunks, held = t.describe()
    console.print(f"\n[bold]CPU offload tier[/] ({t.backend}, {t.size_gib:g} GiB over the ranks): {chunks}")
    console.print(f"  {held}")
    for note in t.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    r = t.reload
    if r is not None:
        console.print(f"  a tier hit's TTFT on an idle engine, reloaded over {escape(r.link)} ({r.link_gbps:g} GB/s at "
                      f"{r.efficiency:.0%}) or recomputed ({r.step_model} step time):")
        for row in r.rows:
            faster = "reload" if row.reload_ttft_s < row.recompute_ttft_s else "recompute"
            console.print(f"    {row.prompt_tokens:>8,} tokens: reload {row.reload_ttft_s:.3f} s, recompute "
                          f"{row.recompute_ttft_s:.3f} s ({faster} sooner)")
        crossover = (f"from {r.crossover_tokens:,} tokens" if r.crossover_tokens is not None
                     else "at no prompt length shown")
        console.print(f"  a reload serves sooner {crossover}")
        for note in r.notes:
            console.print(f"[yellow]note:[/] {escape(note)}")


def _render_pd_transfer(console, t) -> None:
    hit = f", {t.decode_hit_tokens:,} already in the decode's prefix cache" if t.decode_hit_tokens else ""
    console.print(f"\n[bold]P/D transfer[/] (NixlConnector, prefill TP {t.prefill_tp} -> decode TP {t.decode_tp}): a prompt of "
                  f"{t.prompt_tokens:,} tokens{hit} moves {t.blocks:,} blocks of {t.block_size} tokens")
    whole = " (whole blocks: the KV is replicated on the decode ranks)" if t.replicated else ""
    sources = ", ".join("+".join(map(str, s)) for s in t.sources_per_decode_rank)
    console.print(f"  each decode rank reads {format_bytes(t.bytes_per_decode_rank)}{whole} from prefill rank(s) "
                  f"{sources}; {format_bytes(t.total_bytes)} over all links, {t.transfers} NIXL reads")
    times = ", ".join(f"{name} {seconds * 1000:,.1f} ms" for name, seconds in t.transfer_s.items())
    console.print(f"  at least (the busiest NIC, no protocol overhead): {times}")


def _render_workload(console, w) -> None:
    from rich.markup import escape

    console.print(f"\n[bold]Prefix cache[/] for {escape(w.source)}: {w.requests:,} requests in {w.sessions:,} sessions, "
                  f"{w.queried_tokens:,} prompt tokens")
    console.print(f"  hits this pool keeps: {w.hit_rate_at_pool:.1%} of prompt tokens (any pool: at most "
                  f"{w.achievable_hit_rate:.1%})")
    for share, blocks in w.pool_for_share.items():
        used = w.pool_share_used[share]
        fits = "fits" if used <= 1 else "[red]more than this pool[/]"
        console.print(f"  {share} of the achievable hits: a pool of {blocks:,} blocks ({blocks * w.block_size:,} tokens), "
                      f"{format_share(used, free=False)} of this one: {fits}")
    console.print(f"  sessions held at once (their largest turns, the heaviest first): {w.sessions_held_at_once:,}")
    for note in w.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    t = w.tier
    if t is not None:
        tokens = t.blocks_per_chunk * w.block_size
        policy = t.eviction_policy.upper() + (f", store threshold {t.store_threshold}" if t.store_threshold >= 2 else "")
        console.print(f"\n[bold]With the CPU tier[/] ({t.tier_chunks:,} chunks of {tokens:,} tokens, {policy}): GPU hits "
                      f"{t.gpu_hit_rate:.1%}, tier hits {t.tier_hit_rate:.1%}, computed {t.miss_rate:.1%} of prompt tokens "
                      f"(a tier that never evicts: {t.unbounded_tier_hit_rate:.1%})")
        if not t.unbounded_tier_hit_rate:
            console.print("  the GPU pool keeps every hit a tier could add")
        for share, chunks in t.tier_for_share.items() if t.unbounded_tier_hit_rate else ():
            used = t.tier_share_used[share]
            fits = "fits" if used <= 1 else "[red]more than this tier[/]"
            console.print(f"  {share} of an unbounded tier's hits: {chunks:,} chunks ({chunks * tokens:,} tokens), "
                          f"{format_share(used, free=False)} of this one: {fits}")
        for note in t.notes:
            console.print(f"[yellow]note:[/] {escape(note)}")
