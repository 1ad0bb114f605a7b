"""SGLang's hybrid pools sized from the KV budget: the sliding-window pool and DeepSeek-V3.2's NSA pool.

The budget is the plain pool's (kvplan/sglang/pool.py: ``rest = A - P x (1 - mem_fraction_static)``, in bytes as
SGLang makes it, ``int(rest_memory x 2^30)``); what differs is the bytes a token the budget is divided by, and how
the tokens are split. Each rule is read in the release named (docs/engines-sglang-rules.md quotes the lines).

Sliding window (``SWAKVPool``: a full-attention pool of ``full_layer_tokens`` and a sliding-window pool of
``swa_layer_tokens``, ``swa = full x swa_full_tokens_ratio``, 0.8 by default). With ``F``/``S`` the bytes of one
full / sliding-window layer for one token on one GPU, ``nf``/``ns`` their layer counts, ``r`` the ratio, ``page``
SGLang's page size and ``align(x) = x // page x page``:

- 0.4.9 to 0.5.6 (`profile_max_num_token` and `set_num_token_hybrid`, model_runner.py@0.4.9.post6 .. @0.5.6.post2,
  the same text in each): ``cell = F x (nf + ns)`` (``model_config.head_dim`` x ``get_num_kv_heads`` x every layer:
  the full layers' shape); ``M = budget // cell``; ``full = int(M x (nf + ns) / (r x ns + nf))``, ``swa = int(full x
  r)``; ``M`` aligned to the page, ``full`` and ``swa`` not (moot: the hybrid pool takes page 1 only, its
  ``SWATokenToKVPoolAllocator`` being built only when ``page_size == 1``).
- 0.5.7 (model_runner_kv_cache_mixin.py@0.5.7 `get_cell_size_per_token`, `profile_max_num_token`,
  `set_num_tokens_hybrid_swa`): the cell over the full layers' ids plus MiMo-V2-Flash's SWA term, ``cell = F nf + S
  ns``; then 0.4.9's split by layers, both aligned; page 1 only, as before.
- 0.5.8 (model_runner_kv_cache_mixin.py@0.5.8.post1 `get_cell_size_per_token`, `set_num_tokens_hybrid_swa`):
  ``cell = F x (nf + ns)`` (every layer at the full layers' shape), plus ``S x ns`` for MiMo-V2-Flash (its
  over-count, fixed by sglang PR #18039); ``M = align(budget // cell)``; ``full = int(M x (nf + ns) / (r x ns + nf))``,
  ``swa = int(full x r)``, both then aligned.
- 0.5.9 (model_runner_kv_cache_mixin.py@0.5.9): ``cell = F nf + S ns``; ``M = align(budget // cell)``;
  ``full = int(M x cell / (F nf + r S ns))``, ``swa = int(full x r)``, both then aligned.
- 0.5.10 (@0.5.10.post1 `_resolve_hybrid_swa_tokens`): as 0.5.9, but ``swa = align(int(align(full) x r))``.
- 0.5.11 on (model_executor/pool_configurator.py@0.5.11 .. @0.5.23 `HybridSWAPoolConfigurator`): the ratio is in the
  cell, ``cell = F nf + r S ns``; ``full = align(int(budget // cell))``, ``swa = align(int(full x r))``.

``--max-total-tokens`` caps ``M`` (0.4.9-0.5.10) or ``full`` (0.5.11 on, `calculate_pool_sizes_from_max_tokens`).

Which architectures get the hybrid pool changed by release (`HYBRID_SWA_ARCHS`).

NSA (``NSATokenToKVPool``, DeepSeek-V3.2; read 0.5.3 to 0.5.10): page 64, the budget divided by ``(kv_lora_rank +
qk_rope_head_dim) x layers x the cache dtype's bytes`` (1 for FP8, although the FP8 buffer holds 656 bytes a layer:
512 + 4 scales x 4 + 64 x 2), plus, from 0.5.3.post1, the indexer's keys, ``(index_head_dim + index_head_dim //
128 x 4) x layers`` (model_runner.py@0.5.3.post1 .. @0.5.6.post2 `profile_max_num_token`, model_runner_kv_cache_mixin.py@0.5.7 ..
@0.5.8.post1 `get_cell_size_per_token`; @0.5.3 has no indexer term). The buffers (memory_pool.py) and the dtype
rule ("auto": FP8 on Blackwell, else bf16; server_args.py) are 0.5.4's through 0.5.10.post1 (the FP8 buffer without
its scales on Blackwell in 0.5.10, kvplan/sglang/pool.py `nsa_fp8_scaled`); from 0.5.6 DP attention's size is the one
given (kvplan/sglang/pool.py `NSA_DP_GIVEN_FROM`). The cell is `get_cell_size_per_token`@0.5.9 .. @0.5.10.post1.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.arch import Architecture
from kvplan.model.dtypes import KVDtype
from kvplan.model.layers import MLA, MLAIndexer

#: Architectures whose hybrid sliding-window pool kvplan sizes: the first and last release read that gives them one
#: (None: still so in the newest read). A release outside its range pools the model's window layers as full pages.
#: - 0.4.9-0.5.6: `ModelRunner.__init__` turns the pool on for any model whose class has
#:   ``get_attention_sliding_window_size`` (models/gemma2.py, gemma3_causal.py, gemma3_mm.py@0.4.9.post6; gpt_oss.py
#:   from 0.5.x), unless --disable-hybrid-swa-memory; `model_specific_adjustments` sets that flag for Gemma2 in 0.4.10
#:   (server_args.py@0.4.10.post2), and for every Gemma 2 / 3 / 3n and GPT-OSS from 0.5.1 (@0.5.1.post3 ..
#:   @0.5.6.post2). Gemma 3n's shared-KV layers are not sized.
#: - 0.5.7: only ``is_hybrid_model``'s list (MiMo-V2-Flash; Llama 4 with --hybrid-kvcache-ratio), model_config.py@0.5.7.
#: - 0.5.8 on: ``is_hybrid_swa_model`` (configs/model_config.py@0.5.8.post1 .. @0.5.23).
#: SGLang lists more (Llama 4's chunked attention, Step-3.5, Gemma 4, ...): their SWA layers' shapes
#: (``swa_head_dim``, ``attention_other_setting``) are not checked against kvplan's, so they are refused.
HYBRID_SWA_ARCHS: dict[str, tuple[str, str | None]] = {
    "Gemma2ForCausalLM": ("0.4.9", "0.4.9"),
    "Gemma3ForCausalLM": ("0.4.9", "0.4.10"),
    "Gemma3ForConditionalGeneration": ("0.4.9", "0.4.10"),
    "GptOssForCausalLM": ("0.5.8", None),
    "MiMoV2FlashForCausalLM": ("0.5.7", None),
    "MiMoV2ForCausalLM": ("0.5.11", None),
}
_MIMO_OVERCOUNT = "MiMoV2FlashForCausalLM"  # get_cell_size_per_token@0.5.8.post1 names this one


@dataclass(frozen=True)
class SwaSplit:
    """The hybrid sliding-window pool of one GPU, as one release sizes it from the budget."""

    full_tokens: int  # full_layer_tokens (= max_total_num_tokens, what the scheduler counts)
    swa_tokens: int  # swa_layer_tokens
    cell_bytes: float  # the bytes a token the budget is divided by
    how: str
    # The count before the split, which the running-request estimate is taken from where a release does so
    # (`init_memory_pool` computes max_num_reqs before `set_num_token(s)_hybrid(_swa)`, model_runner.py@0.4.9.post6 ..
    # model_runner_kv_cache_mixin.py@0.5.9); None where that was not read (0.5.10 on).
    profiled_tokens: int | None = None


def hybrid_swa_in(arch: Architecture, version: str) -> bool | None:
    """Whether SGLang ``version`` gives ``arch`` its hybrid sliding-window pool, for the architectures kvplan has read
    it for (`HYBRID_SWA_ARCHS`); None for another architecture."""
    v = _v(version)
    ranges = [HYBRID_SWA_ARCHS[name] for name in arch.architectures if name in HYBRID_SWA_ARCHS]
    if not ranges:
        return None
    return any(_v(first) <= v and (last is None or v <= _v(last)) for first, last in ranges)


def hybrid_swa_arch(arch: Architecture, version: str) -> str:
    """The architecture that gives ``arch`` SGLang's hybrid sliding-window pool in ``version``; refused with the reason
    where SGLang gives it none or kvplan does not size it."""
    for name in arch.architectures:
        first, last = HYBRID_SWA_ARCHS.get(name, ("99.0", None))
        if _v(first) <= _v(version) and (last is None or _v(version) <= _v(last)):
            return name
    names = ", ".join(arch.architectures) or "no architecture"
    raise KvplanError(f"kvplan does not size SGLang {version}'s hybrid sliding-window pool for {names}: it has read "
                      f"its split for {', '.join(sorted(HYBRID_SWA_ARCHS))} only (SGLang lists more architectures for "
                      "it, whose shapes kvplan has not checked)", "size it for vLLM (--engine vllm)")


def swa_split(budget_bytes: int, full_layer_bytes: int, full_layers: int, swa_layer_bytes: int, swa_layers: int,
              ratio: float, page: int, sizing: str, architecture: str,
              max_total_tokens: int | None = None) -> SwaSplit:
    """``full_layer_bytes`` / ``swa_layer_bytes``: one token of ONE layer of each kind on one GPU (F, S above)."""
    if not 0 < ratio <= 1:
        raise KvplanError(f"invalid --swa-full-tokens-ratio {ratio!r}", "give a ratio in (0, 1]")
    f_all, s_all = full_layer_bytes * full_layers, swa_layer_bytes * swa_layers
    budget = max(0, int(budget_bytes))

    def align(x: float) -> int:
        return int(x) // page * page

    def capped(tokens: int) -> int:
        return min(tokens, max_total_tokens) if max_total_tokens else tokens

    if sizing in ("0.4.9", "0.5.7", "0.5.8"):  # split by layer counts
        if sizing != "0.5.8" and page != 1:
            raise KvplanError(f"SGLang {sizing}'s hybrid sliding-window pool takes page size 1 only (its allocator is "
                              "built for page 1, model_runner.py@0.4.9.post6 .. model_runner_kv_cache_mixin.py@0.5.7)",
                              "drop --page-size, or give --engine-version 0.5.8 or later")
        cell = (f_all + s_all if sizing == "0.5.7" else full_layer_bytes * (full_layers + swa_layers)
                + (s_all if sizing == "0.5.8" and architecture == _MIMO_OVERCOUNT else 0))
        m = align(capped(budget // cell))
        full = int(m * (full_layers + swa_layers) / (ratio * swa_layers + full_layers))
        swa = int(full * ratio)
        return SwaSplit(align(full), align(swa), cell, f"{sizing}: {budget:,} B // {cell:,} B = {m:,} tokens "
                        f"{'of every layer' if sizing != '0.5.7' else 'a token'}, split by layers: x "
                        f"{full_layers + swa_layers} / ({ratio:g} x {swa_layers} + {full_layers})", m)
    if sizing in ("0.5.9", "0.5.10"):
        cell = f_all + s_all
        m = align(capped(budget // cell))
        full = int(m * cell / (f_all + ratio * s_all))
        swa = int((align(full) if sizing == "0.5.10" else full) * ratio)
        return SwaSplit(align(full), align(swa), cell, f"{sizing}: {budget:,} B // {cell:,} B = {m:,} tokens, split "
                        f"by bytes: x {cell:,} / ({f_all:,} + {ratio:g} x {s_all:,})", m if sizing == "0.5.9" else None)
    if sizing == "0.5.11":
        cell = f_all + ratio * s_all
        full = align(capped(int(budget // cell)))
        return SwaSplit(full, align(int(full * ratio)), cell,
                        f"0.5.11 on: {budget:,} B // ({f_all:,} + {ratio:g} x {s_all:,} B)")
    raise KvplanError(f"kvplan has read SGLang's hybrid sliding-window sizing from 0.4.9 on (not {sizing})",
                      "give --engine-version 0.4.9 or later")


def nsa_profile_cell(arch: Architecture, dtype: KVDtype, kv_lora_rank: int, rope_dim: int, with_indexer: bool) -> int:
    """The bytes a token the NSA pool's budget is divided by (not its buffers' bytes: kvplan/sglang/pool.py
    `nsa_cell`)."""
    mla = [s for s in arch.layers if type(s) is MLA]
    indexers = [s for s in arch.layers if type(s) is MLAIndexer]
    if not mla or len(mla) != len(indexers):
        raise KvplanError("kvplan prices SGLang's NSA pool only for a model of MLA layers each with an indexer")
    cell = (kv_lora_rank + rope_dim) * len(mla) * dtype.bytes_per_element
    if with_indexer:  # uint8, index_k_with_scale_buffer_dtype
        cell += round(indexers[0].bytes_per_token(dtype)) * len(mla)
    return int(cell)


#: Architectures whose state SGLang keeps in its Mamba pool with ``Mamba2CacheParams`` (``mambaish_config``:
#: ``hybrid_gdn_config`` / ``mamba2_config``, model_runner.py@0.5.6.post2 .. @0.5.15.post1) and whose state shapes kvplan
#: has checked against ``Mamba2StateShape.create`` (configs/qwen3_next.py, configs/nemotron_h.py @0.5.6.post2; the same
#: shapes @0.5.7 .. @0.5.15.post1): conv ``(conv_dim / tp, conv_kernel - 1)`` in bf16 (``CONV_DTYPE``; from 0.5.9
#: ``SGLANG_MAMBA_CONV_DTYPE``, bf16 unset), temporal ``(heads / tp, head_dim, state_size)`` in the SSM dtype
#: (`mamba_ssm_dtype_bytes`), the same numbers as vLLM's shapes. Each maps to (its variant, the first release whose
#: ``mambaish_config`` takes it): Qwen3.5's configs (``Qwen3_5TextConfig(Qwen3NextConfig)``, configs/qwen3_5.py@0.5.9)
#: join ``hybrid_gdn_config`` in 0.5.9 (model_runner.py@0.5.9; not @0.5.8.post1).
MAMBA_ARCHS: dict[str, tuple[str, str]] = {
    "Qwen3NextForCausalLM": ("gated_delta_net", "0.5.3"),
    "NemotronHForCausalLM": ("mamba2", "0.5.3"),
    "Qwen3_5ForConditionalGeneration": ("gated_delta_net", "0.5.9"),
    "Qwen3_5MoeForConditionalGeneration": ("gated_delta_net", "0.5.9"),
}

#: ``mamba2_state_dtype``'s map (configs/mamba_utils.py@0.5.9 .. @0.5.23): bytes of the SSM state's element.
_SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def mamba_archs_in(version: str) -> dict[str, str]:
    """The architectures of `MAMBA_ARCHS` SGLang ``version`` keeps in its Mamba pool, each with its variant."""
    return {name: variant for name, (variant, first) in MAMBA_ARCHS.items() if _v(version) >= _v(first)}


def mamba_ssm_dtype_bytes(config_dtype: str | None, reads_config: bool) -> tuple[int, str]:
    """(bytes, how) of the SSM (temporal) state's element. To 0.5.8: ``--mamba-ssm-dtype``, float32 by default
    (server_args.py@0.5.6.post2). 0.5.9 on (`mamba2_state_dtype`, configs/mamba_utils.py@0.5.9 .. @0.5.23): the
    config's ``mamba_ssm_dtype`` (text_config's first), float32 where it has none or one outside float32 / bfloat16 /
    float16 (SGLang warns and keeps float32); ``--mamba-ssm-dtype`` (SGLANG_MAMBA_SSM_DTYPE) would override it, which
    kvplan does not take."""
    if not reads_config:
        return 4, "float32, --mamba-ssm-dtype's default"
    if config_dtype in _SSM_DTYPE_BYTES:
        return _SSM_DTYPE_BYTES[config_dtype], f"{config_dtype}, the config's mamba_ssm_dtype"
    if config_dtype is None:
        return 4, "float32: the config gives no mamba_ssm_dtype"
    return 4, f"float32: SGLang ignores the config's mamba_ssm_dtype {config_dtype!r}"


@dataclass(frozen=True)
class MambaSplit:
    """The state pool's slots and the budget left for the KV pool (bytes, one GPU)."""

    max_mamba_cache_size: int
    state_bytes: float  # what the slots take out of the budget
    kv_budget_bytes: float


