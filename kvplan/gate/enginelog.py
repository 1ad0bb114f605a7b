"""`kvplan check-log` for SGLang and TensorRT-LLM start-up logs: which engine wrote the log, then its printed
figures against the same engine's rules, number by number (kvplan/gate/checklog.py judges vLLM's).

The comparisons, as for vLLM:
- **page math** (gated): the engine's own memory figure given, the pool out. SGLang: the printed "K size" + "V size"
  (MLA: "KV size") -> ``#tokens`` through the config's bytes a token (kvplan/sglang/pool.py); TensorRT-LLM: the
  profiled "Estimated max memory in KV cache" (a TensorRT engine: fraction x "available") -> ``max_tokens`` -> blocks
  rounded up -> "(N)", and N x the bytes a token -> the printed GiB (kvplan/trtllm/pool.py).
- **budget rule** (gated with ``--gate all``): the engine's budget from the free memory it printed. SGLang:
  ``rest = A - P x (1 - mem_fraction_static)`` with P the "Load weight begin" and A the "Load weight end" free
  memory; TensorRT-LLM: ``(device total - peak + estimation pool) x fraction``.
- **full budget** (gated with ``--gate all``): from the GPU and the settings alone (`kvplan size --engine sglang|trtllm`):
  weights estimated from the config, the memory held before loading assumed; TensorRT-LLM's (PyTorch backend) also
  prices the dummy prefill's activation and assumes the CUDA graphs (kvplan/trtllm/budget.py).

A log whose engine cannot be told, or with nothing comparable, is refused (exit 2), never judged.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvplan.deploy import ResolvedModel, load_model_from_log, select_gpus
from kvplan.engines import EngineOptions, engine_named
from kvplan.errors import KvplanError
from kvplan.gate.checklog import LogComparison, Section, compare, comparison_table
from kvplan.model.dtypes import KVDtype, kv_dtype
from kvplan.model.layers import FullAttention, MambaState, MLAIndexer
from kvplan.paths import iter_user_lines
from kvplan.plan.schema import Settings
from kvplan.sglang import startup_log as sglang_lines
from kvplan.sglang.pool import (
    NSA_READ,
    SWA_FULL_TOKENS_RATIO,
    SwaPools,
    full_attention_cell,
    kv_cell,
    mamba_slot_bytes,
    max_running_requests,
    nsa_cell,
    nsa_fp8_scaled,
    pool_kind,
    resolve_kv_dtype,
    swa_pools,
    swa_tokens_of_full,
    tokens_from_budget,
    tokens_from_buffers,
)
from kvplan.sglang.rules import KNOWN_VERSIONS as SGLANG_VERSIONS
from kvplan.sglang.rules import rules_for as sglang_rules
from kvplan.term import make_console
from kvplan.trtllm import startup_log as trtllm_lines
from kvplan.trtllm.pool import (
    TrtllmCell,
    cell_of,
    pool_from_budget,
    pool_from_engine_free,
    pool_from_max_tokens,
    pool_gib,
    tokens_in_printed_gib,
)
from kvplan.trtllm.rules import DEFAULT_TOKENS_PER_BLOCK, READ_RELEASES
from kvplan.trtllm.rules import parse_version as trtllm_version
from kvplan.units import GiB
from kvplan.vllm.startup_log import KEYWORDS as VLLM_KEYWORDS
from kvplan.vllm.startup_log import MAX_KEPT_LINES, MAX_LINE, parse_startup_log, relevant_lines

ENGINES = ("vllm", "sglang", "trtllm")
_LABEL = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
_HALF = 0.005  # the engines print GiB with 2 decimals
_TORCH_KV = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float8_e4m3fn": "fp8_e4m3",
             "float8_e5m2": "fp8_e5m2", "float32": "float32"}


class EngineLogResult(BaseModel):
    """`kvplan check-log --json` for an SGLang or TensorRT-LLM log (`kvplan schema check-log-engines`)."""

    # pydantic before 2.10 warns on stderr about fields named model_*: its namespace, not ours
    model_config = ConfigDict(protected_namespaces=())

    log: str
    engine: str = Field(description="sglang or trtllm, as told from the log's own lines (or --engine)")
    engine_version: str | None = Field(description="the release the log prints (None: it prints none)")
    rules: str = Field(description="the rules that judged it, and why those")
    ok: bool
    tolerance: float
    gate: str
    model: str | None
    model_source: str | None
    gpu: str | None
    settings: dict[str, Any]
    page_math: Section | None
    budget: Section | None = Field(None, description="the engine's budget rule from the free memory it printed")
    full_budget: Section | None = Field(None, description="SGLang: from the GPU and the settings alone")
    full_budget_reason: str | None = Field(None, description="SGLang: why the full budget is not judged")
    sglang_log: sglang_lines.SglangStartup | None = Field(None, description="what the SGLang log says (engine sglang)")
    trtllm_log: trtllm_lines.TrtllmStartup | None = Field(None, description="what the TensorRT-LLM log says")
    notes: list[str] = Field(default_factory=list)


# --- reading and telling the engine ---------------------------------------------------------------

_KEYWORDS = tuple(dict.fromkeys(sglang_lines.KEYWORDS + trtllm_lines.KEYWORDS))


def engine_lines(lines) -> str:
    """The lines of a log any engine's reader can use, each cut, in bounded time and memory. vLLM's lines are kept
    exactly as vLLM's own reader keeps them (its last ``MAX_KEPT_LINES``), the other engines' beside them in a cap
    of their own, so a vLLM log full of request lines loses nothing it lost before."""
    vllm_kept: deque[tuple[int, str]] = deque(maxlen=MAX_KEPT_LINES)
    other_kept: deque[tuple[int, str]] = deque(maxlen=MAX_KEPT_LINES)
    for number, line in enumerate(lines):
        line = line[:MAX_LINE].rstrip("\r\n")
        if any(word in line for word in VLLM_KEYWORDS):
            vllm_kept.append((number, line))
        elif any(word in line for word in _KEYWORDS):
            other_kept.append((number, line))
    return "\n".join(line for _, line in sorted([*vllm_kept, *other_kept]))


def read_engine_log(path: str) -> str:
    """A log file's usable lines, streamed (a regular file only; errors are one-line KvplanErrors)."""
    return engine_lines(iter_user_lines(path, "", max_line=MAX_LINE))


