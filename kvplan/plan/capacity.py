"""The capacity plan: architecture + device + settings -> pool, blocks, tokens, verdict. Pure.

Every formula of the KV budget lives here or in `layout.py`, named after the vLLM code it
follows. Per device (one TP rank of the most constrained pipeline stage):

    requested  = cuda_total * gpu_memory_utilization        (gpu_worker.determine_available_memory)
    available  = requested - weights - activation_peak - non_torch [- cuda_graphs, vLLM >= 0.20]
    num_blocks = available // page_bytes // group_size      (kv_cache_utils.get_num_blocks)

``--kv-memory`` (vLLM's ``--kv-cache-memory-bytes``) replaces ``available``; the engine then
takes the minimum ``num_blocks`` over all workers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Literal

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device
from kvplan.model.arch import Architecture
from kvplan.model.dtypes import KVDtype, kv_dtype
from kvplan.model.layers import (
    MLA,
    ChunkedLocal,
    CompressedMLA,
    LayerSpec,
    MambaState,
    MLAIndexer,
    OwnDtype,
    RequestContext,
    SlidingMLA,
)
from kvplan.model.weights import mxfp4_kernel_for, routed_expert_bytes, weight_bytes
from kvplan.plan.layout import KVLayout, build_layout, map_distinct, with_tp
from kvplan.plan.overhead import STARTUP_BYTES, Estimate, OverheadModel
from kvplan.plan.schema import Settings
from kvplan.plan.speculative import SpeculativeConfig
from kvplan.units import GiB, cdiv, format_bytes
from kvplan.vllm.platforms import Platform
from kvplan.vllm.rules import VllmRules, parse_version

MLA_BLOCK_SIZE = 64  # FlashMLA (Hopper); vLLM forces it for MLA models
MLA_BLOCK_SIZE_BLACKWELL = 128  # CUTLASS MLA on Blackwell (vLLM >= 0.11)
# `measure_kv_cache_bytes` (v1/worker/extensible_kv_cache.py@0.34.0:64-65) keeps free a margin of
# max(KV_CACHE_MARGIN_FLOOR_BYTES, KV_CACHE_MARGIN_FRACTION x the transient peak): 1 GiB (3 GiB on ROCm) and 0.75.
EXTENSIBLE_MARGIN_FLOOR_BYTES = 1 << 30
EXTENSIBLE_MARGIN_FLOOR_BYTES_ROCM = 3 << 30
EXTENSIBLE_MARGIN_FRACTION = 0.75


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int


def default_scheduler_limits(
    device: Device, usage_context: str, rules: VllmRules, max_model_len: int = 0, world_size: int = 1
) -> SchedulerLimits:
    """vLLM's defaults (`engine/arg_utils.py::_set_default_args`): larger on >= 70 GiB GPUs
    other than the A100 (a large batch hurt its throughput); 0.33 adds a >= 160 GiB tier
    where `vllm serve` also batches 16,384 tokens. The V0 engine had chunked prefill off up
    to 32K contexts and then batched a whole context: ``max(max_model_len, 2048)``."""
    if rules.engine == "v0":
        return SchedulerLimits(256, max(max_model_len, 2048) if max_model_len <= 32768 else 2048)
    if device.platform.default_limits:
        seqs, batched = dict(device.platform.default_limits)[usage_context]
        return SchedulerLimits(seqs * world_size, batched * world_size)
    total = device.cuda_total_bytes
    big = total >= 70 * GiB and "a100" not in device.name.lower()
    if rules.big_gpu_tier and total >= 160 * GiB:
        return SchedulerLimits(1024, 16384)
    if usage_context == "llm":
        return SchedulerLimits(1024 if big else 256, 16384 if big else 8192)
    return SchedulerLimits(1024 if big else 256, 8192 if big else 2048)


def pipeline_stages(num_layers: int, pp: int) -> list[range]:
    """`vllm.distributed.utils.get_pp_indices`: remainder layers go to the stages before the last."""
    if pp > num_layers:
        raise KvplanError(f"pipeline parallel size {pp} exceeds the model's {num_layers} layers")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def resolve_kv_dtype(arch: Architecture, name: str, rules: VllmRules) -> KVDtype:
    """``auto``: the model's dtype, or (vLLM >= 0.19.1) the checkpoint's KV scheme."""
    if name == "auto":
        if rules.sparse_mla_auto_fp8 and any(isinstance(s, MLAIndexer) for s in arch.layers):
            return kv_dtype("fp8_ds_mla")  # DeepseekV32ForCausalLM.verify_and_update_config, 0.11
        if rules.auto_kv_reads_checkpoint and arch.checkpoint_kv_dtype:
            return kv_dtype(arch.checkpoint_kv_dtype)
        return kv_dtype(arch.model_dtype)
    dtype = kv_dtype(name)
    if dtype.mla_token_bytes is not None and not any(isinstance(s, MLA) for s in arch.layers):
        raise KvplanError(f"--kv-cache-dtype {name} applies only to MLA models")
    return dtype


def dsv4_cache(settings: Settings, rules: VllmRules) -> tuple[KVDtype, int]:
    """DeepSeek-V4's cache on vLLM's default attention backends (FlashMLA sparse; the CPU build's): the packed
    fp8_ds_mla layout for any fp8 dtype, and for "auto" from 0.30 (`_resolve_dsv4_kv_cache_dtype`,
    models/deepseek_v4/attention.py@0.32.0), in blocks of 256, the one kernel block its backends take."""
    asked = settings.kv_cache_dtype
    if not rules.dsv4_packed_layout:
        raise KvplanError(f"kvplan reads DeepSeek-V4's KV layout as vLLM 0.29+ packs it; vLLM {rules.version} "
                          "grouped and counted it by other code (0.20-0.22, 0.23-0.26, 0.27-0.28)",
                          "plan it with --vllm-version 0.29 or newer")
    if asked == "auto" and not rules.dsv4_auto_fp8_ds_mla:
        raise KvplanError(f"vLLM {rules.version} refuses DeepSeek-V4 with --kv-cache-dtype auto (an fp8 cache is "
                          "required before 0.30)", "pass --kv-cache-dtype fp8")
    if asked != "auto" and not asked.startswith("fp8"):
        raise KvplanError(f"DeepSeek-V4 with --kv-cache-dtype {asked}: vLLM's default backends keep its cache as "
                          "fp8_ds_mla (bf16 rows need the FlashInfer DSV4 backend, which kvplan does not model)",
                          "use --kv-cache-dtype auto or fp8")
    if settings.block_size not in (None, 256):
        raise KvplanError(f"DeepSeek-V4 with --block-size {settings.block_size}: its attention backends take blocks "
                          "of 256 only", "drop --block-size (or give 256)")
    return kv_dtype("fp8_ds_mla"), 256


def default_block_size(arch: Architecture, device: Device, rules: VllmRules) -> int:
    platform = device.platform
    if any(isinstance(s, MLA) for s in arch.layers):
        if platform.mla_block_size:
            return platform.mla_block_size
        if platform.mla_takes_default_block:
            return platform.default_block_size
        if device.is_blackwell and rules.kv_cache_memory_flag:
            return MLA_BLOCK_SIZE_BLACKWELL
        return MLA_BLOCK_SIZE
    if platform.name == "cuda":  # the backends take CacheConfig.DEFAULT_BLOCK_SIZE (16; 64 from 0.34)
        return rules.gpu_default_block_size
    return platform.default_block_size


def extensible_kv_cache(settings: Settings, rules: VllmRules, device: Device) -> bool:
    """Whether vLLM sizes the pool after warmup (0.34+ on CUDA): `VllmConfig._resolve_extensible_kv_cache`
    (config/vllm.py@0.34.0) turns it on unless the platform is not CUDA/ROCm or a KV size or block count is
    given."""
    return (rules.extensible_kv_cache and device.platform.name == "cuda"
            and not settings.kv_cache_memory_bytes and not settings.num_gpu_blocks_override)


def gpu_memory_utilization(settings: Settings, rules: VllmRules, device: Device) -> float:
    """`CacheConfig.resolved_gpu_memory_utilization` (config/cache.py@0.34.0): the asked value, else 1.0
    with the extensible KV cache, else the release's default."""
    if settings.gpu_memory_utilization:
        return settings.gpu_memory_utilization
    return 1.0 if extensible_kv_cache(settings, rules, device) else rules.default_gpu_memory_utilization


def extensible_margin_floor(device: Device) -> int:
    """`KV_CACHE_MARGIN_FLOOR_BYTES`: 1 GiB, 3 GiB on ROCm."""
    return EXTENSIBLE_MARGIN_FLOOR_BYTES_ROCM if device.vendor == "amd" else EXTENSIBLE_MARGIN_FLOOR_BYTES


def _margin(transient: int, floor: int) -> int:
    return max(floor, int(transient * EXTENSIBLE_MARGIN_FRACTION))


def extensible_margin(transient: int, device: Device) -> int:
    """The margin `measure_kv_cache_bytes` keeps free: max(floor, 0.75 x the transient peak)."""
    return _margin(transient, extensible_margin_floor(device))


def measured_kv_bytes(requested: int, init_free: int, used: int, transient: int,
                      margin_floor: int = EXTENSIBLE_MARGIN_FLOOR_BYTES) -> int:
    """`measure_kv_cache_bytes` (v1/worker/extensible_kv_cache.py@0.34.0), the extensible KV cache's pool:
    ``non_kv_used`` (``used``) is all the memory taken after warmup but the KV cache (weights, non-torch
    memory, the captured CUDA graphs), and ``transient`` the peak kept free (`reserved_headroom_bytes` =
    the profiled `peak_activation_memory`: the activation peak plus the CUDA graph estimate):

        available = min(requested - non_kv_used, headroom - margin) - transient

    with ``headroom = init_free - non_kv_used`` (free memory plus the committed KV prefix) and ``margin =
    max(margin_floor, 0.75 x transient)`` (the floor: 1 GiB, 3 GiB on ROCm); never negative."""
    return max(min(requested - used, init_free - used - _margin(transient, margin_floor)) - transient, 0)


def mla_block_size(asked: int, arch: Architecture, device: Device, rules: VllmRules) -> int:
    """The block size an MLA model runs with when ``--block-size`` is given: the platform's
    forced size (FlashMLA 64 up to 0.10; the CPU MLA kernel 16); in 0.11-0.17 the asked size
    if FlashMLA (multiples of 64) or CUTLASS MLA (multiples of 128, Blackwell) takes it
    (sparse MLA stays 64); from 0.18 any multiple of 16 (the backend selector skips MLA
    backends that cannot take it: FlashAttention MLA takes multiples of 16)."""
    forced = default_block_size(arch, device, rules)
    if device.platform.mla_block_size or rules.mla_block_size_rule == "forced":
        return forced
    if rules.mla_block_size_rule == "backend_multiple":
        sparse = any(isinstance(s, MLAIndexer) for s in arch.layers)
        return asked if not sparse and asked % forced == 0 else forced
    return asked if asked % 16 == 0 else forced


def check_block_size(block_size: int, rules: VllmRules) -> None:
    """vLLM's ``BlockSize`` choices: 1, 8, 16, 32, 64, 128 up to 0.11; by 0.19.1 backends take
    multiples of 16 (FlashInfer up to 1024)."""
    if rules.block_size_multiple_of_16:
        ok = block_size in (1, 8) or (block_size % 16 == 0 and block_size <= 1024)
        allowed = "1, 8 or a multiple of 16 up to 1024"
    else:
        ok = block_size in (1, 8, 16, 32, 64, 128)
        allowed = "1, 8, 16, 32, 64 or 128"
    if not ok:
        raise KvplanError(f"invalid block size {block_size} for vLLM {rules.version}", f"use {allowed}")


@dataclass(frozen=True)
class StageBudget:
    """One pipeline stage's per-device budget and KV layout."""

    stage: int
    layout: KVLayout
    requested: int
    weights: int
    activation: Estimate
    non_torch: Estimate
    cudagraphs: Estimate
    available: Estimate  # bytes for the KV cache; low/high from the overhead ranges
    num_blocks: int


@dataclass(frozen=True)
class Capacity:
    """The engine's view of one deployment (per replica)."""

    arch: Architecture
    device: Device
    settings: Settings
    rules: VllmRules
    dtype: KVDtype
    block_size: int
    max_model_len: int
    limits: SchedulerLimits
    stages: tuple[StageBudget, ...]
    limiting_stage: StageBudget
    num_blocks: int
    weights_total: int
    hybrid_allocator: bool
    notes: tuple[str, ...]
    # --mamba-ssm-cache-dtype as the platform leaves it (the CPU build forces float32 on AVX-512 BF16 hosts).
    mamba_ssm_cache_dtype: str = "auto"

    @property
    def layout(self) -> KVLayout:
        return self.limiting_stage.layout

    @property
    def async_scheduling(self) -> bool:
        """`VllmConfig.__post_init__`: on by default from 0.14, except with pipeline parallel up to 0.33
        (the V1 model runner does not support it there; 0.34 removed that runner)."""
        if not self.device.platform.async_scheduling:
            return False  # platforms/cpu.py turns it off
        if self.settings.async_scheduling is not None:
            return self.settings.async_scheduling
        return self.rules.async_scheduling_default and (
            self.settings.pipeline_parallel_size == 1 or self.rules.async_scheduling_with_pp)

    @property
    def batches_in_flight(self) -> int:
        """`VllmConfig.max_concurrent_batches` (0.26+ sizes sliding/chunked layers with it):
        with async scheduling 2 at pp 1 (and pp + 1 from 0.34, config/vllm.py@0.34.0), else pp.
        Before 0.26, one batch."""
        if not self.rules.inflight_counts_concurrent_batches:
            return 1
        pp = self.settings.pipeline_parallel_size
        if self.async_scheduling and (pp == 1 or self.rules.async_scheduling_with_pp):
            return pp + 1
        return pp

    @property
    def has_state(self) -> bool:
        return has_state(self.arch)

    @property
    def prefix_caching(self) -> bool:
        return prefix_caching_on(self.arch, self.device, self.settings, self.rules)

    @property
    def mamba_cache_mode(self) -> str:
        return mamba_cache_mode(self.arch, self.device, self.settings, self.rules)

    @property
    def cache_config_block_size(self) -> int:
        """vLLM's final ``cache_config.block_size`` (what /metrics' cache_config_info shows):
        the smallest block of the groups (`EngineCore._initialize_kv_caches`), where recurrent
        state in "none" mode has ``mamba_block_size = max_model_len`` (`MambaModelConfig`)."""
        if self.has_state and self.mamba_cache_mode == "none" and self.rules.hybrid_block_alignment == "kernel":
            return min(self.block_size, self.max_model_len)
        return self.block_size

    @property
    def request_context(self) -> RequestContext:
        mode = self.mamba_cache_mode
        return RequestContext(
            inflight_tokens=self.batches_in_flight * self.limits.max_num_batched_tokens,
            mamba_align=mode == "align",
            mamba_all=mode == "all",
            checkpoint_variants=checkpoint_variants(self.device, self.rules),
            kv_shards=self.settings.decode_context_parallel_size,
            speculative_blocks=self.speculative_tokens if self.rules.mamba_counts_speculative_blocks else 0,
        )

    @property
    def speculative_tokens(self) -> int:
        """K of the speculative config (0 without one)."""
        spec = self.settings.speculative
        return spec.num_speculative_tokens if spec else 0

    @property
    def usable_blocks(self) -> int:
        """V1 reserves block 0 as the null block (`block_pool.py`)."""
        return max(0, self.num_blocks - (1 if self.rules.engine == "v1" else 0))

    def blocks_per_request(self, num_tokens: int) -> int:
        return self.layout.blocks_per_request(num_tokens, self.request_context)

    @property
    def max_concurrency_reported(self) -> float:
        """"Maximum concurrency for L tokens per request: X.XXx" as this version prints it."""
        if self.rules.token_report == "blocks":
            return self.num_blocks * self.block_size / self.max_model_len
        return self.num_blocks / self.blocks_per_request(self.max_model_len)

    @property
    def kv_cache_tokens_reported(self) -> int:
        """"GPU KV cache size: N tokens" as this version prints it."""
        if self.rules.token_report == "blocks":
            return self.num_blocks * self.block_size
        if self.rules.token_report == "per_group":
            return self.num_blocks // self.layout.num_kv_groups * self.layout.min_block_size
        return int(self.max_concurrency_reported * self.max_model_len)

    def needed_for_max_model_len(self) -> int:
        """`check_enough_kv_cache_memory`: one max-length request must fit."""
        return self.layout.max_len_bytes(
            self.max_model_len, self.request_context, self.rules.max_len_check_counts_padding
        )

    @property
    def max_len_check_bytes(self) -> int:
        """The memory vLLM's max_model_len check (and its estimate) plans against: the KV memory, less the null
        block the pool holds back from 0.29 (``check_memory``, v1/core/kv_cache_utils.py@0.29.0)."""
        available = self.limiting_stage.available.bytes
        return available - self.layout.block_bytes if self.rules.max_len_check_reserves_null_block else available

    def estimated_max_model_len(self) -> int:
        """`estimate_max_model_len` (kv_cache_utils.py): the longest max_model_len whose one
        request fits the available memory, as vLLM's start-up error names it."""
        available = self.max_len_check_bytes
        ctx, padding = self.request_context, self.rules.max_len_check_counts_padding
        lo, hi = 0, self.max_model_len
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.layout.max_len_bytes(mid, ctx, padding) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def at_budget_edge(self, edge: Literal["low", "high"]) -> Capacity:
        """This deployment with every stage's KV budget at the ``low`` or ``high`` end of its range
        (the overhead terms' ranges, `kvplan size`'s "range" column): the pool the verdict must also
        hold for. A given --kv-memory or --num-gpu-blocks-override has no range."""
        stages = tuple(replace(st, available=Estimate.exact(getattr(st.available, edge)),
                               num_blocks=st.layout.num_blocks(getattr(st.available, edge))) for st in self.stages)
        limiting = min(stages, key=lambda st: st.num_blocks)
        return replace(self, stages=stages, limiting_stage=limiting,
                       num_blocks=self.settings.num_gpu_blocks_override or limiting.num_blocks)

    @property
    def context_too_long(self) -> bool:
        """vLLM refuses a max_model_len above the model's derived maximum (unless
        VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set, at the user's risk)."""
        limit = self.arch.max_model_len_limit
        return bool(limit) and self.max_model_len > limit

    @property
    def engine_starts(self) -> bool:
        return (not self.context_too_long and self.num_blocks > 0
                and self.needed_for_max_model_len() <= self.max_len_check_bytes)


_STATE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def has_state(arch: Architecture) -> bool:
    """Whether the model has layers of fixed-size state (Mamba / linear attention) beside or instead of attention."""
    return any(not s.grows_with_tokens for s in arch.layers)


def prefix_caching_on(arch: Architecture, device: Device, settings: Settings, rules: VllmRules) -> bool:
    """On unless turned off; off by default for attention + state models before 0.26
    (`is_prefix_caching_supported`); forced off for MLA on the CPU platform."""
    if device.platform.mla_whole_prompt and arch.uses_mla:
        return False
    if settings.enable_prefix_caching is not None:
        return settings.enable_prefix_caching
    return rules.hybrid_prefix_caching_default or not has_state(arch)


def mamba_cache_mode(arch: Architecture, device: Device, settings: Settings, rules: VllmRules) -> str:
    """vLLM's ``mamba_cache_mode``: "none" without prefix caching (or before 0.15.1);
    "align" with it; "all" in 0.26-0.27 for the families that support it."""
    if not (has_state(arch) and prefix_caching_on(arch, device, settings, rules)) or rules.mamba_prefix_caching == "off":
        return "none"
    if rules.mamba_prefix_caching == "all_for_supported":
        return "all"
    return "align"


def checkpoint_variants(device: Device, rules: VllmRules) -> frozenset:
    """The state mixers that add a prefill checkpoint page in "align" mode: Mamba-2 from 0.32
    (mamba_mixer2.py@0.32.0), Qwen GDN from 0.33 with FlashInfer's GDN prefill, the auto choice on SM90
    (`_resolve_gdn_prefill_backend`, model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py@0.33.0; on
    Blackwell it needs CUDA 13, which kvplan does not know: not assumed)."""
    variants = {"mamba2"} if rules.mamba2_checkpoint_page else set()
    if rules.gdn_checkpoint_page_on_hopper and device.is_hopper:
        variants.add("gated_delta_net")
    return frozenset(variants)


#: `FLASHINFER_GDN_CHECKPOINT_ALIGNMENT` (v1/attention/backends/gdn_attn.py@0.33.0): the token alignment of the
#: checkpoints FlashInfer's GDN prefill exports (`QwenGatedDeltaNet.get_prefill_checkpoint_alignment`).
GDN_CHECKPOINT_ALIGNMENT = 64


def checkpoint_block_alignment(arch: Architecture, device: Device, settings: Settings, rules: VllmRules) -> int:
    """The token alignment "align" mode adds to a hybrid model's block (`Platform._align_hybrid_block_size`,
    platforms/interface.py@0.33.0 and @0.34.0: ``lcm(kernel alignment, get_mamba_prefill_checkpoint_alignment
    or 1)``, run after the model is built): the lcm of every state layer's checkpoint alignment, None (so 1)
    unless every one declares one. Mamba-2's is 1; Qwen GDN's is 64 where it exports checkpoints (Hopper, 0.33+):
    Qwen3-Next's block on Hopper is 320 tokens, not 272."""
    states = [s for s in arch.layers if isinstance(s, MambaState)]
    if not states or mamba_cache_mode(arch, device, settings, rules) != "align":
        return 1
    if "gated_delta_net" in checkpoint_variants(device, rules) and all(s.variant == "gated_delta_net" for s in states):
        return GDN_CHECKPOINT_ALIGNMENT
    return 1


def state_ssm_bytes(state: MambaState, rules: VllmRules, asked: str = "auto") -> int:
    """The SSM (temporal) state's element size as the release resolves it
    (`MambaStateDtypeCalculator`, the model's config hook in `models/config.py`):
    ``--mamba-ssm-cache-dtype`` when given (gated delta net: from 0.17); else the family's
    "auto" policy (kvplan.model.families)."""
    if state.variant not in MambaState.SSM_DTYPE_VARIANTS:
        return state.ssm_bytes
    if state.variant == "kda" and asked not in ("auto", "float32"):
        # The layer's own spec passes only the conv dtype, so its recurrent state stays float32
        # (KimiGatedDeltaNetAttention.get_state_dtype, layers/mamba/gdn/kimi_gdn_linear_attn.py@0.32.0),
        # while the model's hook that aligns the block size reads the flag
        # (KimiLinearForCausalLM.get_mamba_state_dtype_from_config, models/kimi_k3/nvidia/model.py@0.32.0).
        raise KvplanError(f"--mamba-ssm-cache-dtype {asked}: vLLM keeps Kimi-Linear's KDA state in float32 but aligns "
                          "its blocks to the flag; kvplan cannot predict that mix",
                          "leave --mamba-ssm-cache-dtype at auto or float32")
    if asked != "auto" and (state.variant != "gated_delta_net" or rules.gdn_respects_ssm_dtype):
        return _STATE_BYTES[asked]
    if state.ssm_policy == "nemotron_h":
        dtype = state.ssm_hint or rules.nemotron_h_ssm_default
    elif state.ssm_policy == "qwen3_5":
        dtype = state.ssm_hint if rules.qwen35_reads_mamba_ssm_dtype else None
    elif state.ssm_policy == "float32":
        dtype = "float32"
    else:
        dtype = None
    return _STATE_BYTES.get(dtype, state.conv_bytes) if dtype else state.conv_bytes


def with_state_dtype(specs: list[LayerSpec], rules: VllmRules, asked: str = "auto") -> list[LayerSpec]:
    """The specs with each recurrent state's SSM dtype resolved for this release."""

    def resolved(spec: LayerSpec) -> LayerSpec:
        if isinstance(spec, MambaState):
            return replace(spec, ssm_bytes=state_ssm_bytes(spec, rules, asked))
        return spec

    return map_distinct(resolved, specs)


def with_draft_layers(arch: Architecture, count: int, dtype: KVDtype | None = None) -> Architecture:
    """The target plus ``count`` draft layers shaped like its last layer that holds KV (every spec of it: MLA
    and its sparse indexer): an MTP module is the target's decoder layer, and vLLM gives the drafter's
    attention layers pages in the same pool (on the last stage). Their weights: the target's average layer."""
    growing = [(s, i) for s, i in zip(arch.layers, arch.layer_index) if s.grows_with_tokens]
    if not growing:
        raise KvplanError("speculative draft layers need a model with attention layers")
    last = growing[-1][1]
    shape = tuple(s for s, i in growing if i == last)
    if any(isinstance(s, CompressedMLA) for s in shape):
        # DeepSeek-V4's MTP layer compresses nothing: its window only (attention.py@0.32.0:232-235).
        shape = tuple(s for s in shape if type(s) is SlidingMLA)
    per_layer = (arch.params.total - arch.params.embedding - arch.params.lm_head) // arch.num_hidden_layers
    return _with_drafter(arch, shape * count, count * per_layer, dtype)


def _with_drafter(arch: Architecture, specs: tuple[LayerSpec, ...], params: int,
                  dtype: KVDtype | None = None) -> Architecture:
    """The drafter's specs on the target's last layer (its stage), each in its own KV ``dtype`` when given, its
    parameters with the never-quantized ones (the draft is not quantized with the target)."""
    if dtype is not None:
        specs = tuple(OwnDtype(s, dtype) for s in specs)
    return replace(
        arch,
        layers=arch.layers + specs,
        layer_index=arch.layer_index + (arch.num_hidden_layers - 1,) * len(specs),
        params=replace(arch.params, other=arch.params.other + params),
    )


def speculative_draft_layers(spec: SpeculativeConfig, arch: Architecture) -> tuple[int, str]:
    """The KV layers a drafter adds to the pool, shaped like the target's, and how kvplan knows
    (kvplan.plan.speculative); a drafter whose config was read adds its own instead (`_with_speculative`)."""
    if not spec.adds_kv_layers:
        return 0, f"speculative decoding ({spec.describe()}): the drafter holds no KV"
    if spec.method == "mtp":
        if arch.model_type.startswith("gemma4"):
            # The assistant's layers read the target's KV (`kv_sharing_target_layer_name`, v1/spec_decode/gemma4.py@0.32.0).
            return 0, f"speculative decoding ({spec.describe()}): Gemma 4's MTP drafter shares the target's KV"
        n = arch.mtp_layers or 1
        return n, (f"speculative decoding ({spec.describe()}): {n} MTP layer(s) of the target's attention shape "
                   "share the KV pool" + ("" if arch.mtp_layers else " (the config names no MTP modules: vLLM builds 1)"))
    unread = f": {spec.draft_unread}" if spec.draft_unread else ""
    if spec.method in ("eagle", "eagle3"):
        return 1, (f"speculative decoding ({spec.describe()}): one draft layer of the target's attention shape "
                   f"assumed (the EAGLE head's config was not read{unread}; --draft-layers N sets its layers)")
    raise KvplanError(f"speculative decoding with {spec.method}: kvplan could not read the draft model's config{unread}",
                      "give a draft model kvplan can load (a local folder, a Hub id when online, a bundled profile), "
                      "or its attention layers with --draft-layers N (and its weights in --weights-memory)")


def _stage_weights(arch: Architecture, total: int, stage: range, first: bool, last: bool, tp: int,
                   routed: int = 0, routed_share: float | None = None) -> int:
    """Per-device weights of one stage: its share of the layers plus embeddings/LM head. Of the routed
    experts (``routed`` of the ``total`` bytes) a GPU holds ``routed_share`` where vLLM shards them over
    a data-parallel deployment; the rest is split over ``tp``."""
    p = arch.params
    if p.total == 0:
        return total // tp
    layer_fraction = len(stage) / arch.num_hidden_layers
    # The routed experts at their own bytes per parameter; the other roles at their average.
    rest_params = p.total - (p.experts if routed else 0)
    share = (rest_params - p.embedding - p.lm_head) * layer_fraction
    share += p.embedding if first else 0
    share += p.lm_head if last else 0
    experts_held = routed * layer_fraction * (1 / tp if routed_share is None else routed_share)
    return int(share * (total - routed) / rest_params / tp + experts_held)


def moe_split_error(arch: Architecture, moe_tp: int) -> str | None:
    """Why vLLM refuses to build the MoE layers split ``moe_tp`` ways (None: it does not).

    Without expert parallel every routed expert's matrices are split over all the MoE ranks
    (tp x dp, `FusedMoEParallelConfig.make` flattens them), and `FusedMoEConfig.__post_init__`
    asserts ``intermediate_size % tp_size == 0`` (vllm/model_executor/layers/fused_moe/config.py@0.32.0;
    `FusedMoE.__init__` in the releases before it): a bare AssertionError while the model is built,
    so the engine fails to start. With expert parallel each GPU holds whole experts (tp_size 1)."""
    inter = arch.expert_intermediate_size
    if not arch.num_experts or not inter or moe_tp <= 1 or inter % moe_tp == 0:
        return None
    return (f"vLLM will not start: the experts' intermediate size {inter:,} does not divide over {moe_tp} MoE ranks "
            f"(tp x dp without expert parallel; FusedMoEConfig asserts intermediate_size % tp_size == 0)")


def _with_speculative(arch: Architecture, settings: Settings, rules: VllmRules, notes: list[str]) -> Architecture:
    """The model as speculative decoding serves it: the draft's KV layers in the pool (as the speculative config
    or --draft-layers gives them) and the recurrent states widened by the drafted tokens (mamba_utils.py)."""
    draft_layers = settings.draft_layers
    spec = settings.speculative
    if spec:
        if draft_layers:
            notes.append(f"speculative decoding ({spec.describe()}): {draft_layers} draft layer(s), as --draft-layers gives")
        elif spec.draft is not None:
            draft = spec.draft
            notes.append(f"speculative decoding ({spec.describe()}): the draft's own {len(draft.arch.layers)} KV layer(s) "
                         f"from its config ({draft.source}) share the pool; "
                         f"{format_bytes(draft.params * arch.model_dtype_bytes)} of draft weights ({draft.params_note})")
            arch = _with_drafter(arch, draft.arch.layers, draft.params, draft_dtype(spec, arch, settings, rules, notes))
        else:
            draft_layers, how = speculative_draft_layers(spec, arch)
            notes.append(how)
        k, variants = spec.num_speculative_tokens, rules.speculative_conv_variants
        arch = replace(arch, layers=tuple(s.with_spec_tokens(k, variants) if isinstance(s, MambaState) else s
                                          for s in arch.layers))
        if draft_layers:
            return with_draft_layers(arch, draft_layers, draft_dtype(spec, arch, settings, rules, notes))
        return arch
    if draft_layers:
        notes.append(f"{draft_layers} speculative draft layer(s) share the KV pool")
        return with_draft_layers(arch, draft_layers)
    return arch


def draft_dtype(spec: SpeculativeConfig, target: Architecture, settings: Settings, rules: VllmRules,
                notes: list[str]) -> KVDtype | None:
    """The drafter's own KV dtype, the speculative config's ``kv_cache_dtype`` (None: the target's). vLLM builds
    the drafter under a copy of the cache config with it (kvplan.vllm.rules, ``draft_kv_cache_dtype``); "auto" is
    the model dtype there, whatever the target's --kv-cache-dtype (a draft model's own; a checkpoint's fp8 KV scheme for MTP)."""
    asked = spec.kv_cache_dtype
    if asked is None:
        return None
    if not rules.draft_kv_cache_dtype:
        raise KvplanError(f"vLLM {rules.version} refuses kv_cache_dtype in --speculative-config (a key from 0.26)",
                          "drop it, or plan vLLM 0.26 or newer")
    if spec.method == "draft_model" and rules.draft_model_keeps_target_kv_dtype:
        notes.append(f"vLLM {rules.version}'s default model runner keeps the target's KV dtype for a draft model's "
                     f"layers: kv_cache_dtype {asked} is not applied (VLLM_USE_V2_MODEL_RUNNER=0 applies it)")
        return None
    hybrid = len({s.uniform_type_key() for s in target.layers}) > 1 or any(s.fixed_block_size for s in target.layers)
    if hybrid:
        raise KvplanError("a drafter KV dtype of its own on a hybrid model is not modelled (vLLM scales the draft "
                          "layers' block size to match pages and groups them apart)",
                          "drop kv_cache_dtype from --speculative-config to size the draft at the target's dtype")
    own = spec.draft.arch.model_dtype if spec.method == "draft_model" and spec.draft else target.model_dtype
    dtype = kv_dtype(own) if asked == "auto" else kv_dtype(asked)
    if asked == "auto" and spec.method == "mtp":
        dtype = resolve_kv_dtype(target, "auto", rules)
    if dtype == resolve_kv_dtype(target, settings.kv_cache_dtype, rules):
        return None
    notes.append(f"speculative decoding: the draft's KV layers are {dtype.name} (its kv_cache_dtype), the "
                 "target's are not: vLLM keeps both in one group of unequal pages")
    return dtype


@functools.lru_cache(maxsize=1024)
def stage_layout(specs: tuple[LayerSpec, ...], tp: int, rules: VllmRules, ssm_asked: str, dtype: KVDtype,
                 block_size: int, hybrid: bool, platform: Platform, blackwell: bool,
                 checkpoint_alignment: int) -> KVLayout:
    """One pipeline stage's layout (`build_layout` of its specs as one TP rank holds them, their states' dtype
    resolved), kept for the next call with the same arguments: all are frozen, and so is the layout. Why: `fit`'s
    search and `size`'s suggestions plan thousands of deployments that differ in GPU count and memory but share a
    few layouts (Qwen3.5-397B-A17B's `size` at TP 1-8 on H100 and L40S, 8k and 32k, with its suggestions: 4,624
    capacities, 10 s of 13 s building layouts, 2026-12-07)."""
    return build_layout(with_state_dtype(with_tp(list(specs), tp), rules, ssm_asked), dtype, block_size, rules, hybrid,
                        platform, blackwell, checkpoint_alignment)


def compute_capacity(
    arch: Architecture,
    device: Device,
    settings: Settings,
    rules: VllmRules,
    overhead: OverheadModel,
    weights_total: int | None = None,
) -> Capacity:
    """Size the KV cache of one replica of a deployment, as that vLLM release would."""
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    notes: list[str] = []
    target_params = arch.params.total
    arch = _with_speculative(arch, settings, rules, notes)
    if weights_total and arch.params.total > target_params:
        # Exact bytes of the target's checkpoint: the drafter's weights (model dtype, unquantized) come on top.
        weights_total += (arch.params.total - target_params) * arch.model_dtype_bytes
    if arch.num_attention_heads % tp:
        raise KvplanError(
            f"tensor parallel size {tp} does not divide the {arch.num_attention_heads} attention heads",
            "vLLM requires num_attention_heads % tp == 0",
        )
    if rules.note:
        notes.append(rules.note)
    dsv4 = any(isinstance(s, CompressedMLA) for s in arch.layers)
    if dsv4:
        dtype, block_size = dsv4_cache(settings, rules)
    else:
        dtype = resolve_kv_dtype(arch, settings.kv_cache_dtype, rules)
        block_size = settings.block_size or default_block_size(arch, device, rules)
    if settings.block_size is not None and not dsv4:
        check_block_size(settings.block_size, rules)
        if any(isinstance(s, MLA) for s in arch.layers):
            block_size = mla_block_size(settings.block_size, arch, device, rules)
            if block_size != settings.block_size:
                notes.append(f"vLLM's MLA backend forces block size {block_size} (asked {settings.block_size})")
    if (settings.max_num_seqs and settings.max_num_batched_tokens
            and settings.max_num_batched_tokens < settings.max_num_seqs):
        raise KvplanError(
            f"max_num_batched_tokens ({settings.max_num_batched_tokens}) is below max_num_seqs "
            f"({settings.max_num_seqs}): vLLM refuses that",
            "raise --max-num-batched-tokens or lower --max-num-seqs",
        )
    max_model_len = settings.max_model_len or arch.max_model_len_limit
    if not max_model_len:
        raise KvplanError("the config gives no max_position_embeddings", "pass the context length with --ctx 32k")
    defaults = default_scheduler_limits(device, settings.usage_context, rules, max_model_len, tp * pp)
    batched = settings.max_num_batched_tokens or defaults.max_num_batched_tokens
    if device.platform.mla_whole_prompt and arch.uses_mla:
        batched = max(max_model_len, 2048)  # platforms/cpu.py: no chunked prefill for MLA
    # arg_utils: the default max_num_seqs never exceeds max_num_batched_tokens.
    limits = SchedulerLimits(settings.max_num_seqs or min(defaults.max_num_seqs, batched), batched)
    # Before 0.19.1, chunked local attention (Llama 4) turned the hybrid manager off unless
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1.
    hybrid = settings.hybrid_kv_cache_manager
    if hybrid is None:
        hybrid = rules.chunked_local_uses_hybrid or not any(isinstance(s, ChunkedLocal) for s in arch.layers)
        if not hybrid:
            notes.append(
                "vLLM disables the hybrid KV manager for chunked local attention by default: "
                "those layers are sized as full attention"
            )
    if settings.language_model_only and arch.params.towers:
        # `--language-model-only`: vLLM builds no multimodal tower (models/interfaces.py@0.32.0).
        arch = replace(arch, params=replace(arch.params, towers=0), vision_encoder=None)
        notes.append("--language-model-only: the multimodal towers are not loaded")
    elif arch.params.towers and settings.skip_mm_profiling:
        arch = replace(arch, vision_encoder=None)
        notes.append("--skip-mm-profiling: the profile run leaves the multimodal encoder out, so requests with "
                     "large images can run out of memory at run time")
    elif arch.params.towers and arch.vision_encoder is not None and rules.engine == "v1":
        # `profile_run` pushes a dummy item "of the maximum feature size" through the encoder before the
        # text dummy run (v1/worker/gpu_model_runner.py@0.24.0); kvplan.model.encoders sizes that pass.
        if settings.mm_max_pixels:
            arch = replace(arch, vision_encoder=replace(arch.vision_encoder, max_pixels=settings.mm_max_pixels))
        peak = arch.vision_encoder.peak_bytes(arch.model_dtype_bytes, tp)
        largest = "--mm-max-pixels" if settings.mm_max_pixels else "the processor's default; --mm-max-pixels changes it"
        notes.append(
            f"vLLM's profile run first pushes its largest image through the vision tower ({largest}): "
            f"{arch.vision_encoder.describe()}, {peak / GiB:.2f} GiB at its peak per GPU, counted in the "
            "activation; --language-model-only avoids it"
        )
    elif arch.params.towers:
        # Towers whose forward pass kvplan has not read: the pass is named, not guessed.
        arch = replace(arch, vision_encoder=None)
        notes.append(
            "vLLM's profile run also runs the multimodal encoder on its largest input, a peak kvplan does not "
            "count for this tower: the KV memory can be lower; --language-model-only avoids it"
        )
    if settings.mm_max_pixels and arch.vision_encoder is None:
        notes.append("--mm-max-pixels: no effect here (no vision encoder pass that kvplan sizes)")
    # MXFP4 experts are laid out for the MoE kernel vLLM picks on this GPU (kvplan/model/weights.py).
    # vLLM shards the routed experts over every GPU of a data-parallel deployment (tp x dp); with
    # expert parallel each GPU holds whole experts, else every expert is split that many ways.
    dp = settings.data_parallel_size
    moe_ranks = tp * dp if dp > 1 and rules.moe_shards_over_dp and arch.params.experts else tp
    moe_tp = 1 if settings.enable_expert_parallel else moe_ranks
    refused = moe_split_error(arch, moe_tp)
    if refused:
        raise KvplanError(refused, f"add --enable-expert-parallel (whole experts per GPU), or use a tp x dp that "
                                   f"divides {arch.expert_intermediate_size:,}")
    kernel = mxfp4_kernel_for(device, parse_version(rules.version))
    weights_default = weight_bytes(arch.params, arch.model_dtype_bytes, arch.quantization, mxfp4_kernel=kernel,
                                   tp=moe_tp)
    routed = routed_expert_bytes(arch.params, arch.model_dtype_bytes, arch.quantization, mxfp4_kernel=kernel,
                                 tp=moe_tp)
    if weights_total:  # exact bytes from the checkpoint: the experts' share as the config prices it
        routed = round(weights_total * routed / weights_default) if weights_default else 0
    weights_total = weights_total or weights_default
    routed_share = None  # a GPU's share of the routed experts, when not simply 1 / tp
    if moe_ranks > tp or (settings.enable_expert_parallel and arch.num_experts):
        # Expert parallel: whole experts, the first E % ranks GPUs one more (expert_map_manager.py:
        # determine_expert_map); else every expert's matrices split over all the ranks.
        routed_share = (cdiv(arch.num_experts, moe_ranks) / arch.num_experts if settings.enable_expert_parallel
                        else 1 / moe_ranks)
        notes.append(f"vLLM shards the MoE experts over {moe_ranks} GPUs"
                     + (f" (the {dp} data-parallel replicas' tp x dp)" if dp > 1 else "")
                     + f": {routed * routed_share / 2**30:.2f} GiB of experts on the fullest GPU")

    util = gpu_memory_utilization(settings, rules, device)
    extensible = extensible_kv_cache(settings, rules, device)
    requested = device.cuda_total_bytes * util
    requested = math.ceil(requested) if rules.requested_memory_ceil else int(requested)
    stages: list[StageBudget] = []
    ranges = pipeline_stages(arch.num_hidden_layers, pp)
    gdn = any(isinstance(s, MambaState) and s.variant == "gated_delta_net" for s in arch.layers)
    ssm_asked = device.platform.mamba_ssm_cache_dtype(settings.mamba_ssm_cache_dtype, gdn)
    checkpoint_alignment = checkpoint_block_alignment(arch, device, settings, rules)
    encoder = arch.vision_encoder  # every pipeline stage's worker runs the encoder pass
    for s, stage in enumerate(ranges):
        specs = tuple(spec for spec, i in zip(arch.layers, arch.layer_index) if i in stage)
        layout = stage_layout(specs, tp, rules, ssm_asked, dtype, block_size, hybrid, device.platform,
                              device.is_blackwell, checkpoint_alignment)
        last = s == pp - 1
        if settings.weights_bytes:
            weights = settings.weights_bytes
        else:
            weights = _stage_weights(arch, weights_total, stage, s == 0, last, tp, routed, routed_share)
        # The profile run splits max_num_batched_tokens over min(tokens, max_num_seqs) requests.
        activation = overhead.activation(
            min(limits.max_num_seqs, limits.max_num_batched_tokens), arch.vocab_size, limits.max_num_batched_tokens,
            arch.hidden_size, arch.model_dtype_bytes, samples=last, mlp_width=arch.mlp_activation_width // tp,
            encoder_peak=encoder.peak_bytes(arch.model_dtype_bytes, tp) if encoder else 0,
            encoder_retained=encoder.retained_bytes(arch.model_dtype_bytes) if encoder else 0,
        )
        non_torch = overhead.non_torch(tp * pp)
        graphs = Estimate.exact(0)
        if rules.subtracts_cudagraph_memory and not settings.enforce_eager:
            graphs = overhead.cudagraphs()
        if settings.kv_cache_memory_bytes:
            available = Estimate.exact(settings.kv_cache_memory_bytes)
        elif extensible:
            # Free memory at vLLM's first snapshot: the CUDA context and NCCL hold STARTUP_BYTES (an assumption).
            # The low end takes the high startup, activation, non-torch and graph memory, the high end the low.
            low_start, start, high_start = STARTUP_BYTES
            free_at_start = [device.cuda_total_bytes - b for b in (start, high_start, low_start)]
            terms = zip(free_at_start, (activation.bytes, activation.high, activation.low),
                        (non_torch.bytes, non_torch.high, non_torch.low), (graphs.bytes, graphs.high, graphs.low))
            floor = extensible_margin_floor(device)
            available = Estimate(*(measured_kv_bytes(requested, free, weights + other + cg, act + cg, floor)
                                   for free, act, other, cg in terms))
        else:
            taken = Estimate.exact(weights) + activation + non_torch + graphs
            available = Estimate(requested - taken.bytes, requested - taken.high, requested - taken.low)
        stages.append(
            StageBudget(s, layout, requested, weights, activation, non_torch, graphs, available,
                        layout.num_blocks(available.bytes))
        )
    limiting = min(stages, key=lambda st: st.num_blocks)
    num_blocks = settings.num_gpu_blocks_override or limiting.num_blocks
    if rules.mamba_prefix_caching == "all_for_supported" and any(
            isinstance(s, MambaState) and s.all_mode_capable for s in arch.layers):
        notes.append(f"vLLM {rules.version} keeps this model's recurrent state in 'all' mode with prefix caching: "
                     "a state page per block is counted, but that mode's block alignment to the Mamba chunk size "
                     "is not modelled (pass --no-enable-prefix-caching, or plan another release)")
    if limiting.layout.padding_layers:
        notes.append(
            f"vLLM pads the KV groups with {limiting.layout.padding_layers} layer(s) "
            "('Add N padding layers'): that memory holds no tokens"
        )
    if arch.quantization.method != "none" and settings.kv_cache_dtype == "auto" and dtype.bytes_per_element >= 2:
        notes.append(
            f"weights are {arch.quantization.method} but the KV cache stays {dtype.name}: "
            "quantized weights do not shrink the KV cache (try --kv-cache-dtype fp8)"
        )
    return Capacity(
        arch=arch,
        device=device,
        settings=settings,
        rules=rules,
        dtype=dtype,
        block_size=limiting.layout.attention_block_size,
        max_model_len=max_model_len,
        limits=limits,
        stages=tuple(stages),
        limiting_stage=limiting,
        num_blocks=num_blocks,
        weights_total=weights_total,
        hybrid_allocator=hybrid and rules.hybrid_allocator,
        notes=tuple(notes + list(arch.notes)),
        mamba_ssm_cache_dtype=ssm_asked,
    )


@dataclass(frozen=True)
class RequestLoad:
    """Concurrent identical requests; the tokens each holds at its peak."""

    concurrency: int
    request_tokens: int  # tokens whose KV a request holds at its peak
    shared_prefix_tokens: int = 0


def request_load(settings: Settings, max_model_len: int) -> RequestLoad:
    """Prompt + output - 1 tokens: the last sampled token's KV is never written; with speculative
    decoding, plus the lookahead slots a running request allocates each step (`allocate_slots`, capped at
    max_model_len, v1/core/sched/scheduler.py@0.32.0). Without a prompt length, a request fills the whole
    context (vLLM's own concurrency figure, which leaves the lookahead out)."""
    if settings.prompt_tokens is None:
        tokens = max_model_len
    else:
        output = settings.output_tokens or 0
        if settings.prompt_tokens + output > max_model_len:
            raise KvplanError(
                f"prompt {settings.prompt_tokens:,} + output {output:,} tokens exceed the context {max_model_len:,}",
                "raise --ctx or shorten --prompt/--output",
            )
        lookahead = settings.speculative.lookahead_tokens if settings.speculative else 0
        tokens = min(settings.prompt_tokens + max(output - 1, 0) + lookahead, max_model_len)
    if settings.shared_prefix_tokens > tokens:
        raise KvplanError(f"--shared-prefix {settings.shared_prefix_tokens:,} is longer than a request ({tokens:,} tokens)")
    return RequestLoad(settings.concurrency, tokens, settings.shared_prefix_tokens)


def blocks_needed(cap: Capacity, concurrency: int, tokens: int, shared_prefix: int = 0) -> int:
    """Blocks ``concurrency`` requests pin at once; shared prefix blocks count once."""
    per_request = cap.blocks_per_request(tokens)
    shared = min(cap.layout.shared_prefix_blocks(shared_prefix), per_request) if cap.prefix_caching else 0
    return shared + concurrency * (per_request - shared)


def max_concurrency_for(cap: Capacity, tokens: int, shared_prefix: int = 0, pool_blocks: int | None = None) -> int:
    """How many requests of ``tokens`` fit at once in ``pool_blocks`` (default: the usable pool)."""
    pool = cap.usable_blocks if pool_blocks is None else pool_blocks
    per_request = cap.blocks_per_request(tokens)
    shared = min(cap.layout.shared_prefix_blocks(shared_prefix), per_request) if cap.prefix_caching else 0
    if per_request - shared <= 0:
        return cap.limits.max_num_seqs
    return max(0, (pool - shared) // (per_request - shared))


def max_context_for(cap: Capacity, concurrency: int, upper: int, shared_prefix: int = 0,
                    pool_blocks: int | None = None) -> int:
    """The longest request of which ``concurrency`` fit at once in ``pool_blocks`` (default: the
    usable pool); 0 if not even 1 token."""
    pool = cap.usable_blocks if pool_blocks is None else pool_blocks
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if blocks_needed(cap, concurrency, mid, min(shared_prefix, mid)) <= pool:
            lo = mid
        else:
            hi = mid - 1
    return lo