def mamba_split(budget_bytes: float, per_request_bytes: int, ratio: float) -> MambaSplit:
    """`handle_max_mamba_cache` (model_runner.py@0.5.3.post3 .. @0.5.6.post2, model_runner_kv_cache_mixin.py@0.5.7 ..
    @0.5.15.post1: the ratio branch unchanged; @0.5.13.post1 names it ``mamba_budget``), radix cache on, no speculative
    decoding: ``raw = rest x ratio / (1 + ratio)`` GiB; ``max_mamba_cache_size = int(raw x 2^30 //
    mamba_cache_per_req)``; the KV pool gets ``rest - max_mamba_cache_size x mamba_cache_per_req / 2^30``."""
    if not 0 < ratio < 1e6:  # finite: SGLang's ratio / (1 + ratio) of an infinite one is NaN
        raise KvplanError(f"invalid --mamba-full-memory-ratio {ratio!r}", "give a ratio above 0 (SGLang's default 0.9)")
    rest_gib = budget_bytes / (1 << 30)
    slots = max(0, int((rest_gib * ratio / (1 + ratio) * (1 << 30)) // per_request_bytes))
    state_gib = slots * per_request_bytes / (1 << 30)
    return MambaSplit(slots, state_gib * (1 << 30), (rest_gib - state_gib) * (1 << 30))


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


__all__ = ["HYBRID_SWA_ARCHS", "MAMBA_ARCHS", "MambaSplit", "SwaSplit", "hybrid_swa_arch", "hybrid_swa_in",
           "mamba_archs_in", "mamba_split", "mamba_ssm_dtype_bytes", "nsa_profile_cell", "swa_split"]