def detect_engine(text: str) -> str:
    """The engine whose start-up lines the log holds; a log of none, or of several, is refused."""
    vllm = parse_startup_log(relevant_lines(text.splitlines()))
    vllm_lines = (vllm.has_capacity, vllm.failed, vllm.available_kv_gib is not None, vllm.vllm_version is not None,
                  vllm.weights_gib is not None, vllm.engine is not None and "tensor_parallel_size" in vllm.sources)
    scores = {"vllm": int(any(vllm_lines)),
              "sglang": sglang_lines.looks_like_sglang(text), "trtllm": trtllm_lines.looks_like_trtllm(text)}
    found = [name for name, score in scores.items() if score]
    if not found:
        raise KvplanError("cannot tell which engine wrote this log: it has no vLLM, SGLang or TensorRT-LLM KV-cache "
                          "start-up lines", "pass a start-up log (the lines up to the server's 'ready')")
    if len(found) > 1:
        names = " and ".join(_LABEL[n] for n in found)
        raise KvplanError(f"the log holds start-up lines of {names}", "pass --engine " + "|".join(found))
    return found[0]


# --- SGLang -----------------------------------------------------------------------------------------


def _sglang_dtype(r: sglang_lines.SglangStartup, arch, rules, given: str | None) -> tuple[KVDtype, str]:
    """The pool's dtype: --kv-cache-dtype, else as the log prints it, else its --kv-cache-dtype by the rules."""
    if given:
        return kv_dtype(given), "given on the command line"
    if r.kv_cache_dtype:
        name = _TORCH_KV.get(r.kv_cache_dtype)
        if name is None:
            raise KvplanError(f"kvplan does not price SGLang's KV dtype torch.{r.kv_cache_dtype}")
        return kv_dtype(name), f"torch.{r.kv_cache_dtype}, as the log prints it"
    flag = r.server_args.get("kv_cache_dtype") or "auto"
    if flag == "auto" and rules is None and arch.checkpoint_kv_dtype == "fp8":
        raise KvplanError("the log prints neither its KV dtype nor its SGLang release, and the checkpoint declares an "
                          "FP8 KV scheme (which 'auto' reads from 0.5.3 on)",
                          "pass --engine-version V or --kv-cache-dtype")
    dtype, _ = resolve_kv_dtype(arch, Settings(kv_cache_dtype=flag), rules or sglang_rules(None))
    return dtype, f"--kv-cache-dtype {flag}" + (" (the model dtype)" if flag == "auto" else "")


def _sglang_page_rows(r, cell: int, k_half: int, mla: bool, page: int, rules, tolerance: float) -> list[LogComparison]:
    rows: list[LogComparison] = []
    tokens = r.pool_tokens if r.pool_tokens is not None else r.max_total_num_tokens
    pool = r.pool_gib
    if pool is not None and tokens is not None:
        lo, mid, hi = (tokens_from_buffers((pool + d) * GiB, cell, page) for d in (-2 * _HALF, 0, 2 * _HALF))
        rows.append(compare("#tokens from the printed pool GiB", tokens, mid, tolerance, band=(lo, hi),
                            note=f"(K + V {pool:.2f} GiB) / {cell:,} B a token - one padding page of {page}"))
        rows.append(compare("pool GiB of the printed #tokens", round(pool, 2),
                            round((tokens + page) * cell / GiB, 2), tolerance, slack=2 * _HALF + 1e-9,
                            note="(#tokens + 1 page) x the bytes a token"))
        if not mla and r.k_size_gib is not None:
            rows.append(compare("K size GiB", r.k_size_gib, round((tokens + page) * k_half / GiB, 2), tolerance,
                                slack=_HALF + 1e-9))
    if r.pool_tokens is not None and r.max_total_num_tokens is not None:
        rows.append(compare("max_total_num_tokens", r.max_total_num_tokens, r.pool_tokens, tolerance,
                            note="the scheduler's, against the pool line's #tokens"))
    # The default cap, where the log's settings show none was given (no user cap, no draft, no DP attention).
    plain = rules is not None and r.server_args and not any(
        r.server_args.get(k) for k in ("max_running_requests", "speculative_algorithm", "enable_dp_attention"))
    if plain and tokens and r.context_len and r.max_running_requests is not None:
        rows.append(compare("max_running_requests", r.max_running_requests,
                            max_running_requests(tokens, r.context_len, rules), tolerance,
                            note="min(clamp(tokens / context x 512, 2048, 4096), tokens // 2)"))
    return rows


def _sglang_swa_rows(r, pools: SwaPools, page: int, rules, tolerance: float) -> tuple[list[LogComparison], list[str]]:
    """A sliding-window pool's lines: the printed pool line is of whichever of SWAKVPool's two pools has its
    ``#tokens`` (0.5.8 allocates the SWA pool first), priced with that pool's layers; then the split rule."""
    full, swa = r.swa_full_tokens, r.swa_tokens
    ratio = r.server_args.get("swa_full_tokens_ratio") or SWA_FULL_TOKENS_RATIO
    rows: list[LogComparison] = []
    notes = [f"sliding-window pool: {pools.full_layers} full-attention layers at {pools.full_cell:,} B a token, "
             f"{pools.swa_layers} sliding-window layers at {pools.swa_cell:,} B a token (one GPU)",
             "budget rule (the printed free memory given) not judged for a sliding-window pool; its full budget is "
             "sized by the release's split (kvplan/sglang/hybrid.py; MiMo-V2-Flash's over-count to 0.5.8, sglang "
             "PR #18039)"]
    which = {swa: ("SWA", pools.swa_cell, pools.swa_k), full: ("full", pools.full_cell, pools.full_k)}
    tokens = r.pool_tokens
    if tokens is not None and r.pool_gib is not None and r.k_size_gib is not None and full != swa and tokens in which:
        name, cell, k_half = which[tokens]
        pool = r.pool_gib
        lo, mid, hi = (tokens_from_buffers((pool + d) * GiB, cell, page) for d in (-2 * _HALF, 0, 2 * _HALF))
        rows.append(compare("#tokens from the printed pool GiB", tokens, mid, tolerance, band=(lo, hi),
                            note=f"the {name} pool: (K + V {pool:.2f} GiB) / {cell:,} B a token - one padding page "
                                 f"of {page}"))
        rows.append(compare("pool GiB of the printed #tokens", round(pool, 2), round((tokens + page) * cell / GiB, 2),
                            tolerance, slack=2 * _HALF + 1e-9, note=f"the {name} pool: (#tokens + 1 page) x its bytes"))
        rows.append(compare("K size GiB", r.k_size_gib, round((tokens + page) * k_half / GiB, 2), tolerance,
                            slack=_HALF + 1e-9))
    elif tokens is not None:
        notes.append(f"the pool line's #tokens ({tokens}) is neither pool's alone (full {full}, SWA {swa}), or it "
                     "prints no K and V size: its memory is not judged")
    aligned_first = rules is not None and tuple(int(x) for x in rules.version.split(".")) >= (0, 5, 11)
    lo, hi = swa_tokens_of_full(full, ratio, page, aligned_first)
    # The rule gives a range to 0.5.10: the prediction is the value of that range nearest the printed one.
    rows.append(compare("swa_layer_tokens from full_layer_tokens", swa, min(max(swa, lo), hi), tolerance,
                        note=f"align(int(full x {ratio:g})) to pages of {page}" + ("" if aligned_first else
                             f"; to 0.5.10 from the full count before its page rounding: {lo}..{hi}")))
    if r.max_total_num_tokens is not None:
        rows.append(compare("max_total_num_tokens", r.max_total_num_tokens, full, tolerance,
                            note="the scheduler's: the full-attention layers' count"))
    return rows, notes




