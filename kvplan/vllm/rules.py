"""vLLM's KV accounting rules by release.

Each field is a rule that changed across releases; `rules_for` picks the set for a version
string such as ``0.11.0``, ``v0.9.1.dev705+g01220ce89`` or ``0.11.0rc2.dev98``. Every rule
was read in vLLM's own source: the wheels of 0.9.2 and of every minor release from 0.10 to
0.34 (the last patch of each, plus 0.11.0, 0.11.1, 0.14.0 and 0.20.1); docs/vllm-accounting.md
quotes the lines and dates each rule to the first release that has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvplan.errors import KvplanError

NEWEST_KNOWN = "0.34.0"
KNOWN_VERSIONS = (
    "0.6.0", "0.8.5", "0.9.2", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1",
    "0.15.1", "0.16.0", "0.17.1", "0.18.1", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1",
    "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
    "0.34.0",
)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class VllmRules:
    """The accounting rules one vLLM release follows.

    Each field names the release that introduced it, as read in that release's wheel
    (docs/vllm-accounting.md, "Rules by release", quotes the lines). Where only a minor's last
    patch was read (0.18.1 for 0.18, 0.14.1 and 0.14.0 for 0.14), the rule is dated to the
    minor: it may have landed in any of its patches.
    """

    version: str
    engine: str  # "v0" (legacy engine, no null block) or "v1"
    # gpu_memory_utilization default: 0.9, 0.92 from 0.20 (config/cache.py).
    default_gpu_memory_utilization: float
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 from 0.20 (envs.py).
    subtracts_cudagraph_memory: bool
    # "GPU KV cache size" tokens: "blocks" = num_blocks * block_size (V0, 0.8);
    # "per_group" = num_blocks // num_groups * min_block_size (0.9 to 0.20.0);
    # "concurrency" = int(max_concurrency * max_model_len) (0.20.1+, _report_kv_cache_config).
    token_report: str
    hybrid_allocator: bool  # per-group specs from 0.9.2; before, SWA was sized as full
    # group_size: the fewest layers of any type; from 0.12 the most when max < factor * min
    # (1.25 in 0.12-0.17, 1.5 from 0.18); None before 0.12.
    group_size_close_factor: float | None
    unify_page_size: bool  # unify_kv_cache_spec_page_size, 0.12+
    # Block sizes: BlockSize literal (1, 8, 16, 32, 64, 128) up to 0.11; multiples of 16 up to
    # 1024 by 0.19.1 (the release read; earlier minors not checked for this).
    block_size_multiple_of_16: bool
    # auto KV dtype reads a ModelOpt checkpoint's kv_cache_quant_algo (0.14+).
    auto_kv_reads_checkpoint: bool
    requested_memory_ceil: bool  # math.ceil(total * util), 0.14+
    kv_cache_memory_flag: bool  # --kv-cache-memory-bytes exists (0.11+)
    combined_capacity_line: bool  # "..., Maximum concurrency ..." on one line (0.28+)
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 1 from 0.14.
    chunked_local_uses_hybrid: bool
    # Async scheduling on by default (`VllmConfig.__post_init__`, 0.14+; off with pp > 1).
    async_scheduling_default: bool
    # Sliding/chunked layers keep `max_in_flight_tokens` = max_concurrent_batches x
    # max_num_batched_tokens (2 batches with async scheduling, pp without) from 0.26; before,
    # one batch (`SlidingWindowSpec.max_admission_blocks_per_request`).
    inflight_counts_concurrent_batches: bool
    # Recurrent state and prefix caching (`MambaModelConfig`, `mamba_cache_mode`):
    # "off": state is never prefix-cached (1 page a request; up to 0.15.0, prefix caching is
    #   forced or defaulted off for hybrids); "align": with prefix caching on, 2 pages plus the
    #   mixer's prefill checkpoints (0.15.1+); "all_for_supported": 0.26-0.27 give the models
    #   that support it (Mamba-2 hybrids, Jamba) "all" mode, a state page per block.
    mamba_prefix_caching: str
    # Prefix caching on by default for hybrid (attention + state) models, 0.26+.
    hybrid_prefix_caching_default: bool
    mamba2_checkpoint_page: bool  # Mamba-2 mixers add a prefill checkpoint page, 0.32+
    # Speculative decoding: a recurrent layer's `num_speculative_blocks` (K, set for every method, ngram too)
    # counted per request in the start-up figures and the max_model_len check (`MambaSpec.max_memory_usage_bytes`:
    # 1 + K pages, 2 + K in align mode), 0.15.0+ (read in 0.14.1 and 0.15.0); before, without K.
    mamba_counts_speculative_blocks: bool
    # The recurrent variants whose conv state keeps K more columns (`conv_kernel - 1 + num_spec`): gated delta net
    # in every release read (0.10.2+), Mamba-2 from 0.17.0, KDA from 0.27.0, short conv from 0.29.0; never Mamba-1.
    speculative_conv_variants: frozenset
    # Qwen gated delta net adds one with the FlashInfer prefill backend (auto on SM90), 0.33+, and its 64-token
    # checkpoint alignment then joins the hybrid block's ("align" mode: `capacity.checkpoint_block_alignment`).
    gdn_checkpoint_page_on_hopper: bool
    # Hybrid attention block raised to hold a state page, aligned to A
    # (`_align_hybrid_block_size`): "16" (up to 0.11.0); "model" (0.11.1-0.19: 64 for MLA,
    # 128 for CUTLASS MLA, 32 for head size 256 on Blackwell, else 16); "kernel" (0.20+:
    # max(the backend's kernel block, --block-size)).
    hybrid_block_alignment: str
    mla_hybrid_block_min_128: bool  # A >= 128 for MLA hybrids, 0.27.1+
    # An explicit --block-size on an MLA model: "forced" to FlashMLA's 64 (up to 0.10);
    # "backend_multiple": kept if a multiple of 64 (FlashMLA) or 128 (CUTLASS) (0.11-0.17);
    # "user": a backend that takes it is chosen (FlashAttention MLA: multiples of 16), 0.18+.
    mla_block_size_rule: str
    # mamba_ssm_cache_dtype "auto" for Nemotron-H: the config's value, else this default
    # (None: the model dtype, up to 0.12; float16 in 0.13-0.19; float32 from 0.20).
    nemotron_h_ssm_default: str | None
    qwen35_reads_mamba_ssm_dtype: bool  # the config's mamba_ssm_dtype, 0.17+
    gdn_respects_ssm_dtype: bool  # --mamba-ssm-cache-dtype applies to gated delta net, 0.17+
    max_len_check_counts_padding: bool  # _max_memory_usage_bytes_from_groups, 0.14+
    big_gpu_tier: bool  # >= 160 GiB GPUs: 16384 batched tokens for `vllm serve` too (0.28+)
    # DeepSeek-V3.2 forces fp8_ds_mla for "auto" in 0.11.0 only.
    sparse_mla_auto_fp8: bool
    # A waiting request is admitted only if its whole prompt fits (scheduler_reserve_full_isl,
    # 0.19+); before, only its first prefill chunk had to fit.
    admit_full_prompt: bool
    # MoE layers shard their experts over every GPU of a data-parallel deployment, tp x dp
    # (`FusedMoEParallelConfig.make`: flatten_tp_across_dp; with --enable-expert-parallel, whole
    # experts over the same GPUs). Read in 0.10.2 and every later release; earlier ones not read.
    moe_shards_over_dp: bool
    # Freed blocks without a hash go to the head of the free queue (reused first) and cached ones to
    # the tail (`BlockPool.free_blocks`, 0.23+); up to 0.22 all went to the tail (read in 0.22.0, 0.23.0).
    free_uncached_first: bool
    # vllm:prefix_cache_queries / _hits count a request when it is admitted ("Record at admission so
    # unscheduled lookups are not counted", scheduler.py, 0.27+); up to 0.26 at every lookup, so a
    # request waiting for KV counts once a step (`get_computed_blocks`, read in 0.26.0, 0.27.1).
    prefix_stats_at_admission: bool
    # The start-up check that one max_model_len request fits (and its estimate, and auto-fit) plans against the
    # memory less one block, the null block the pool holds back (`check_memory`, kv_cache_utils.py, 0.29+;
    # not in 0.28.0).
    max_len_check_reserves_null_block: bool = False
    # DeepSeek-V4 (models/deepseek_v4): its mixed block sizes are grouped by `_get_packed_kv_cache_groups`
    # (kv_cache_utils.py, 0.29+), which kvplan follows; 0.20-0.28 grouped and counted them by other code,
    # which it does not. From 0.30 "auto" is its fp8_ds_mla layout; 0.29 asserts an fp8 dtype.
    dsv4_packed_layout: bool = False
    dsv4_auto_fp8_ds_mla: bool = False
    # --speculative-config's kv_cache_dtype: a key of SpeculativeConfig from 0.26 (before, extra="forbid" refuses
    # it); the drafter's layers are built under a cache config with that dtype by both model runners
    # (llm_base_proposer.py `_create_draft_vllm_config`, v1/worker/gpu/spec_decode/eagle/utils.py), except a
    # draft model's on 0.31, whose default Model Runner V2 speculator keeps the target's dtype.
    draft_kv_cache_dtype: bool = False
    draft_model_keeps_target_kv_dtype: bool = False
    # The native CPU offload tier's memory: "none" (0.11.1's never builds: `num_cpu_blocks: 0` and
    # CPUOffloadingSpec raises; 0.12-0.18 not read), "pinned" (0.19.1-0.26: each rank's pinned torch tensors,
    # which PyTorch's host allocator rounds up to a power of two, vllm#53042; an MLA block stored by every rank),
    # "region" (0.27+, NVIDIA: one /dev/shm region, page-aligned chunks, one MLA copy on TP-only, PR #50094).
    offload_memory: str = "region"
    # ... and with one KV group a rank pins one cross-layer tensor (the connector prefers that layout), which MLA
    # backends allow from 0.24 (their layered stride order; before, one tensor per layer, mla_attention.py).
    offload_cross_layer_mla: bool = True
    # The V1 engine prints "GPU KV cache size" and "Maximum concurrency" once per rank, each from that rank's own
    # available memory, before it gives every rank the smallest rank's blocks (`get_kv_cache_config` per worker,
    # then `unify_kv_cache_configs`, v1/engine/core.py; read in 0.8.5, 0.9.2, 0.10.0, 0.10.1.1, 0.10.2, 0.11.0); from
    # 0.11.1 once, after that minimum (`_report_kv_cache_config` in `get_kv_cache_configs`, `info_once`). So
    # before 0.11.1 a quoted token line and a quoted memory line of a multi-GPU engine may be different ranks'.
    capacity_logged_per_rank: bool = False
    # CacheConfig.DEFAULT_BLOCK_SIZE, the block size a GPU's attention backends are offered first
    # (`Platform._preferred_block_size_for_backends`): 16, 64 from 0.34 (config/cache.py@0.34.0).
    gpu_default_block_size: int = 16
    # The extensible KV cache (config/cache.py@0.34.0 `enable_extensible_kv_cache`), on by default on CUDA from
    # 0.34 unless --kv-cache-memory-bytes or --num-gpu-blocks-override: gpu_memory_utilization defaults to 1.0
    # (`resolved_gpu_memory_utilization`) and the pool is sized from the memory free after warmup and CUDA graph
    # capture (`measure_kv_cache_bytes`, v1/worker/extensible_kv_cache.py@0.34.0).
    extensible_kv_cache: bool = False
    # Async scheduling stays on by default with pp > 1 (Model Runner V1, which refused it, removed in 0.34:
    # config/vllm.py@0.34.0), and max_concurrent_batches is then pp + 1.
    async_scheduling_with_pp: bool = False

    note: str | None = None  # when the asked release is outside what kvplan has read

    @property
    def label(self) -> str:
        return f"vLLM {self.version}"


def parse_version(text: str) -> tuple[int, int, int]:
    """``0.9.1.dev705+g01220ce89`` -> (0, 9, 1)."""
    match = _VERSION_RE.match(str(text).strip())
    if not match:
        raise KvplanError(f"invalid vLLM version {text!r}", f"use a release such as {NEWEST_KNOWN} or 0.11.0")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def first_release(field: str) -> str:
    """The first release kvplan has read whose rule ``field`` is on: help texts name it from here, never by hand."""
    return next(v for v in KNOWN_VERSIONS if getattr(rules_for(v), field))


def text_of(v: tuple[int, int, int]) -> str:
    return ".".join(map(str, v))


def rules_for(version: str | None = None) -> VllmRules:
    """The rules of ``version`` (default: the newest release kvplan knows)."""
    v = parse_version(version or NEWEST_KNOWN)
    if v < (0, 9, 0):
        token_report = "blocks"
    elif v < (0, 20, 1):
        token_report = "per_group"
    else:
        token_report = "concurrency"
    if v < (0, 15, 1):
        mamba_prefix_caching = "off"
    elif (0, 26, 0) <= v < (0, 28, 0):
        mamba_prefix_caching = "all_for_supported"
    else:
        mamba_prefix_caching = "align"
    note = None
    if v > parse_version(NEWEST_KNOWN):
        note = f"vLLM {text_of(v)} is newer than any release kvplan has read ({NEWEST_KNOWN}): its rules assumed"
    elif v < (0, 6, 0):
        note = f"vLLM {text_of(v)} is older than any release kvplan has read (0.6): V0 rules assumed"
    return VllmRules(
        note=note,
        version=".".join(map(str, v)),
        engine="v0" if v < (0, 8, 0) else "v1",
        capacity_logged_per_rank=(0, 8, 0) <= v < (0, 11, 1),
        default_gpu_memory_utilization=0.92 if v >= (0, 20, 0) else 0.9,
        subtracts_cudagraph_memory=v >= (0, 20, 0),
        token_report=token_report,
        hybrid_allocator=v >= (0, 9, 2),
        group_size_close_factor=None if v < (0, 12, 0) else 1.25 if v < (0, 18, 0) else 1.5,
        unify_page_size=v >= (0, 12, 0),
        block_size_multiple_of_16=v >= (0, 19, 1),
        auto_kv_reads_checkpoint=v >= (0, 14, 0),
        requested_memory_ceil=v >= (0, 14, 0),
        kv_cache_memory_flag=v >= (0, 11, 0),
        combined_capacity_line=v >= (0, 28, 0),
        chunked_local_uses_hybrid=v >= (0, 14, 0),
        async_scheduling_default=v >= (0, 14, 0),
        inflight_counts_concurrent_batches=v >= (0, 26, 0),
        mamba_prefix_caching=mamba_prefix_caching,
        hybrid_prefix_caching_default=v >= (0, 26, 0),
        mamba2_checkpoint_page=v >= (0, 32, 0),
        mamba_counts_speculative_blocks=v >= (0, 15, 0),
        speculative_conv_variants=frozenset(
            ["gated_delta_net"] + ["mamba2"] * (v >= (0, 17, 0)) + ["kda"] * (v >= (0, 27, 0))
            + ["short_conv"] * (v >= (0, 29, 0))),
        gdn_checkpoint_page_on_hopper=v >= (0, 33, 0),
        hybrid_block_alignment="16" if v < (0, 11, 1) else "model" if v < (0, 20, 0) else "kernel",
        mla_hybrid_block_min_128=v >= (0, 27, 1),
        mla_block_size_rule="forced" if v < (0, 11, 0) else "backend_multiple" if v < (0, 18, 0) else "user",
        nemotron_h_ssm_default=None if v < (0, 13, 0) else "float16" if v < (0, 20, 0) else "float32",
        qwen35_reads_mamba_ssm_dtype=v >= (0, 17, 0),
        gdn_respects_ssm_dtype=v >= (0, 17, 0),
        max_len_check_counts_padding=v >= (0, 14, 0),
        big_gpu_tier=v >= (0, 28, 0),
        sparse_mla_auto_fp8=(0, 11, 0) <= v < (0, 11, 1),
        admit_full_prompt=v >= (0, 19, 0),
        moe_shards_over_dp=v >= (0, 10, 0),
        free_uncached_first=v >= (0, 23, 0),
        prefix_stats_at_admission=v >= (0, 27, 0),
        max_len_check_reserves_null_block=v >= (0, 29, 0),
        dsv4_packed_layout=v >= (0, 29, 0),
        dsv4_auto_fp8_ds_mla=v >= (0, 30, 0),
        draft_kv_cache_dtype=v >= (0, 26, 0),
        draft_model_keeps_target_kv_dtype=(0, 31, 0) <= v < (0, 32, 0),
        offload_memory="none" if v < (0, 19, 1) else "pinned" if v < (0, 27, 0) else "region",
        offload_cross_layer_mla=v >= (0, 24, 0),
        gpu_default_block_size=64 if v >= (0, 34, 0) else 16,
        extensible_kv_cache=v >= (0, 34, 0),
        async_scheduling_with_pp=v >= (0, 34, 0),
    )
