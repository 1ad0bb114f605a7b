"""SGLang's KV-pool rules by release, read in its wheels (docs/engines-sglang-rules.md quotes the lines).

``rules_for("0.5.3")`` picks the set of one release. Each field names the release that introduced it; the wheels
read are the last patch of every minor line from 0.4.6 to 0.5.23, so a rule may have landed in any patch between the
previous release read and the one named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvplan.errors import KvplanError

NEWEST_KNOWN = "0.5.23"
KNOWN_VERSIONS = (
    "0.4.6", "0.4.7", "0.4.8", "0.4.9", "0.4.10", "0.5.1", "0.5.2", "0.5.3", "0.5.4", "0.5.5", "0.5.6", "0.5.7",
    "0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18",
    "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post\d+|rc\d+|\.dev\d+)?\s*$")


@dataclass(frozen=True)
class SglangRules:
    """The pool rules one SGLang release follows (``ServerArgs`` defaults and ``ModelRunner`` sizing)."""

    version: str
    # mem_fraction_static's default (server_args.py): "table" = by TP x PP (0.4.6); "gpu_reserve" = 1 - a reserve
    # by GPU size (0.4.7-0.5.2, `(9.5 + tp*pp/2) GiB` on 35-90 GiB cards); "activation_reserve" = 1 - a reserve from
    # the chunked-prefill size, the decode CUDA graphs and TP x PP, at least 10 GiB on > 60 GiB cards (0.5.3+,
    # `_handle_gpu_memory_settings`, from 0.5.19 arg_groups/memory_hook.py `handle_gpu_memory_settings`).
    fraction_rule: str
    # Prefill ("piecewise") CUDA graphs on by default, their reserve in the fraction: len(capture sizes) x 8 MiB,
    # 1.5 GiB for MLA (0.5.10+, `reserve_for_graph_mb`); before, opt-in.
    prefill_graph_reserve: bool
    # The chunked-prefill / decode-graph table's 20-35 GiB row (0.5.3+): decode graphs' max batch 16 (0.5.3),
    # 24 (0.5.4-0.5.22), 48 and a 4096 chunk (0.5.23); x5 (80 / 80 / 160) at TP >= 4.
    small_gpu_row: tuple[int, int, int]  # (chunked_prefill_size, max_bs at tp < 4, max_bs at tp >= 4)
    # "auto" KV dtype: the model dtype (to 0.5.2); FP8 where a ModelOpt checkpoint says kv_cache_quant_algo FP8
    # (0.5.3+, `init_memory_pool`).
    auto_kv_reads_checkpoint: bool
    # The fraction when the GPU's size is unknown: 0.88; 0.95 in 0.5.23 (the release that changed it not pinned).
    unknown_gpu_fraction: float
    # DeepSeek-V3.2's NSA pool (`NSATokenToKVPool`, from 0.5.3): whether its "KV size" line and the bytes a token
    # the budget is divided by count the indexer's key cache. 0.5.3 prints and divides by the MLA latent alone
    # (mem_cache/memory_pool.py@0.5.3 logs before the indexer buffers exist); 0.5.3.post1 on count both (sglang
    # PR #11309: "NSA will allocate indexer KV cache later and then log the total size", memory_pool.py@0.5.3.post1;
    # `profile_max_num_token` adds ``indexer_size_per_token``, model_runner.py@0.5.3.post1). None: before 0.5.3,
    # which has no NSA pool.
    nsa_indexer_in_pool: bool | None
    # DeepSeek NSA's mem_fraction_static: 0.5.3 sets it to 0.8 over any value given ("Setting mem fraction static to
    # 0.8 for DeepSeek NSA", server_args.py@0.5.3); 0.5.3.post1 on dropped the line (server_args.py@0.5.3.post1).
    nsa_forced_fraction: float | None
    # How the hybrid sliding-window pool is sized from the budget (kvplan/sglang/hybrid.py `swa_split` names each):
    # "0.4.9" (`set_num_token_hybrid`, model_runner.py@0.4.9.post6 .. @0.5.6.post2, the same text in each), "0.5.7"
    # (model_runner_kv_cache_mixin.py@0.5.7), "0.5.8" (@0.5.8.post1), "0.5.9" (@0.5.9), "0.5.10" (@0.5.10.post1),
    # "0.5.11" (model_executor/pool_configurator.py@0.5.11 .. @0.5.23). None: before 0.4.9, which has no such pool
    # (no ``swa_full_tokens_ratio`` in server_args.py@0.4.8.post1).
    swa_sizing: str | None
    # Mamba / GDN hybrids' state pool split from the budget by ``mamba_full_memory_ratio`` (`handle_max_mamba_cache`,
    # model_runner.py@0.5.3.post3 .. @0.5.6.post2, model_runner_kv_cache_mixin.py@0.5.7 .. @0.5.15.post1: the same
    # ratio branch in each, radix cache on, no speculative decoding). 0.5.3 sizes it from --max-mamba-cache-size or 512
    # (model_runner.py@0.5.3). 0.5.14 and 0.5.15 keep the ratio branch's text and ``MambaPool``'s size + 1 slots
    # (extra_buffer's ping-pong slots are indices into the same pool, mem_cache/memory_pool.py@0.5.14, @0.5.15.post1);
    # only the cap's divisor changes (`mamba_slots_per_request`). 0.5.16 on size the pool in
    # mem_cache/kv_cache_configurator.py and unified_memory_pool.py, not read: not sized.
    mamba_ratio_split: bool
    # The SSM state's dtype from the config's ``mamba_ssm_dtype`` (0.5.9 on, configs/mamba_utils.py@0.5.9
    # `mamba2_state_dtype`, called from configs/qwen3_next.py and nemotron_h.py); before, --mamba-ssm-dtype, float32.
    mamba_ssm_from_config: bool
    # The running-request cap's divisor of the state pool's slots, radix cache on, no speculative decoding
    # (``max_num_reqs = min(max_num_reqs, max_mamba_cache_size // ratio)``): 3 (model_runner.py@0.5.3.post3 ..
    # @0.5.6.post2; model_runner_kv_cache_mixin.py@0.5.8.post1 .. @0.5.13.post1 (`_calculate_mamba_ratio` from
    # 0.5.10), the extra-buffer term only with --mamba-scheduler-strategy extra_buffer, which "auto" is not:
    # "auto" -> "no_buffer", server_args.py@0.5.8.post1 .. @0.5.13.post1); 5 in 0.5.7, whose `init_memory_pool` adds
    # MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP (2) unless extra_buffer *and* speculative decoding are both on; 5 in
    # 0.5.14-0.5.15 (`mamba_extra_buffer_default`; 0.5.16 on not read, 3 kept), where `_calculate_mamba_ratio`
    # (model_runner_kv_cache_mixin.py@0.5.14, the same @0.5.15.post1) adds the overlap term (2) to 3.
    mamba_slots_per_request: int
    # "auto" becomes extra_buffer for Qwen3-Next, Qwen3.5 and Nemotron-H (the overlap schedule on and
    # --linear-attn-backend triton, both defaults): `_handle_mamba_radix_cache` (server_args.py@0.5.14), moved to
    # `_mamba_radix_cache_resolution` (arg_groups/overrides.py@0.5.15.post1), the same test; its validation asserts
    # "extra_buffer needs CUDA/MUSA/NPU (FLA)". Before 0.5.14 "auto" is "no_buffer" (server_args.py@0.5.8.post1 ..
    # @0.5.13.post1); 0.5.16 on not read (their Mamba pool is refused).
    mamba_extra_buffer_default: bool
    # GDN's slots divided by the DP size under DP attention, after the ratio split (model_runner.py@0.5.3.post3 ..
    # @0.5.6.post2); 0.5.7 on divide only an explicit --max-mamba-cache-size (model_runner_kv_cache_mixin.py@0.5.7).
    mamba_gdn_slots_per_dp: bool

    @property
    def label(self) -> str:
        return f"SGLang {self.version}"


def parse_version(text: str) -> tuple[int, int, int]:
    """``0.5.3.post3`` -> (0, 5, 3)."""
    match = _VERSION_RE.match(str(text).strip())
    if not match:
        raise KvplanError(f"invalid SGLang version {text!r}", f"use a release such as {NEWEST_KNOWN} or 0.4.9")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def rules_for(version: str | None = None) -> SglangRules:
    """The rules of ``version`` (default: the newest release kvplan has read). Outside 0.4.6-0.5.23 it refuses:
    SGLang's pool code changed too often to assume a neighbour's."""
    v = parse_version(NEWEST_KNOWN if version is None else version)
    text = ".".join(map(str, v))
    post = re.search(r"post(\d+)", str(version or ""))
    if not (0, 4, 6) <= v <= parse_version(NEWEST_KNOWN):
        raise KvplanError(f"kvplan has not read SGLang {text}'s pool code (it has read 0.4.6 to {NEWEST_KNOWN})",
                          "give --engine-version within that range")
    return SglangRules(
        version=text,
        fraction_rule="table" if v < (0, 4, 7) else "gpu_reserve" if v < (0, 5, 3) else "activation_reserve",
        prefill_graph_reserve=v >= (0, 5, 10),
        small_gpu_row=(2048, 16, 80) if v < (0, 5, 4) else (2048, 24, 80) if v < (0, 5, 23) else (4096, 48, 160),
        auto_kv_reads_checkpoint=v >= (0, 5, 3),
        unknown_gpu_fraction=0.95 if v >= (0, 5, 23) else 0.88,
        nsa_indexer_in_pool=None if v < (0, 5, 3) else v > (0, 5, 3) or bool(post and int(post.group(1)) >= 1),
        nsa_forced_fraction=0.8 if v == (0, 5, 3) and not (post and int(post.group(1)) >= 1) else None,
        mamba_ratio_split=(0, 5, 4) <= v <= (0, 5, 15) or (v == (0, 5, 3) and bool(post and int(post.group(1)) >= 3)),
        mamba_ssm_from_config=v >= (0, 5, 9),
        mamba_slots_per_request=5 if v == (0, 5, 7) or (0, 5, 14) <= v <= (0, 5, 15) else 3,
        mamba_extra_buffer_default=(0, 5, 14) <= v <= (0, 5, 15),
        mamba_gdn_slots_per_dp=v <= (0, 5, 6),
        swa_sizing=None if v < (0, 4, 9) else "0.4.9" if v < (0, 5, 7) else "0.5.7" if v < (0, 5, 8)
        else "0.5.8" if v < (0, 5, 9) else "0.5.9" if v < (0, 5, 10) else "0.5.10" if v < (0, 5, 11) else "0.5.11",
    )