def _sglang_nsa_rows(r, resolved, gpu: str | None, rules, given_dtype: str | None,
                     tolerance: float) -> tuple[list[LogComparison], list[str]]:
    """DeepSeek-V3.2's NSA pool: page 64, the latent and (from 0.5.3.post1) the indexer's keys in the printed size."""
    if rules is None:
        raise KvplanError("SGLang's NSA pool line counts the indexer's keys from 0.5.3.post1 and not in 0.5.3 (sglang "
                          "PR #11309): the release decides what its KV size is", "pass --engine-version")
    version = tuple(int(x) for x in rules.version.split("."))
    if not NSA_READ[0] <= version <= NSA_READ[1]:
        first, last = (".".join(map(str, v)) for v in NSA_READ)
        raise KvplanError(f"kvplan has read SGLang's NSA pool in {first} to {last} only, not {rules.version}",
                          f"pass --engine-version {first} .. {last} if the log is of one")
    gpu = gpu or r.gpu
    blackwell = bool(gpu) and select_gpus(gpu, None if re.match(r"^\s*\d+\s*[x×*]", gpu) else 1).device.is_blackwell
    if given_dtype:
        dtype, how = kv_dtype(given_dtype), "given on the command line"
    elif r.kv_cache_dtype:
        dtype, how = kv_dtype(_TORCH_KV.get(r.kv_cache_dtype, r.kv_cache_dtype)), "as the log prints it"
    elif blackwell:  # server_args.py@0.5.3 / 0.5.3.post1: forced; @0.5.4.post3: for "auto"
        dtype, how = kv_dtype("fp8_e4m3"), "SGLang's FP8 for DeepSeek NSA on Blackwell (compute capability >= 10)"
    elif gpu and (r.server_args.get("kv_cache_dtype") or "auto") == "auto":
        dtype, how = kv_dtype("bfloat16"), "--kv-cache-dtype auto: bf16 for DeepSeek NSA before Blackwell"
    else:
        raise KvplanError("the NSA pool's dtype is FP8 on Blackwell and the flag's elsewhere: the log prints neither "
                          "its dtype nor its GPU", "pass --gpu or --kv-cache-dtype")
    config = resolved.config.config
    ranks = [config.get(k) for k in ("kv_lora_rank", "qk_rope_head_dim")]
    if not all(isinstance(x, int) and x > 0 for x in ranks):
        raise KvplanError(f"the config of {resolved.config.name} gives no whole kv_lora_rank and qk_rope_head_dim, "
                          "which SGLang's NSA pool is shaped by")
    indexer = bool(rules.nsa_indexer_in_pool)
    cell = nsa_cell(resolved.arch, dtype, ranks[0], ranks[1], indexer, nsa_fp8_scaled(rules, blackwell))
    notes = [f"NSA pool (page 64, server_args.py@0.5.3): {cell:,} B a token on every rank ({dtype.name}: {how}; "
             + ("the latent and the indexer's keys" if indexer else "the latent alone: 0.5.3 prints no indexer keys")
             + ")", "budget rule (the printed free memory given) not judged for an NSA pool"]
    return _sglang_page_rows(r, cell, cell, True, 64, rules, tolerance), notes


def _sglang_mamba_state_rows(r, resolved, attention_tp: int, rules, tolerance: float
                             ) -> tuple[list[LogComparison], list[str]]:
    """The Mamba pool line's conv / SSM sizes at its printed slots: ``(max_mamba_cache_size + 1) x`` one slot's bytes
    (MambaPool holds one slot more, mem_cache/memory_pool.py@0.5.6.post2 .. @0.5.13.post1), the slot as the release
    sizes it (kvplan/sglang/pool.py `mamba_slot_bytes`: the SSM dtype by release). Not gated: the printed slots come
    from the budget, which is not judged."""
    if r.mamba_slots is None:
        return [], []
    states = [s for s in resolved.arch.layers if isinstance(s, MambaState)]
    if rules is None or not rules.mamba_ratio_split:
        return [], ["the Mamba pool line is not judged: " + ("no release known (its SSM dtype rule changed in 0.5.9)"
                                                               if rules is None else f"SGLang {rules.version}'s state "
                                                               "pool is not read")]
    conv, ssm, ssm_how = mamba_slot_bytes(states, attention_tp, rules)
    rows = (r.mamba_slots + 1) * conv / GiB, (r.mamba_slots + 1) * ssm / GiB
    return ([compare("Mamba conv_state GB", r.mamba_conv_gib, round(rows[0], 2), tolerance, gated=False, slack=_HALF),
             compare("Mamba ssm_state GB", r.mamba_ssm_gib, round(rows[1], 2), tolerance, gated=False, slack=_HALF)],
            [f"Mamba pool: {r.mamba_slots} + 1 slots of {conv:,} B conv (bf16) + {ssm:,} B SSM ({ssm_how}) a GPU"])


