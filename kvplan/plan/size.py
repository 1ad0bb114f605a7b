"""Assemble the answer of `kvplan size`: capacity + workload -> SizePlan. Pure."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, replace

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device, GpuSelection
from kvplan.model.arch import Architecture
from kvplan.plan.capacity import (
    Capacity,
    blocks_needed,
    compute_capacity,
    extensible_kv_cache,
    extensible_margin,
    gpu_memory_utilization,
    max_concurrency_for,
    max_context_for,
    request_load,
)
from kvplan.plan.disagg import pd_transfer
from kvplan.plan.fit import FitRequest, search
from kvplan.plan.offload import offload_tier_for, tier_reload
from kvplan.plan.overhead import STARTUP_BYTES, OverheadModel
from kvplan.plan.schema import (
    ConcurrencyCell,
    KVGroupInfo,
    MemoryTerm,
    PDTransferPlan,
    Settings,
    SizePlan,
    Suggestion,
)
from kvplan.plan.steptime import model_for, quick_latency
from kvplan.units import GiB, cdiv, format_bytes, format_share, format_tokens
from kvplan.vllm.args import engine_args
from kvplan.vllm.rules import VllmRules


@dataclass(frozen=True)
class ModelRef:
    """Which model, and where its config came from (for the report)."""

    name: str
    source: str  # local | hub | hub-cache | bundled
    detail: str
    weights_total: int | None = None  # exact, from safetensors metadata, when known
    weights_source: str = "estimated from config.json"


@dataclass(frozen=True)
class Verdict:
    fits: bool
    reason: str
    limiting_term: str


def verdict_for(cap: Capacity, replicas: int) -> Verdict:
    """Does the asked concurrency of asked requests fit, and if not, what binds."""
    s = cap.settings
    work = request_load(s, cap.max_model_len)
    per_replica = cdiv(work.concurrency, replicas)
    if cap.context_too_long:
        return Verdict(
            False,
            f"vLLM refuses --max-model-len {cap.max_model_len:,}: the model's maximum is "
            f"{cap.arch.max_model_len_limit:,} (max_position_embeddings, with its RoPE scaling)",
            "max_model_len",
        )
    if cap.num_blocks <= 0:
        return Verdict(False, "no memory is left for the KV cache after weights and overhead", "weights")
    if not cap.engine_starts:
        est = cap.estimated_max_model_len()
        return Verdict(
            False,
            f"vLLM will not start: one {cap.max_model_len:,}-token request needs "
            f"{format_bytes(cap.needed_for_max_model_len())} of KV but "
            f"{format_bytes(cap.max_len_check_bytes)} is available (vLLM's estimated maximum "
            f"model length: {est:,})",
            "max_model_len",
        )
    asked_kv = s.kv_cache_memory_bytes
    if asked_kv and asked_kv + cap.limiting_stage.weights > cap.device.cuda_total_bytes:
        return Verdict(
            False,
            f"--kv-memory {format_bytes(asked_kv)} plus {format_bytes(cap.limiting_stage.weights)} of weights exceed "
            f"the GPU's {format_bytes(cap.device.cuda_total_bytes)}: vLLM cannot allocate it",
            "KV memory",
        )
    need = blocks_needed(cap, per_replica, work.request_tokens, work.shared_prefix_tokens)
    if need > cap.usable_blocks:
        fit = max_concurrency_for(cap, work.request_tokens, work.shared_prefix_tokens) * replicas
        return Verdict(
            False,
            f"{work.concurrency} requests of {work.request_tokens:,} tokens need {need:,} blocks per replica; "
            f"the pool has {cap.usable_blocks:,} usable: {fit} fit at once, the rest wait or are preempted",
            "KV pool",
        )
    if per_replica > cap.limits.max_num_seqs:
        return Verdict(
            False,
            f"{per_replica} requests per replica exceed max_num_seqs {cap.limits.max_num_seqs}: the rest queue",
            "max_num_seqs",
        )
    margin = 1 - need / cap.usable_blocks
    headroom = format_share(margin, free=True)  # never claims 100% with a block in use
    noun = "request" if work.concurrency == 1 else "requests"
    return Verdict(
        True,
        f"{work.concurrency} {noun} of {work.request_tokens:,} tokens {'pins' if work.concurrency == 1 else 'pin'} "
        f"{need:,} of {cap.usable_blocks:,} usable "
        f"blocks per replica ({headroom} headroom)",
        "none",
    )


def range_note(cap: Capacity, replicas: int, verdict: Verdict) -> str | None:
    """Where the verdict does not hold over the whole budget range (the overhead terms' ranges):
    a FITS whose low end does not fit (vLLM might not start, or the load might not fit), or a
    DOES NOT FIT whose high end would fit. None when the verdict holds at both ends."""
    if cap.context_too_long:  # no budget changes that (a given --kv-memory has no range at all)
        return None
    edge = "low" if verdict.fits else "high"
    other = cap.at_budget_edge(edge)
    there = verdict_for(other, replicas)
    if there.fits == verdict.fits:
        return None
    budget = format_bytes(other.limiting_stage.available.bytes)
    if verdict.fits:
        return (f"not across the budget range: at its low end ({budget} of KV memory, {other.usable_blocks:,} usable "
                f"blocks) {there.reason[0].lower()}{there.reason[1:]}")
    return (f"at the high end of the budget range ({budget} of KV memory, {other.usable_blocks:,} usable blocks) it "
            f"would fit: {there.reason}")


def _group_info(g) -> KVGroupInfo:
    """One KV group as `size` shows it; a packed group (several caches in one block table) names each."""
    if len(g.layers) == 1:
        return KVGroupInfo(kind=g.kind, layers=g.num_layers, padding_layers=g.padding_layers, block_size=g.block_size,
                           detail=g.spec.describe())
    kinds = "+".join(dict.fromkeys(spec.kind for spec, _ in g.layers))
    detail = " + ".join(f"{n} x {spec.describe()}" for spec, n in g.layers)
    return KVGroupInfo(kind=kinds, layers=g.num_layers, padding_layers=g.padding_layers, block_size=g.block_size,
                       detail=detail)


def _memory_terms(cap: Capacity) -> list[MemoryTerm]:
    st = cap.limiting_stage
    d = cap.device
    util = gpu_memory_utilization(cap.settings, cap.rules, d)
    if d.source == "--gpu-mem":
        total_how = "given by --gpu-mem"
    elif d.cuda_total_measured:
        total_how = "measured cudaMemGetInfo total"
    else:
        total_how = "driver total minus the catalog's median driver reserve"
    terms = [
        MemoryTerm(name="GPU memory (CUDA total)", bytes=d.cuda_total_bytes, low_bytes=d.cuda_total_bytes,
                   high_bytes=d.cuda_total_bytes, sign=0, how=total_how),
    ]
    if cap.settings.kv_cache_memory_bytes:
        terms.append(MemoryTerm(name="KV cache memory (--kv-memory)", bytes=st.available.bytes,
                                low_bytes=st.available.bytes, high_bytes=st.available.bytes, sign=1,
                                how="given; the budget model is skipped"))
        return terms
    if extensible_kv_cache(cap.settings, cap.rules, d):
        return terms + _measured_terms(cap, util)
    terms += [
        MemoryTerm(name=f"x gpu_memory_utilization {util:g}", bytes=st.requested, low_bytes=st.requested,
                   high_bytes=st.requested, sign=1, how="vLLM's requested memory"),
        MemoryTerm(name="weights", bytes=st.weights, low_bytes=st.weights, high_bytes=st.weights, sign=-1,
                   how="per device"),
        MemoryTerm(name="activation peak (profile run)", bytes=st.activation.bytes, low_bytes=st.activation.low,
                   high_bytes=st.activation.high, sign=-1,
                   how=f"max_num_seqs {cap.limits.max_num_seqs} x vocab logits, "
                       f"{cap.limits.max_num_batched_tokens} batched tokens"
                       + (", or the vision encoder's pass if higher" if cap.arch.vision_encoder else "")),
        MemoryTerm(name="non-torch memory", bytes=st.non_torch.bytes, low_bytes=st.non_torch.low,
                   high_bytes=st.non_torch.high, sign=-1, how="NCCL, cuBLAS, CUDA context growth"),
    ]
    if cap.rules.subtracts_cudagraph_memory:
        how = "--enforce-eager: none" if cap.settings.enforce_eager else "estimated; subtracted from vLLM 0.20"
        terms.append(MemoryTerm(name="CUDA graphs", bytes=st.cudagraphs.bytes, low_bytes=st.cudagraphs.low,
                                high_bytes=st.cudagraphs.high, sign=-1, how=how))
    return terms


def _measured_terms(cap: Capacity, util: float) -> list[MemoryTerm]:
    """The extensible KV cache's budget (vLLM 0.34+ on CUDA, `measure_kv_cache_bytes`), term by term: the
    smaller of the requested memory and the free memory at start-up less the margin, then everything used
    after warmup and the transient peak kept free (the activation peak and the CUDA graph estimate)."""
    st = cap.limiting_stage
    act, graphs, other = st.activation, st.cudagraphs, st.non_torch
    low_start, start, high_start = STARTUP_BYTES
    total = cap.device.cuda_total_bytes

    def margin(transient: int) -> int:
        return extensible_margin(transient, cap.device)

    used = st.weights + other.bytes + graphs.bytes
    if st.requested - used <= total - start - used - margin(act.bytes + graphs.bytes):
        terms = [MemoryTerm(name=f"x gpu_memory_utilization {util:g}", bytes=st.requested, low_bytes=st.requested,
                            high_bytes=st.requested, sign=1, how="vLLM's requested memory (binds)")]
    else:
        terms = [
            MemoryTerm(name="free at vLLM's first snapshot", bytes=total - start, low_bytes=total - high_start,
                       high_bytes=total - low_start, sign=1,
                       how=f"CUDA total less the CUDA context (assumed); binds before x {util:g}"),
            MemoryTerm(name="sizing margin", bytes=margin(act.bytes + graphs.bytes),
                       low_bytes=margin(act.low + graphs.low), high_bytes=margin(act.high + graphs.high), sign=-1,
                       how="max(1 GiB (ROCm 3), 0.75 x transient peak)"),
        ]
    return terms + [
        MemoryTerm(name="weights", bytes=st.weights, low_bytes=st.weights, high_bytes=st.weights, sign=-1,
                   how="per device"),
        MemoryTerm(name="non-torch memory", bytes=other.bytes, low_bytes=other.low, high_bytes=other.high, sign=-1,
                   how="NCCL, cuBLAS, CUDA context growth"),
        MemoryTerm(name="CUDA graphs", bytes=graphs.bytes, low_bytes=graphs.low, high_bytes=graphs.high, sign=-1,
                   how="--enforce-eager: none" if cap.settings.enforce_eager else "captured before the pool is sized"),
        MemoryTerm(name="transient peak kept free", bytes=act.bytes + graphs.bytes, low_bytes=act.low + graphs.low,
                   high_bytes=act.high + graphs.high, sign=-1,
                   how="activation peak + CUDA graph estimate"),
    ]


def _table(cap: Capacity, replicas: int, request_tokens: int, concurrency: int,
           shared_prefix: int = 0) -> list[ConcurrencyCell]:
    """Each cell: ``c`` requests of ``ctx`` tokens, sharing the asked prefix where it fits."""
    contexts = sorted({max(1, cap.max_model_len // 8), max(1, cap.max_model_len // 4),
                       max(1, cap.max_model_len // 2), cap.max_model_len, request_tokens})
    levels = sorted({1, 2, 4, 8, 16, 32, 64, 128, concurrency})
    cells = []
    for ctx in contexts:
        for c in levels:
            per_replica = cdiv(c, replicas)
            need = blocks_needed(cap, per_replica, ctx, min(shared_prefix, ctx))
            frac = need / cap.usable_blocks if cap.usable_blocks else float("inf")
            cells.append(ConcurrencyCell(context_tokens=ctx, concurrency=c, blocks_needed=need,
                                         pool_fraction=round(frac, 4), fits=frac <= 1))
    return cells


def serve_command(model: str, cap: Capacity, replicas: int = 1) -> str:
    """The `vllm serve` line for these settings (one per data-parallel group of GPUs)."""
    s = cap.settings
    values = replace(  # what the plan resolved, where the user's value alone would not say it
        engine_args(s),
        max_model_len=cap.max_model_len,
        data_parallel_size=replicas if replicas > 1 else None,
        enable_expert_parallel=s.enable_expert_parallel or None,
        # an explicit KV size makes vLLM's budget ignore the utilization: print only the one that counts
        gpu_memory_utilization=None if s.kv_cache_memory_bytes else (s.gpu_memory_utilization or None),
        kv_cache_dtype=cap.dtype.name if s.kv_cache_dtype != "auto" else None,
        block_size=cap.block_size if s.block_size else None,
        max_num_seqs=(max(s.max_num_seqs or 0, s.concurrency)
                      if s.max_num_seqs or s.concurrency > cap.limits.max_num_seqs else None),
    )
    args = ["vllm", "serve", model, *values.flags()]
    line = shlex.join(args)
    if s.draft_layers and not s.speculative:
        line += "  # plus your --speculative-config (its draft layers share this KV pool)"
    return line


def gpu_flag(device: Device, count: int) -> str:
    """``--gpu`` value the catalog reads back: ``2xA100-40GB-SXM``."""
    return f"{count}x{device.name.replace(' ', '-')}"


def _suggestions(
    arch: Architecture, gpu: GpuSelection, settings: Settings, rules: VllmRules, overhead: OverheadModel,
    cap: Capacity, replicas: int, catalog: list[Device], weights_total: int | None,
) -> list[Suggestion]:
    """What would fit: single changes (a context cap, fp8 KV, a lower concurrency, max_num_seqs) and
    `kvplan fit`'s search for more or other GPUs (`_searched`), each re-planned: its verdict from
    the planner itself."""
    out: list[Suggestion] = []
    work = request_load(settings, cap.max_model_len)
    pool_pinned = settings.num_gpu_blocks_override is not None
    limit = min(cap.max_model_len, cap.arch.max_model_len_limit or cap.max_model_len)
    budget = suggestion_budget(cap.usable_blocks)

    def attempt(change: str, flags: str, updates: dict[str, str], **changes) -> None:
        device = changes.pop("device", gpu.device)
        count = changes.pop("count", gpu.count)
        try:
            new = settings.replace(**changes)
            dp = max(1, count // (new.tensor_parallel_size * new.pipeline_parallel_size))
            new = new.replace(data_parallel_size=dp)
            alt = compute_capacity(arch, device, new, rules, overhead, weights_total)
            v = verdict_for(alt, dp)
        except (KvplanError, ValueError):
            return
        out.append(Suggestion(change=change, flags=flags, result=v.reason, fits=v.fits, updates=updates))

    per_replica = cdiv(work.concurrency, replicas)
    # The longest context at which the asked concurrency fits (and vLLM accepts and starts).
    ctx = max_context_for(cap, per_replica if settings.prompt_tokens is None else 1, limit, pool_blocks=budget)
    if cap.context_too_long or not cap.engine_starts or settings.prompt_tokens is None:
        ctx = round_context(min(ctx, limit))
        if ctx >= 256 and ctx < cap.max_model_len and (settings.prompt_tokens or 0) + (settings.output_tokens or 0) <= ctx:
            attempt("cap the context", f"--ctx {ctx}", {"max_model_len": str(ctx)}, max_model_len=ctx)
    if cap.context_too_long:  # nothing else helps a context vLLM refuses
        return out
    if not pool_pinned and cap.dtype.bytes_per_element >= 2:
        attempt("fp8 KV cache", "--kv-cache-dtype fp8", {"kv_cache_dtype": "fp8"}, kv_cache_dtype="fp8")
    if cap.engine_starts:
        conc = max_concurrency_for(cap, work.request_tokens, work.shared_prefix_tokens, pool_blocks=budget) * replicas
        if 0 < conc < work.concurrency:
            n = min(conc, cap.limits.max_num_seqs * replicas)
            noun = "request" if n == 1 else "requests"
            out.append(Suggestion(change="lower the concurrency", flags=f"--concurrency {n}",
                                  result=f"{n} {noun} of {work.request_tokens:,} tokens fit at once", fits=True,
                                  updates={"concurrency": str(n)}))
        if per_replica > cap.limits.max_num_seqs and conc >= work.concurrency:
            attempt("raise max_num_seqs", f"--max-num-seqs {per_replica}", {"max_num_seqs": str(per_replica)},
                    max_num_seqs=per_replica)
    if not pool_pinned:
        for cand in _searched(arch, gpu, settings, rules, overhead, cap, catalog, weights_total):
            split = _split_text(cand.tp, cand.pp, cand.dp)
            flag = gpu_flag(cand.device, cand.gpus)
            # --tp whenever the CLI's and kvplan.yaml's default (all GPUs / pp) would pick another one,
            # as it would for data-parallel replicas.
            tp_given = cand.tp != settings.tensor_parallel_size or cand.tp != max(1, cand.gpus // cand.pp)
            flags = f"--gpu {flag}" + (f" --tp {cand.tp}" if tp_given else "") \
                + (f" --pp {cand.pp}" if cand.pp != settings.pipeline_parallel_size else "")
            updates = {"gpu": flag}
            if tp_given:
                updates["tensor_parallel_size"] = str(cand.tp)
            if cand.pp != settings.pipeline_parallel_size:
                updates["pipeline_parallel_size"] = str(cand.pp)
            if cand.device.name == gpu.device.name:
                change = f"{split or 'data parallel'} on {cand.gpus} GPUs"
            else:
                size = "a bigger" if cand.device.cuda_total_bytes > gpu.device.cuda_total_bytes else "another"
                change = f"{size} GPU: {cand.gpus} x {cand.device.name}" + (f", {split}" if split else "")
            attempt(change, flags, updates, device=cand.device, count=cand.gpus, tensor_parallel_size=cand.tp,
                    pipeline_parallel_size=cand.pp)
    fitting = [sug for sug in out if sug.fits]
    return fitting or out  # the changes that fit; failing that, how close each one gets


#: The most GPUs a "what would fit" suggestion proposes (or twice the asked count, when more).
MAX_SUGGESTED_GPUS = 8
#: A suggestion leaves at least this share of the usable KV pool free: a plan at 0-1% headroom waits or
#: preempts at the first request a few blocks longer than asked, and no SRE would roll it out.
MIN_SUGGESTED_HEADROOM = 0.10
#: "Another GPU" comes from the asked GPU's class, then from the classes above it: a datacenter ask is
#: never offered a desktop part (profiles/gpus.json "class").
GPU_CLASSES = ("desktop", "workstation", "datacenter")


def suggestion_budget(usable_blocks: int) -> int:
    """The blocks a suggested plan may use: the usable pool less `MIN_SUGGESTED_HEADROOM`."""
    return math.floor(usable_blocks * (1 - MIN_SUGGESTED_HEADROOM))


def round_context(tokens: int) -> int:
    """A context cap as people write it: down to a multiple of 1,024 from 2,048 tokens, of 256 below."""
    step = 1024 if tokens >= 2048 else 256
    return tokens // step * step


def _split_text(tp: int, pp: int, dp: int) -> str:
    parts = [f"tensor parallel {tp}"] if tp > 1 else []
    parts += [f"pipeline parallel {pp}"] if pp > 1 else []
    parts += [f"{dp} replicas"] if dp > 1 else []
    return " x ".join(parts)


def _searched(arch: Architecture, gpu: GpuSelection, settings: Settings, rules: VllmRules, overhead: OverheadModel,
              cap: Capacity, catalog: list[Device], weights_total: int | None) -> list:
    """What would fit from `kvplan fit`'s search (kvplan.plan.fit.search), at the asked context and
    KV dtype (those are single changes of their own): the fewest GPUs of the asked type (any TP / PP /
    DP split, user's count included); then the fewest of one other type, the asked vendor's before
    another's, smaller GPUs first, only with fewer GPUs than scaling out needs (else it adds nothing).
    Bounded: one GPU type up to `MAX_SUGGESTED_GPUS`, the others below the scale-out count."""

    work = request_load(settings, cap.max_model_len)
    top = min(64, max(MAX_SUGGESTED_GPUS, 2 * gpu.count))

    def best(devices: list[Device], max_gpus: int):
        if max_gpus < 1 or not devices:
            return None
        req = FitRequest(ctx=cap.max_model_len, concurrency=work.concurrency, prompt=settings.prompt_tokens,
                         output=settings.output_tokens, shared_prefix=work.shared_prefix_tokens, max_gpus=max_gpus,
                         kv_dtypes=(settings.kv_cache_dtype,))
        try:
            found = search(arch, devices, req, rules, overhead, weights_total, settings)
        except KvplanError:
            return None
        return next((c for c in found.fitting if c.ctx == cap.max_model_len and c.headroom >= MIN_SUGGESTED_HEADROOM),
                    None)

    out = []
    same = best([gpu.device], top)
    if same is not None:
        out.append(same)
    others = sorted((d for d in catalog if d.name != gpu.device.name), key=lambda d: d.cuda_total_bytes)
    limit = top if same is None else same.gpus - 1
    asked = GPU_CLASSES.index(gpu.device.gpu_class) if gpu.device.gpu_class in GPU_CLASSES else len(GPU_CLASSES) - 1
    groups = [[d for d in others if d.gpu_class == cls and (d.vendor == gpu.device.vendor) == same_vendor]
              for cls in GPU_CLASSES[asked:] for same_vendor in (True, False)]
    for group in groups:  # the asked class first, the asked vendor first within it
        other = best(group, limit)
        if other is not None:
            out.append(other)
            break
    return out


def plan_size(
    ref: ModelRef,
    arch: Architecture,
    gpu: GpuSelection,
    settings: Settings,
    rules: VllmRules,
    overhead: OverheadModel,
    catalog: list[Device] | None = None,
    steptime: object | None = None,
    suggest: bool = True,
) -> SizePlan:
    """``steptime``: a calibrated kvplan.plan.steptime.StepTimeModel (else the device's prior). ``suggest``: search
    the changes that would make a plan that does not fit fit (the costly part; a log check needs none)."""
    world = settings.tensor_parallel_size * settings.pipeline_parallel_size
    if gpu.count < world:
        raise KvplanError(
            f"tp {settings.tensor_parallel_size} x pp {settings.pipeline_parallel_size} needs {world} GPUs, "
            f"{gpu.count} given",
            f"use --gpu {gpu_flag(gpu.device, world)}",
        )
    if gpu.count % world:
        raise KvplanError(f"{gpu.count} GPUs do not split into replicas of tp x pp = {world}")
    replicas = gpu.count // world
    settings = settings.replace(data_parallel_size=replicas)  # vLLM's --data-parallel-size
    cap = compute_capacity(arch, gpu.device, settings, rules, overhead, ref.weights_total)
    work = request_load(settings, cap.max_model_len)
    verdict = verdict_for(cap, replicas)
    across = range_note(cap, replicas, verdict)
    per_replica = cdiv(work.concurrency, replicas)
    layout = cap.layout
    per_device = layout.kv_bytes_per_token()
    # Logical (unsharded) bytes per token: the figure articles quote.
    logical = sum(s.bytes_per_token(cap.dtype) for s in arch.layers)
    all_devices = sum(
        st.layout.kv_bytes_per_token() for st in cap.stages
    ) * settings.tensor_parallel_size * replicas
    suggestions = [] if verdict.fits or not suggest else _suggestions(
        arch, gpu, settings, rules, overhead, cap, replicas, catalog or [], ref.weights_total
    )
    return SizePlan(
        model=ref.name,
        model_source=ref.source,
        model_source_detail=ref.detail,
        gpu=gpu.device.name,
        gpu_count=gpu.count,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        replicas=replicas,
        vllm_version=rules.version,
        attention=arch.attention_label,
        kv_cache_dtype=cap.dtype.name,
        kv_bytes_per_token=int(round(logical)),
        kv_bytes_per_token_per_device=per_device,
        kv_bytes_per_token_all_devices=all_devices,
        block_size=cap.block_size,
        block_bytes=layout.block_bytes,
        kv_groups=[_group_info(g) for g in layout.groups],
        memory_terms=_memory_terms(cap),
        available_kv_bytes=cap.limiting_stage.available.bytes,
        available_kv_bytes_low=cap.limiting_stage.available.low,
        available_kv_bytes_high=cap.limiting_stage.available.high,
        weights_bytes=cap.limiting_stage.weights,
        weights_total_bytes=cap.weights_total,
        weights_source=ref.weights_source if not settings.weights_bytes else "given (--weights-memory)",
        num_blocks=cap.num_blocks,
        kv_cache_tokens=cap.kv_cache_tokens_reported if cap.num_blocks > 0 else 0,
        max_model_len=cap.max_model_len,
        max_concurrency=round(cap.max_concurrency_reported, 4) if cap.num_blocks > 0 else 0.0,
        request_tokens=work.request_tokens,
        concurrency=work.concurrency,
        blocks_per_request=cap.blocks_per_request(work.request_tokens),
        max_concurrency_at_request=max_concurrency_for(cap, work.request_tokens, work.shared_prefix_tokens) * replicas,
        max_context_at_concurrency=max_context_for(cap, per_replica, cap.max_model_len, work.shared_prefix_tokens),
        max_num_seqs=cap.limits.max_num_seqs,
        max_num_batched_tokens=cap.limits.max_num_batched_tokens,
        fits=verdict.fits,
        fits_across_range=verdict.fits and across is None,
        range_note=across,
        verdict=verdict.reason if arch.layout_verified else f"UNVERIFIED LAYOUT ({arch.layout_source}): {verdict.reason}",
        limiting_term=verdict.limiting_term,
        table=_table(cap, replicas, work.request_tokens, work.concurrency, work.shared_prefix_tokens)
        if cap.num_blocks > 0 else [],
        suggestions=suggestions,
        vllm_serve_command=serve_command(ref.name, cap, replicas),
        notes=list(cap.notes) + _offload_notes(settings),
        layout_source=arch.layout_source,
        vllm_startup_lines=startup_lines(cap),
        latency=_latency(cap, settings, per_replica, steptime) if verdict.fits else None,
        offload=_offload(cap, settings, steptime) if settings.kv_offloading_size else None,
        pd_transfer=_pd_transfer(cap, settings) if settings.pd_decode_tp else None,
    ).with_capacity(cap)


# One NIC per GPU: 200, 400 and 800 Gb/s (InfiniBand HDR / NDR / XDR, or RoCE of the same rates), in GB/s.
PD_LINKS_GB_PER_S = {"200 Gb/s NIC": 25.0, "400 Gb/s NIC": 50.0, "800 Gb/s NIC": 100.0}


def _pd_transfer(cap: Capacity, settings: Settings) -> PDTransferPlan:
    prompt = settings.pd_prompt_tokens or cap.max_model_len
    if prompt > cap.max_model_len:
        raise KvplanError(f"--pd-prompt {prompt:,} is longer than the context length {cap.max_model_len:,}")
    t = pd_transfer(cap, settings.pd_decode_tp, prompt, settings.pd_decode_hit_tokens)
    links = dict(PD_LINKS_GB_PER_S)
    if settings.pd_link_gb_per_s:
        links[f"{settings.pd_link_gb_per_s:g} GB/s (given)"] = settings.pd_link_gb_per_s
    return PDTransferPlan(
        prompt_tokens=t.prompt_tokens, decode_hit_tokens=t.decode_hit_tokens, block_size=t.block_size,
        blocks=t.blocks, prefill_tp=t.prefill_tp, decode_tp=t.decode_tp, replicated=t.replicated,
        decode_block_bytes=t.decode_block_bytes, bytes_per_decode_rank=t.reads[0].bytes,
        sources_per_decode_rank=[list(r.sources) for r in t.reads], sent_per_prefill_rank=list(t.sent_per_prefill_rank),
        total_bytes=t.total_bytes, transfers=t.transfers,
        transfer_s={name: round(t.transfer_s(rate), 6) for name, rate in links.items()})


def _offload(cap: Capacity, settings: Settings, steptime: object | None):
    """The CPU tier, with reload vs recompute where the catalog knows the GPU's host link and the step-time
    model can be built (one KV group only: sliding-window and recurrent groups reload part of a prefix)."""
    tier = offload_tier_for(cap, settings.kv_offloading_size, settings.kv_offloading_backend or "native")
    host = settings.host_memory_bytes
    if tier is not None and host and tier.host_bytes > host:
        pinned = " (pinned tensors, each rounded up to a power of two)" if cap.rules.offload_memory == "pinned" else ""
        raise KvplanError(f"the CPU offload tier of {settings.kv_offloading_size:g} GiB takes "
                          f"{tier.host_bytes / GiB:,.2f} GiB of host memory on {cap.rules.label}{pinned}, more than "
                          f"the host's {host / GiB:,.2f} GiB", "lower --kv-offloading-size, or give the host's RAM "
                          "with --host-memory")
    device = cap.device
    if tier is None or not device.host_link_gbps or cap.layout.num_kv_groups != 1 or cap.has_state:
        return tier
    try:
        model = steptime or model_for(cap)
    except KvplanError:
        return tier  # no bandwidth / TFLOP/s for this device in the catalog
    notes = ()
    if cap.arch.params.experts and model.source == "prior":
        notes = ("MoE: the prior step time counts every routed expert's FLOPs (kvplan.plan.steptime), so recomputing "
                 "is slower here than on the engine and reloading looks better than it is; calibrate on a bench run",)
    reload = tier_reload(cap.layout, device.host_link or "host link", device.host_link_gbps, model,
                         cap.limits.max_num_batched_tokens, cap.max_model_len, notes=notes)
    return replace(tier, reload=reload)


def _offload_notes(settings: Settings) -> list[str]:
    if settings.kv_offloading_backend == "lmcache":
        return ["--kv-offloading-backend lmcache: the LMCache server holds the tier's capacity (vLLM 0.32 passes it no "
                "size), so kvplan sizes no CPU tier"]
    if settings.kv_offloading_backend and not settings.kv_offloading_size:
        return ["--kv-offloading-backend without --kv-offloading-size: vLLM turns offloading on only with a size"]
    return []


def _latency(cap: Capacity, settings: Settings, per_replica: int, steptime: object | None) -> dict | None:
    """A step-time estimate for the asked workload (only with --prompt): TTFT of one prompt alone,
    TPOT at the asked concurrency per replica, E2E, output tokens/s per replica."""
    if settings.prompt_tokens is None:
        return None

    source = "calibrated on a bench run (kvplan calibrate --bench)"
    model = steptime
    if model is None:
        try:
            model = model_for(cap)
        except KvplanError:
            return None  # no bandwidth / TFLOP/s for this device in the catalog
        source = "prior: roofline x assumed efficiencies (uncalibrated)"
    est = quick_latency(model, settings.prompt_tokens, max(1, settings.output_tokens or 1), per_replica)
    return {"ttft_ms": round(est["ttft_s"] * 1000, 1), "tpot_ms": round(est["tpot_s"] * 1000, 2),
            "e2e_ms": round(est["e2e_s"] * 1000, 1),
            "output_tokens_per_s": round(est["output_tokens_per_s"], 1), "source": source}


def startup_lines(cap: Capacity) -> list[str]:
    """"GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per request: X.XXx":
    two lines up to 0.27, one from 0.28 (`_report_kv_cache_config`). None when vLLM stops first:
    `_check_enough_kv_cache_memory` raises before the report when no memory is left or one
    max-length request does not fit (v1/core/kv_cache_utils.py@0.32.0)."""
    if not cap.engine_starts:  # also no blocks, or a context beyond the model's
        return []
    tokens = f"GPU KV cache size: {cap.kv_cache_tokens_reported:,} tokens"
    concurrency = (f"Maximum concurrency for {cap.max_model_len:,} tokens per request: "
                   f"{cap.max_concurrency_reported:.2f}x")
    return [f"{tokens}, {concurrency}"] if cap.rules.combined_capacity_line else [tokens, concurrency]


__all__ = ["ModelRef", "plan_size", "serve_command", "verdict_for", "format_tokens"]
