"""vLLM's KV accounting rules by release.

Each field is a rule that changed across releases; `rules_for` picks the set for a version
string such as ``0.11.0``, ``v0.9.1.dev705+g01220ce89`` or ``0.11.0rc2.dev98``. Every rule
was read in vLLM's own source (wheels 0.9.2, 0.11.0, 0.19.1, 0.20.0, 0.21.0, 0.22.0, 0.33.0);
docs/vllm-accounting.md quotes the lines. Releases in between were not read: a change
dated "from 0.33" may have landed anywhere after 0.22.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvplan.errors import KvplanError

NEWEST_KNOWN = "0.33.0"
KNOWN_VERSIONS = ("0.6.0", "0.8.5", "0.9.2", "0.11.0", "0.15.1", "0.19.1", "0.20.0", "0.21.0", "0.22.0", "0.32.0", "0.33.0")

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class VllmRules:
    """The accounting rules one vLLM release follows."""

    version: str
    engine: str  # "v0" (legacy engine, no null block) or "v1"
    # gpu_memory_utilization default: 0.9, 0.92 from 0.20.0 (config/cache.py).
    default_gpu_memory_utilization: float
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 from 0.20.0 (envs.py).
    subtracts_cudagraph_memory: bool
    # "GPU KV cache size" tokens: "blocks" = num_blocks * block_size (V0, 0.8);
    # "per_group" = num_blocks // num_groups * min_block_size (0.9-0.20);
    # "concurrency" = int(max_concurrency * max_model_len) (0.21+, _report_kv_cache_config).
    token_report: str
    hybrid_allocator: bool  # per-group specs from 0.9.2; before, SWA was sized as full
    # group_size: fewest layers of any type; from 0.19.1 the most when max < 1.5 * min.
    group_size_rule: str
    unify_page_size: bool  # unify_kv_cache_spec_page_size, 0.19.1+
    # auto KV dtype reads a ModelOpt checkpoint's kv_cache_quant_algo (0.19.1+).
    auto_kv_reads_checkpoint: bool
    requested_memory_ceil: bool  # math.ceil(total * util), 0.19.1+
    kv_cache_memory_flag: bool  # --kv-cache-memory-bytes exists (0.11+)
    combined_capacity_line: bool  # "..., Maximum concurrency ..." on one line (0.33)
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 1 from 0.19.1.
    chunked_local_uses_hybrid: bool
    # Async scheduling on by default (`VllmConfig.__post_init__`): sliding/chunked layers
    # then keep 2 batches of max_num_batched_tokens in flight (`max_concurrent_batches`).
    async_scheduling_default: bool
    # Prefix caching on a model with recurrent state sets mamba_cache_mode "align"
    # (`MambaModelConfig.verify_and_update_config`): 2 state pages per request plus the
    # mixer's prefill checkpoints, instead of 1.
    mamba_align_with_prefix_caching: bool
    # Hybrid attention block raised to a multiple of max(kernel block, --block-size)
    # (`Platform._align_hybrid_block_size`) rather than of 16.
    hybrid_block_aligns_to_kernel: bool
    # An explicit --block-size on an MLA model picks an MLA backend that accepts it
    # (FlashAttention MLA: multiples of 16) instead of being forced to FlashMLA's 64.
    mla_block_size_from_user: bool
    max_len_check_counts_padding: bool  # _max_memory_usage_bytes_from_groups, 0.19.1+
    big_gpu_tier: bool  # >= 160 GiB GPUs: 16384 batched tokens for `vllm serve` too (0.33)
    # DeepSeek-V3.2 forces fp8_ds_mla for "auto" in 0.11 (removed by 0.19.1).
    sparse_mla_auto_fp8: bool
    # A waiting request is admitted only if its whole prompt fits (scheduler_reserve_full_isl,
    # 0.19.1+); before, only its first prefill chunk had to fit.
    admit_full_prompt: bool

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


def text_of(v: tuple[int, int, int]) -> str:
    return ".".join(map(str, v))


def rules_for(version: str | None = None) -> VllmRules:
    """The rules of ``version`` (default: the newest release kvplan knows)."""
    v = parse_version(version or NEWEST_KNOWN)
    if v < (0, 9, 0):
        token_report = "blocks"
    elif v < (0, 21, 0):
        token_report = "per_group"
    else:
        token_report = "concurrency"
    newest_era = v >= (0, 33, 0)
    note = None
    if v > parse_version(NEWEST_KNOWN):
        note = f"vLLM {text_of(v)} is newer than any release kvplan has read ({NEWEST_KNOWN}): its rules assumed"
    elif v < (0, 6, 0):
        note = f"vLLM {text_of(v)} is older than any release kvplan has read (0.6): V0 rules assumed"
    return VllmRules(
        note=note,
        version=".".join(map(str, v)),
        engine="v0" if v < (0, 8, 0) else "v1",
        default_gpu_memory_utilization=0.92 if v >= (0, 20, 0) else 0.9,
        subtracts_cudagraph_memory=v >= (0, 20, 0),
        token_report=token_report,
        hybrid_allocator=v >= (0, 9, 2),
        group_size_rule="max_if_close" if v >= (0, 19, 1) else "min",
        unify_page_size=v >= (0, 19, 1),
        auto_kv_reads_checkpoint=v >= (0, 19, 1),
        requested_memory_ceil=v >= (0, 19, 1),
        kv_cache_memory_flag=v >= (0, 11, 0),
        combined_capacity_line=newest_era,
        chunked_local_uses_hybrid=v >= (0, 19, 1),
        async_scheduling_default=v >= (0, 32, 0),
        mamba_align_with_prefix_caching=v >= (0, 32, 0),
        hybrid_block_aligns_to_kernel=v >= (0, 32, 0),
        mla_block_size_from_user=v >= (0, 32, 0),
        max_len_check_counts_padding=v >= (0, 19, 1),
        big_gpu_tier=newest_era,
        sparse_mla_auto_fp8=(0, 11, 0) <= v < (0, 19, 0),
        admit_full_prompt=v >= (0, 19, 1),
    )