def _sglang_budget_rows(r, cell: int, page: int, tolerance: float, gated: bool) -> tuple[list[LogComparison], list[str]]:
    notes: list[str] = []
    fraction = r.mem_fraction_static
    tokens = r.pool_tokens if r.pool_tokens is not None else r.max_total_num_tokens
    if None in (fraction, r.free_before_load_gib, r.free_after_load_gib) or tokens is None:
        return [], ["no budget-rule comparison: the log needs 'Load weight begin' and 'Load weight end' (the free "
                    "memory before and after loading) and mem_fraction_static"]
    cap = r.server_args.get("max_total_tokens")

    def tokens_of(before: float, after: float) -> int:
        return tokens_from_budget((after - before * (1 - fraction)) * GiB, cell, page, cap)

    p, a = r.free_before_load_gib, r.free_after_load_gib
    ends = [tokens_of(p + dp, a + da) for dp in (-_HALF, _HALF) for da in (-_HALF, _HALF)]
    rest = a - p * (1 - fraction)
    rows = [compare("KV budget GiB: A - P x (1 - mem_fraction_static)", r.pool_gib, round(rest, 4), tolerance,
                    gated=False, note=f"{a} - {p} x (1 - {fraction:g}); the buffers print as K + V")]
    rows.append(compare("#tokens from the budget", tokens, tokens_of(p, a), tolerance, gated=gated,
                        band=(min(ends), max(ends))))
    if r.ranks > 1:
        notes.append(f"budget rule: the smallest free memory the {r.ranks} ranks in the log print (SGLang takes the "
                     "minimum over all ranks, some of which a log may not show)")
    if r.server_args.get("speculative_algorithm"):
        notes.append("speculative decoding: the draft's weights load before the pool is sized (and to 0.5.10 its "
                     "tokens are added after): the budget rule is shown, not judged")
        rows[-1] = rows[-1].model_copy(update={"gated": False})
    return rows, notes


def _sglang_full_rows(r, resolved, gpu: str, version: str | None, tp: int, page: int, dtype_flag: str,
                      tolerance: float, gated: bool) -> tuple[list[LogComparison], str]:
    world = tp * (r.server_args.get("pp_size") or 1)
    selection = select_gpus(gpu, None if re.match(r"^\s*\d+\s*[x×*]", gpu) else world)
    settings = Settings(tensor_parallel_size=tp, kv_cache_dtype=dtype_flag,
                        max_model_len=r.server_args.get("context_length"))
    options = EngineOptions(mem_fraction_static=r.mem_fraction_static, page_size=page if page > 1 else None)
    pool = engine_named("sglang").size(resolved, selection, settings, version, options)
    tokens = r.pool_tokens if r.pool_tokens is not None else r.max_total_num_tokens
    rows = [compare("KV budget GiB per GPU", round(r.pool_gib, 2) if r.pool_gib is not None else None,
                    round(pool.kv_memory_bytes_per_gpu / GiB, 2), tolerance, gated=gated, slack=2 * _HALF),
            compare("#tokens", tokens, pool.pool_tokens, tolerance, gated=gated)]
    if r.weights_gib is not None:
        weights = next((t.bytes for t in pool.memory_terms if t.name == "weights"), None)
        rows.append(compare("weights GiB per GPU ('mem usage')", r.weights_gib,
                            None if weights is None else round(weights / GiB, 2), tolerance, gated=False,
                            note="kvplan's estimate from the config"))
    return rows, f"{selection.count}x {selection.device.name}"


def _sglang_hybrid_full_rows(r, resolved, gpu: str, version: str, tp: int, page: int, dtype_flag: str,
                             tolerance: float, gated: bool) -> tuple[list[LogComparison], str, list[str]]:
    """The hybrid sliding-window or NSA pool from the GPU and the settings (kvplan/sglang/hybrid.py), against the
    printed pool: the memory compared is the buffers SGLang allocates (the NSA line's "KV size"; both sliding-window
    pools at the printed token counts), which, unlike a single pool's, is not the budget itself."""
    selection = select_gpus(gpu, None if re.match(r"^\s*\d+\s*[x×*]", gpu) else tp)
    settings = Settings(tensor_parallel_size=tp, kv_cache_dtype=dtype_flag,
                        max_model_len=r.server_args.get("context_length"))
    options = EngineOptions(mem_fraction_static=r.mem_fraction_static, page_size=page if page > 1 else None,
                            swa_full_tokens_ratio=r.server_args.get("swa_full_tokens_ratio"),
                            enable_dp_attention=bool(r.server_args.get("enable_dp_attention")) or None)
    pool = engine_named("sglang").size(resolved, selection, settings, version, options)
    split, buffers = pool.pool_split, pool.pool_bytes_per_gpu
    notes = [f"full budget: {pool.notes[0]}"]
    if r.swa_full_tokens is not None:
        full_cell = round(buffers["full"] / (split["full_layer_tokens"] + page)) if split["full_layer_tokens"] else 0
        swa_cell = round(buffers["swa"] / (split["swa_layer_tokens"] + page)) if split["swa_layer_tokens"] else 0
        printed = ((r.swa_full_tokens + page) * full_cell + (r.swa_tokens + page) * swa_cell) / GiB
        rows = [compare("KV budget GiB per GPU", round(printed, 2), round(sum(buffers.values()) / GiB, 2), tolerance,
                        gated=gated, slack=2 * _HALF, note="both pools' buffers: (tokens + 1 page) x each pool's bytes, "
                        "at the printed counts and at kvplan's"),
                compare("full_layer_tokens", r.swa_full_tokens, split["full_layer_tokens"], tolerance, gated=gated),
                compare("swa_layer_tokens", r.swa_tokens, split["swa_layer_tokens"], tolerance, gated=gated)]
    else:
        tokens = r.pool_tokens if r.pool_tokens is not None else r.max_total_num_tokens
        rows = [compare("KV budget GiB per GPU", round(r.pool_gib, 2) if r.pool_gib is not None else None,
                        round(buffers["kv"] / GiB, 2), tolerance, gated=gated, slack=2 * _HALF,
                        note="the NSA pool's buffers, the printed 'KV size' (its budget is divided by fewer bytes a "
                             "token than they hold)"),
                compare("#tokens", tokens, pool.pool_tokens, tolerance, gated=gated)]
    return rows, f"{selection.count}x {selection.device.name}", notes


def _full_reason(gpu_name: str | None, tp: int | None, version: str | None, fraction: float | None,
                 need_release: str | None) -> str | None:
    """Why the full budget cannot be judged from what a log (or report) states; None: it can."""
    missing = [what for what, gone in (("GPU", gpu_name is None), ("TP size", tp is None)) if gone]
    if need_release and version is None:
        missing.append(f"release ({need_release})")
    elif version is None and fraction is None:
        missing.append("mem_fraction_static or release (its default changes by release)")
    return f"not judged because it names no {' and no '.join(missing)}" if missing else None


def judge_sglang(text: str, log_name: str, tolerance: float, gate: str, model: str | None, gpu: str | None,
                 version: str | None, tp: int | None, kv_cache_dtype: str | None,
                 resolved: ResolvedModel | None = None, given_args: dict[str, Any] | None = None) -> EngineLogResult:
    """``resolved``: the model already read (`kvplan validate` reads configs offline), instead of the log's;
    ``given_args``: server_args fields a report states outside its quote (they replace the log's)."""
    r = sglang_lines.parse_sglang_log(text)
    if given_args:
        r = r.model_copy(update={"server_args": r.server_args | {k: v for k, v in given_args.items() if v is not None}})
    if not r.has_pool_lines:
        raise KvplanError(f"{log_name}: no SGLang KV pool lines found",
                          "expected 'KV Cache is allocated. #tokens: N, K size: ...' or 'max_total_num_tokens=N'")
    notes: list[str] = []
    name = model or r.model
    if not name and resolved is None:
        raise KvplanError(f"{log_name}: the log does not name the model (no server_args line or launch command)",
                          "pass --model")
    resolved = resolved or load_model_from_log(name, notes)
    version = version or r.sglang_version
    rules = None
    if version:
        try:
            rules = sglang_rules(version)
            shown = version.lstrip("v") if "post" in version else rules.version  # 0.5.3.post1's NSA pool is not 0.5.3's
            label = f"SGLang {shown} (the {'log' if version == r.sglang_version else 'given'} release)"
        except KvplanError as exc:
            notes.append(f"{exc.message}: judged by the page math, which is the same in every release read, and by "
                         "the budget rule the log's own figures give")
            label = f"SGLang {version} (not read: page math of {SGLANG_VERSIONS[0]}-{SGLANG_VERSIONS[-1]})"
    else:
        label = (f"SGLang, no release in the log: the page math is the same in every release read "
                 f"({SGLANG_VERSIONS[0]}-{SGLANG_VERSIONS[-1]}); pass --engine-version for the rest")
    tp = tp or r.server_args.get("tp_size")
    if tp is None:
        raise KvplanError(f"{log_name}: cannot read SGLang's tensor parallel size (no server_args line or launch "
                          "command)", "pass --tp N")
    attention_tp = tp // r.server_args["dp_size"] if (r.server_args.get("enable_dp_attention")
                                                       and r.server_args.get("dp_size")) else tp
    if attention_tp != tp:
        notes.append(f"DP attention: KV heads split over TP {tp} / DP {r.server_args['dp_size']} = {attention_tp}")
    mamba_kv = r.mamba and pool_kind(resolved.arch) == "mamba"  # its KV pool line is judged, its state pool not
    if (r.mamba and not mamba_kv) or r.pool_label:
        what = "Mamba" if r.mamba else f"'{r.pool_label}'"
        raise KvplanError(f"{log_name}: SGLang sized a {what} hybrid pool, which kvplan does not model for SGLang",
                          "nothing of it is judged")
    page = r.page_size
    gpu_name = gpu or (f"{r.gpu_count}x{r.gpu}" if r.gpu and r.gpu_count else r.gpu)
    nsa = any(isinstance(s, MLAIndexer) for s in resolved.arch.layers)
    if nsa or r.swa_full_tokens is not None:
        if nsa:
            page_rows, kind_notes = _sglang_nsa_rows(r, resolved, gpu, rules, kv_cache_dtype, tolerance)
            settings = {"tensor_parallel_size": tp, "page_size": 64, **{k: v for k, v in r.server_args.items() if k in (
                "mem_fraction_static", "dp_size", "enable_dp_attention")}}
            flag = kv_cache_dtype or r.server_args.get("kv_cache_dtype") or "auto"
            page = 64
        else:
            dtype, dtype_how = _sglang_dtype(r, resolved.arch, rules, kv_cache_dtype)
            page_rows, kind_notes = _sglang_swa_rows(r, swa_pools(resolved.arch, attention_tp, dtype), page, rules,
                                                     tolerance)
            kind_notes.insert(0, f"KV dtype {dtype.name} ({dtype_how}); page size {page}")
            settings = {"tensor_parallel_size": tp, "page_size": page, "kv_cache_dtype": dtype.name,
                        **{k: v for k, v in r.server_args.items() if k in ("mem_fraction_static",
                                                                            "swa_full_tokens_ratio")}}
            flag = kv_cache_dtype or r.server_args.get("kv_cache_dtype") or "auto"
        full, full_reason = None, _full_reason(
            gpu_name, tp, version, r.mem_fraction_static,
            "the NSA pool's fraction and bytes a token changed by release" if nsa else
            "the split of the sliding-window pool changed by release: 0.5.8, 0.5.9, 0.5.10, 0.5.11")
        if full_reason is None and rules is None and version:
            full_reason = f"not judged because kvplan has not read SGLang {version}'s pool code"
        if full_reason is None:
            try:
                rows, where, full_notes = _sglang_hybrid_full_rows(r, resolved, gpu_name, version, tp, page, flag,
                                                                   tolerance, gate == "all")
                full = Section(mode="full budget (from the GPU and the settings)", gpu=where, comparisons=rows)
                kind_notes += full_notes
            except KvplanError as exc:
                full_reason = f"not judged because {exc.message}"
        return _result(log_name, "sglang", r.sglang_version, label, tolerance, gate, resolved, gpu_name, settings,
                       Section(mode="page math (the printed pool memory given)", gpu=gpu_name or "any",
                               comparisons=page_rows), None, full, r, notes + kind_notes, full_reason)
    dtype, dtype_how = _sglang_dtype(r, resolved.arch, rules, kv_cache_dtype)
    if mamba_kv:
        (cell, k_half), mla = full_attention_cell(resolved.arch, attention_tp, dtype), False
        full_layers = sum(type(s) is FullAttention for s in resolved.arch.layers)
        notes.append(f"Mamba / GDN hybrid: the KV pool holds its {full_layers} full-attention layers alone; its "
                     "state pool's slots (max_mamba_cache_size) and the budget are not judged")
        page_rows = _sglang_page_rows(r, cell, k_half, mla, page, rules, tolerance)
        notes.append(f"bytes a token on one GPU: {cell:,} ({dtype.name}: {dtype_how}); page size {page}")
        state_rows, state_notes = _sglang_mamba_state_rows(r, resolved, attention_tp, rules, tolerance)
        page_rows += state_rows
        notes += state_notes
        settings = {"tensor_parallel_size": tp, "page_size": page, "kv_cache_dtype": dtype.name}
        return _result(log_name, "sglang", r.sglang_version, label, tolerance, gate, resolved, gpu_name, settings,
                       Section(mode="page math (the printed pool memory given)", gpu=gpu_name or "any",
                               comparisons=page_rows), None, None, r, notes,
                       "not judged because kvplan does not size SGLang's Mamba state pool from a log's settings")
    cell, k_half, mla = kv_cell(resolved.arch, attention_tp, dtype)
    notes.append(f"bytes a token on one GPU: {cell:,} ({dtype.name}: {dtype_how}); page size {page}")
    if r.draft_pools:
        notes.append(f"{r.draft_pools} further pool line(s) of the same rank: a speculative draft's pool, not judged")
    page_rows = _sglang_page_rows(r, cell, k_half, mla, page, rules, tolerance)
    gate_all = gate == "all"
    budget_rows, budget_notes = _sglang_budget_rows(r, cell, page, tolerance, gate_all)
    notes += budget_notes
    full = None
    full_reason = _full_reason(gpu_name, tp, version if rules is not None else None, r.mem_fraction_static, None)
    if gpu_name and (rules is not None or r.mem_fraction_static is not None):
        flag = kv_cache_dtype or r.server_args.get("kv_cache_dtype") or "auto"
        if rules is None:
            which = f"SGLang {version} is not read" if version else "no release known"
            notes.append(f"full budget: {which}; mem_fraction_static {r.mem_fraction_static:g} is the log's, "
                         f"SGLang {sglang_rules(None).version}'s rules for the rest")
        rows, where = _sglang_full_rows(r, resolved, gpu_name, (rules or sglang_rules(None)).version, tp, page, flag,
                                        tolerance, gate_all)
        full = Section(mode="full budget (from the GPU and the settings)", gpu=where, comparisons=rows)
        if not gpu:
            notes.append(f"GPU from the log's check_env lines: {r.gpu}")
    elif gpu_name is None:
        notes.append("no GPU given or printed: no full-budget comparison (pass --gpu H100)")
    else:
        notes.append("no SGLang release or mem_fraction_static known: no full-budget comparison (its default changes "
                     "by release; pass --engine-version)")
    settings = {"tensor_parallel_size": tp, "page_size": page, "kv_cache_dtype": dtype.name,
                **{k: v for k, v in r.server_args.items() if k in ("mem_fraction_static", "dp_size", "context_length",
                                                                 "max_total_tokens", "enable_dp_attention")}}
    return _result(log_name, "sglang", r.sglang_version, label, tolerance, gate, resolved, gpu_name, settings,
                   Section(mode="page math (the printed pool memory given)", gpu=gpu_name or "any", comparisons=page_rows)
                   if page_rows else None,
                   Section(mode="budget rule (the printed free memory given)", gpu=gpu_name or "any",
                           comparisons=budget_rows) if budget_rows else None, full, r, notes, full_reason)


# --- TensorRT-LLM -----------------------------------------------------------------------------------


def _trtllm_page_rows(r: trtllm_lines.TrtllmStartup, cell: TrtllmCell, tpb: int, fraction: float | None,
                      tolerance: float) -> tuple[list[LogComparison], list[str]]:
    rows: list[LogComparison] = []
    notes: list[str] = []
    pool = r.pool
    if pool is None:
        return rows, notes
    budget = r.estimated_kv_gib if r.estimated_kv_gib is not None else r.profiled_kv_gib
    if budget is not None:
        lo, mid, hi = (pool_from_budget((budget + d) * GiB, cell, tpb) for d in (-_HALF, 0, _HALF))
        rows.append(compare("pool tokens from the profiled budget", pool.tokens, mid, tolerance, band=(lo, hi),
                            note=f"ceil((int({budget} GiB) // {cell.estimator_bytes:,} B) / {tpb}) x {tpb}"))
        if r.max_tokens_used is not None:
            ends = [int((budget + d) * GiB) // cell.estimator_bytes for d in (-_HALF, _HALF)]
            rows.append(compare("max_tokens (the last 'Both ... are set' line)", r.max_tokens_used,
                                int(budget * GiB) // cell.estimator_bytes, tolerance, band=(ends[0], ends[1])))
    elif r.estimated_max_tokens is not None:
        rows.append(compare("pool tokens from 'Estimated max tokens'", pool.tokens,
                            pool_from_max_tokens(r.estimated_max_tokens, tpb), tolerance))
    elif r.engine_available_gib is not None and fraction is not None:
        lo, mid, hi = (pool_from_engine_free((r.engine_available_gib + d) * GiB, fraction, cell, tpb)
                       for d in (-_HALF, 0, _HALF))
        rows.append(compare("pool tokens from the engine's free memory", pool.tokens, mid, tolerance, band=(lo, hi),
                            note=f"ceil(int({fraction:g} x {r.engine_available_gib} GiB / {cell.manager_bytes:,} B) "
                                 f"/ {tpb}) x {tpb}"))
    elif r.engine_available_gib is not None:
        notes.append("the TensorRT engine's free memory is printed but not its free_gpu_memory_fraction: pass "
                     "--free-gpu-memory-fraction to compare the pool with it")
    nearest, low, high = tokens_in_printed_gib(pool.gib, cell, tpb)
    rows.append(compare("pool tokens in the printed GiB", pool.tokens, nearest, tolerance, band=(low, high),
                        note=f"{pool.gib} GiB / {cell.manager_bytes:,} B a token, in blocks of {tpb}"))
    rows.append(compare("pool GiB of the printed tokens", pool.gib, round(pool_gib(pool.tokens, cell), 2), tolerance,
                        slack=_HALF + 1e-9))
    if r.primary_blocks is not None:
        rows.append(compare("primary blocks", r.primary_blocks, pool.tokens // tpb, tolerance, note="(N) / tokens per block"))
    if r.kv_bytes_per_token is not None and cell.layers:  # a cell from the config (not the printed one)
        rows.append(compare("bytes a token ('kv size is')", r.kv_bytes_per_token, cell.estimator_bytes, tolerance,
                            note="the estimator's, from the config"))
    return rows, notes


def _trtllm_budget_rows(r: trtllm_lines.TrtllmStartup, tolerance: float, gated: bool) -> list[LogComparison]:
    need = (r.device_total_gib, r.peak_gib, r.free_gpu_memory_fraction, r.profiled_kv_gib)
    if None in need:
        return []
    tmp = r.estimation_pool_gib or 0.0
    f = r.free_gpu_memory_fraction
    predicted = (r.device_total_gib - r.peak_gib + tmp) * f
    return [compare("KV budget GiB: (total - peak + estimation pool) x fraction", r.profiled_kv_gib,
                    round(predicted, 4), tolerance, gated=gated, slack=3 * _HALF * f + _HALF,
                    note=f"({r.device_total_gib} - {r.peak_gib} + {tmp}) x {f:.4g}")]


def _trtllm_full_rows(r: trtllm_lines.TrtllmStartup, resolved: ResolvedModel, gpu: str, version: str | None, tp: int,
                      dtype: str | None, fraction: float | None, tpb: int, tolerance: float,
                      gated: bool) -> tuple[list[LogComparison], str, list[str]]:
    """TensorRT-LLM's pool from the GPU and the settings alone (`kvplan size --engine trtllm`) against the printed one;
    the log's weights and peak, where printed, shown beside kvplan's terms (not gated)."""
    selection = select_gpus(gpu, None if re.match(r"^\s*\d+\s*[x×*]", gpu) else tp)
    options = EngineOptions(free_gpu_memory_fraction=fraction, tokens_per_block=tpb, max_num_tokens=r.max_num_tokens)
    settings = Settings(tensor_parallel_size=tp, kv_cache_dtype=dtype or "auto")
    pool = engine_named("trtllm").size(resolved, selection, settings, version, options)
    printed = r.pool
    rows = [compare("KV budget GiB per GPU", printed.gib, round(pool.kv_memory_bytes_per_gpu / GiB, 2), tolerance,
                    gated=gated, slack=2 * _HALF),
            compare("pool tokens", printed.tokens, pool.pool_tokens, tolerance, gated=gated)]
    terms = {t.name: t.bytes for t in pool.memory_terms}
    if r.weights_gib is not None:
        rows.append(compare("weights GiB per GPU ('Use X GB for model weights')", r.weights_gib,
                            round(terms["weights"] / GiB, 2), tolerance, gated=False,
                            note="kvplan's estimate from the config"))
    if r.peak_gib is not None:
        peak = (terms["weights"] + terms["dummy prefill activation"] + terms["CUDA context and communicators"]
                + terms["CUDA graphs"] + terms["estimation pool (in the peak, added back)"])
        rows.append(compare("profiled peak GiB (torch + non-torch)", r.peak_gib, round(peak / GiB, 2), tolerance,
                            gated=False, note="kvplan's terms: weights, activation, context, CUDA graphs, estimation pool"))
    notes = [n for n in pool.notes if n.startswith(("the pool is", "unified memory"))]
    if r.max_num_tokens is None:
        notes.append("max_num_tokens not printed: the dummy prefill is TensorRT-LLM's default 8192 tokens")
    return rows, f"{selection.count}x {selection.device.name}", notes


def judge_trtllm(text: str, log_name: str, tolerance: float, gate: str, model: str | None, version: str | None,
                 tp: int | None, kv_cache_dtype: str | None, fraction: float | None,
                 resolved: ResolvedModel | None = None, gpu: str | None = None,
                 given: dict[str, Any] | None = None) -> EngineLogResult:
    """``resolved``: the model already read (`kvplan validate` reads configs offline), instead of the log's; ``gpu``:
    the GPU the log came from (adds the full budget of a PyTorch-backend log); ``given``: fields of the parsed log a
    report states outside its quote (``backend``, ``max_num_tokens``), used where the log does not print them."""
    r = trtllm_lines.parse_trtllm_log(text)
    if given:
        r = r.model_copy(update={k: v for k, v in given.items() if v is not None and getattr(r, k) is None})
    if not r.pools:
        raise KvplanError(f"{log_name}: no TensorRT-LLM pool line found",
                          "expected 'Allocated X GiB for max tokens in paged KV cache (N)' (a 2023 log's 'Using N "
                          "tokens in paged KV cache', without an 'Allocate B bytes for k/v cache' line before it, "
                          "prints no memory to compare)" if r.legacy_tokens else
                          "expected 'Allocated X GiB for max tokens in paged KV cache (N)'")
    notes: list[str] = []
    version = version or r.trtllm_version
    if version:
        trtllm_version(version)  # refuse a malformed one now
        label = (f"TensorRT-LLM {version} ({'the log' if version == r.trtllm_version else 'given'}): the page math of the "
                 f"releases read ({', '.join(READ_RELEASES)} and 2026 commits), the same in each")
    else:
        label = f"TensorRT-LLM, no release in the log: the page math of the releases read ({', '.join(READ_RELEASES)})"
    name = model or r.model
    tp = tp or r.tensor_parallel_size
    if name or resolved is not None:
        resolved = resolved or load_model_from_log(name, notes)
        if tp is None:
            raise KvplanError(f"{log_name}: cannot read TensorRT-LLM's tensor parallel size from the log",
                              "pass --tp N (--tp 1 for one GPU)")
        dtype = kv_cache_dtype or r.kv_cache_dtype
        if dtype is None and r.backend != "pytorch":
            raise KvplanError(f"{log_name}: a TensorRT engine's KV dtype is fixed when it is built, and the log does not "
                              "print it", "pass --kv-cache-dtype (fp8, float16, bfloat16)")
        cell = cell_of(resolved.arch, tp, dtype)
        notes.append(f"bytes a token on one GPU: {cell.manager_bytes:,} ({cell.dtype}: {cell.dtype_how})")
        if cell.sliding_as_full:
            notes.append("sliding-window layers are pooled for the whole sequence, as TensorRT-LLM does unless "
                         "max_attention_window is set (then its VSWA split, not modelled, applies)")
    elif r.kv_bytes_per_token is not None:
        cell = TrtllmCell(manager_bytes=r.kv_bytes_per_token, estimator_bytes=r.kv_bytes_per_token, dtype="as printed",
                          dtype_how="the log's 'kv size is'", sliding_as_full=False, layers=0)
        notes.append(f"no model named: the bytes a token as the log prints them ({r.kv_bytes_per_token:,}); the "
                     "config is not checked (pass --model)")
    else:
        raise KvplanError(f"{log_name}: the log does not name the model", "pass --model")
    tpb = r.tokens_per_block or DEFAULT_TOKENS_PER_BLOCK
    if r.tokens_per_block is None:
        notes.append(f"tokens per block not printed: TensorRT-LLM's default {DEFAULT_TOKENS_PER_BLOCK}")
    used_fraction = fraction if fraction is not None else r.free_gpu_memory_fraction
    page_rows, page_notes = _trtllm_page_rows(r, cell, tpb, used_fraction, tolerance)
    notes += page_notes
    budget_rows = _trtllm_budget_rows(r, tolerance, gate == "all")
    if not budget_rows:
        notes.append("no budget-rule comparison: the log needs the PyTorch backend's profiling line (peak, device "
                     "total, fraction)")
    full = None
    if gpu is None:
        notes.append("no full-budget comparison: no GPU given (pass --gpu H100)")
    elif resolved is None:
        notes.append("no full-budget comparison: the model is not named (pass --model)")
    elif r.backend == "tensorrt":
        notes.append("no full-budget comparison: kvplan sizes the PyTorch backend's budget; a TensorRT engine's "
                     "activation memory is fixed when the engine is built")
    elif r.backend is None and not (version and trtllm_version(version) >= (1, 0, 0)):
        notes.append("no full-budget comparison: the log shows neither the PyTorch backend's lines nor a release "
                     "from 1.0 (whose LLM API and trtllm-serve default to it)")
    elif version is None and used_fraction is None:
        notes.append("no full-budget comparison: neither the release nor free_gpu_memory_fraction is known (pass "
                     "--engine-version or --free-gpu-memory-fraction)")
    else:
        try:
            rows, where, full_notes = _trtllm_full_rows(r, resolved, gpu, version, tp, kv_cache_dtype or r.kv_cache_dtype,
                                                        used_fraction, tpb, tolerance, gate == "all")
            full = Section(mode="full budget (from the GPU and the settings)", gpu=where, comparisons=rows)
            notes += full_notes
            if r.backend is None:
                notes.append(f"backend not in the log: TensorRT-LLM {version}'s default, the PyTorch backend, assumed "
                             "(`tensorrt_llm/commands/serve.py@00209af`: backend 'pytorch')")
        except KvplanError as exc:
            notes.append(f"no full-budget comparison: {exc.message}")
    if len(r.pools) > 1:
        notes.append(f"{len(r.pools)} pool lines: the last is the pool (the PyTorch backend's first is its estimation "
                     "pool, freed)")
    settings = {"tensor_parallel_size": tp, "tokens_per_block": tpb, "kv_cache_dtype": cell.dtype,
                "free_gpu_memory_fraction": used_fraction, "backend": r.backend}
    return _result(log_name, "trtllm", r.trtllm_version, label, tolerance, gate, resolved, gpu,
                   {k: v for k, v in settings.items() if v is not None},
                   Section(mode="page math (the printed memory given)", gpu="any", comparisons=page_rows),
                   Section(mode="budget rule (the printed peak given)", gpu="any", comparisons=budget_rows)
                   if budget_rows else None, full, r, notes)


def _result(log_name, engine, version, label, tolerance, gate, resolved, gpu, settings, page, budget, full, parsed,
            notes, full_reason: str | None = None) -> EngineLogResult:
    gated = [c for s in (page, budget, full) if s for c in s.comparisons if c.gated and c.within is not None]
    if not gated:
        raise KvplanError(f"{log_name}: no printed figure could be compared with {_LABEL[engine]}'s rules",
                          "the log needs the pool line and the memory it printed")
    return EngineLogResult(
        log=log_name, engine=engine, engine_version=version, rules=label, ok=all(c.within for c in gated),
        tolerance=tolerance, gate=gate, model=resolved.config.name if resolved else None,
        model_source=resolved.config.source if resolved else None, gpu=gpu, settings=settings, page_math=page,
        budget=budget, full_budget=full, full_budget_reason=None if full else full_reason, notes=notes,
        **{f"{engine}_log": parsed})


def render(result: EngineLogResult) -> None:
    console = make_console()
    console.print(f"[bold]{result.log}[/]: {_LABEL[result.engine]} {result.engine_version or '(no release printed)'}, "
                  f"model {result.model or '?'}")
    console.print(f"  judged by {result.rules}; " + ", ".join(f"{k}={v}" for k, v in result.settings.items()))
    for section in (result.page_math, result.budget, result.full_budget):
        if section is not None:
            console.print(comparison_table(section))
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")
    color, verdict = ("green", "within") if result.ok else ("red", "outside")
    console.print(f"[bold {color}]{verdict} the tolerance of {result.tolerance:.1%}[/]")


__all__ = ["ENGINES", "EngineLogResult", "detect_engine", "engine_lines", "judge_sglang", "judge_trtllm",
           "read_engine_log", "render"]
