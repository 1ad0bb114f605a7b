"""SGLang's KV pool for one deployment, as its ``ServerArgs`` defaults and ``ModelRunner`` size it.

    P     = free GPU memory after the communicators start, the minimum over ranks   (before the weights load)
    A     = free GPU memory after the weights load, the minimum over ranks
    rest  = A - P x (1 - mem_fraction_static)
    cell  = KV bytes of one token on one GPU (K and V heads of this rank x head size x layers x dtype; MLA: the latent)
    tokens = int(rest x 2^30) // cell, rounded down to page_size (default 1)

(model_executor/model_runner.py `profile_max_num_token`@0.4.6.post5 .. 0.5.6.post2, model_runner_kv_cache_mixin.py
@0.5.7 .. 0.5.10.post1, mem_cache/pool_configurator.py @0.5.11 .., mem_cache/kv_cache_configurator.py @0.5.23;
utils `get_available_gpu_memory(distributed=True)` takes the minimum over ranks). So, unlike vLLM, SGLang profiles no
activation peak: ``1 - mem_fraction_static`` of the memory free before loading is all it keeps back, and its default
is a heuristic of the GPU's size, the chunked-prefill size and the CUDA graphs (`mem_fraction_static`).

What kvplan cannot see is the memory a process holds before the weights load (its CUDA context and communicators),
which ``P`` excludes: an assumption with a range (`STARTUP_BYTES`), carried into the pool's range. Only full
attention (MHA / GQA / MQA), MLA, the hybrid sliding-window pool (two pools, in the releases and of the architectures
kvplan/sglang/hybrid.py lists), DeepSeek-V3.2's NSA pool (0.5.3-0.5.10) and the Mamba / GDN state pool (Qwen3-Next and
Nemotron-H 0.5.3.post3-0.5.15, Qwen3.5 0.5.9-0.5.15) are sized; other Mamba / linear-attention hybrids and releases,
vision models (`adjust_mem_fraction_for_vlm`), pipeline parallelism and speculative decoding are refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.errors import KvplanError
from kvplan.hardware.catalog import Device
from kvplan.model.arch import Architecture
from kvplan.model.dtypes import KVDtype, kv_dtype
from kvplan.model.layers import MLA, FullAttention, MambaState, MLAIndexer, SlidingWindow
from kvplan.plan.overhead import STARTUP_BYTES
from kvplan.plan.schema import MemoryTerm, Settings
from kvplan.sglang.hybrid import (
    MambaSplit,
    hybrid_swa_arch,
    hybrid_swa_in,
    mamba_archs_in,
    mamba_split,
    mamba_ssm_dtype_bytes,
    nsa_profile_cell,
    swa_split,
)
from kvplan.sglang.rules import SglangRules
from kvplan.units import GiB, MiB

#: SGLang's --kv-cache-dtype names for kvplan's (server_args.py: auto, fp8_e5m2, fp8_e4m3, bfloat16 / float16).
_KV_FLAGS = {"auto": "auto", "bfloat16": "bfloat16", "float16": "float16", "fp8": "fp8_e4m3",
             "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


@dataclass(frozen=True)
class SglangPool:
    """SGLang's pool on each GPU of one replica."""

    rules: SglangRules
    gpu_mem_mib: int  # nvidia-smi memory.total, what SGLang's defaults read
    mem_fraction_static: float
    fraction_how: str  # where the fraction came from
    chunked_prefill_size: int
    free_before_load: tuple[int, int, int]  # P: low, estimate, high (bytes)
    weights_bytes: int
    rest_bytes: tuple[int, int, int]  # the KV budget: low, estimate, high
    kv_dtype: KVDtype
    kv_dtype_flag: str
    cell_bytes: int  # one token on one GPU
    k_bytes_per_token: int  # of the cell, the K half (MLA: the whole latent)
    page_size: int
    tokens: int  # max_total_num_tokens
    tokens_range: tuple[int, int]
    context_len: int
    max_running_requests: int
    mla: bool
    # "kv": one pool; "swa": the hybrid sliding-window pool (``tokens`` is full_layer_tokens); "nsa": DeepSeek-V3.2's
    kind: str = "kv"
    swa_tokens: int | None = None  # swa_layer_tokens
    swa: SwaPools | None = None  # the two pools' bytes a token
    swa_full_tokens_ratio: float | None = None
    # NSA: the bytes a token its buffers hold (the FP8 latent's scales and rope, the indexer's keys), not the
    # ``cell_bytes`` the budget is divided by
    buffer_bytes_per_token: int | None = None
    dp_attention: bool = False  # attention data-parallel over the TP group: the attention weights on every rank
    absorbed_kv_b_bytes: int = 0  # of weights_bytes, MLA's w_kc / w_vc made after loading (kvplan/sglang/weights.py)
    # "mamba": the state pool's slots (max_mamba_cache_size), one request's state on one GPU (conv, SSM), the ratio
    mamba_slots: int | None = None
    mamba_state_bytes: tuple[int, int] | None = None
    mamba_full_memory_ratio: float | None = None
    how: str = ""  # how the tokens came from the budget

    def _state_terms(self) -> list[MemoryTerm]:
        if self.kind != "mamba" or self.mamba_slots is None or self.mamba_state_bytes is None:
            return []
        state = self.mamba_slots * sum(self.mamba_state_bytes)
        return [MemoryTerm(f"Mamba state pool ({self.mamba_slots:,} slots)", state, state, state, -1,
                           f"mamba_full_memory_ratio {self.mamba_full_memory_ratio:g} of the budget, in whole slots "
                           f"of {sum(self.mamba_state_bytes):,} B")]

    def kv_budget_bytes(self) -> int:
        """What the KV pool is given on one GPU: the budget, less the Mamba state pool's slots."""
        return max(0, self.rest_bytes[1] - sum(t.bytes for t in self._state_terms()))

    def pool_bytes(self) -> dict[str, int]:
        """Each pool's buffers on one GPU as SGLang allocates them: one padding page more than its tokens
        (``torch.zeros((size + page_size, ...))``, mem_cache/memory_pool.py@0.4.6.post5 .. @0.5.23)."""
        if self.kind == "swa" and self.swa is not None and self.swa_tokens is not None:
            return {"full": (self.tokens + self.page_size) * self.swa.full_cell,
                    "swa": (self.swa_tokens + self.page_size) * self.swa.swa_cell}
        kv = {"kv": (self.tokens + self.page_size) * (self.buffer_bytes_per_token or self.cell_bytes)}
        if self.kind == "mamba" and self.mamba_slots is not None and self.mamba_state_bytes is not None:
            kv["mamba"] = (self.mamba_slots + 1) * sum(self.mamba_state_bytes)  # MambaPool: size + 1 slots
        return kv

    def pool_tokens(self) -> dict[str, int]:
        if self.kind == "swa" and self.swa_tokens is not None:
            return {"full_layer_tokens": self.tokens, "swa_layer_tokens": self.swa_tokens}
        if self.kind == "mamba" and self.mamba_slots is not None:
            return {"max_total_num_tokens": self.tokens, "max_mamba_cache_size": self.mamba_slots}
        return {"max_total_num_tokens": self.tokens}

    def startup_lines(self) -> list[str]:
        """The pool lines SGLang prints (mem_cache/memory_pool.py; managers/scheduler.py)."""
        dtype = f"dtype: torch.{_torch_name(self.kv_dtype)}, " if _version(self.rules) >= (0, 5, 13) else ""

        def line(tokens: int, cell: int, k_half: int, mla: bool) -> str:
            rows = tokens + self.page_size  # the buffers hold one padding page more than the tokens
            if mla:
                return f"KV Cache is allocated. {dtype}#tokens: {tokens}, KV size: {rows * cell / GiB:.2f} GB"
            return (f"KV Cache is allocated. {dtype}#tokens: {tokens}, K size: {rows * k_half / GiB:.2f} GB, "
                    f"V size: {rows * (cell - k_half) / GiB:.2f} GB")

        if self.kind == "swa" and self.swa is not None and self.swa_tokens is not None:
            use = "Sliding" if self.rules.swa_sizing == "0.4.9" else "sliding"  # model_runner.py@0.4.9.post6 .. 0.5.6
            lines = [f"Use {use} window memory pool. full_layer_tokens={self.tokens}, "
                     f"swa_layer_tokens={self.swa_tokens}",
                     line(self.swa_tokens, self.swa.swa_cell, self.swa.swa_k, False),  # SWAKVPool builds it first
                     line(self.tokens, self.swa.full_cell, self.swa.full_k, False)]
        elif self.kind == "nsa":
            lines = [line(self.tokens, self.buffer_bytes_per_token or self.cell_bytes, 0, True)]
        elif self.kind == "mamba" and self.mamba_slots is not None and self.mamba_state_bytes is not None:
            conv, ssm = ((self.mamba_slots + 1) * b / GiB for b in self.mamba_state_bytes)
            lines = [f"Mamba Cache is allocated. max_mamba_cache_size: {self.mamba_slots}, conv_state size: "
                     f"{conv:.2f}GB, ssm_state size: {ssm:.2f}GB ",  # mem_cache/memory_pool.py@0.5.6.post2
                     line(self.tokens, self.cell_bytes, self.k_bytes_per_token, False)]
        else:
            lines = [line(self.tokens, self.cell_bytes, self.k_bytes_per_token, self.mla)]
        return lines + [f"max_total_num_tokens={self.tokens}, chunked_prefill_size={self.chunked_prefill_size}, "
                        f"max_prefill_tokens=16384, max_running_requests={self.max_running_requests}, "
                        f"context_len={self.context_len}, ..."]

    def memory_terms(self) -> list[MemoryTerm]:
        p_low, p, p_high = self.free_before_load
        keep = 1 - self.mem_fraction_static
        absorbed = self.absorbed_kv_b_bytes
        checkpoint = self.weights_bytes - absorbed
        return [
            MemoryTerm("free before the weights load (P)", p, p_low, p_high, +1,
                       "CUDA total less the context and communicators (assumed 0.75 GiB, 0.4-1.5)"),
            MemoryTerm(f"kept back: P x (1 - {self.mem_fraction_static:g})", round(p * keep), round(p_low * keep),
                       round(p_high * keep), -1, f"mem_fraction_static {self.mem_fraction_static:g}: {self.fraction_how}"),
            *self._state_terms(),
            MemoryTerm("weights", checkpoint, checkpoint, checkpoint, -1,
                       "per GPU, kvplan's estimate of the checkpoint as loaded"
                       + ("; DP attention: the attention, embedding, norms and routers whole on every GPU"
                          if self.dp_attention else "")),
            *([MemoryTerm("MLA's w_kc / w_vc", absorbed, absorbed, absorbed, -1,
                          "copies of kv_b_proj made after loading (post_load_weights, models/deepseek_v2.py@0.5.3)")]
              if absorbed else []),
        ]


def _version(rules: SglangRules) -> tuple[int, ...]:
    return _v(rules.version)


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def _torch_name(dtype: KVDtype) -> str:
    return {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(dtype.name, dtype.name)


def graph_defaults(gpu_mem_mib: int, tp: int, rules: SglangRules) -> tuple[int, int]:
    """(chunked_prefill_size, the decode CUDA graphs' max batch) by GPU size (`_handle_gpu_memory_settings`,
    server_args.py@0.5.3.post3; arg_groups/memory_hook.py@0.5.23)."""
    rows = ((20 * 1024, (2048, 8, 8)), (35 * 1024, rules.small_gpu_row), (60 * 1024, (4096, 32, 160)),
            (90 * 1024, (8192, 256, 512)), (160 * 1024, (8192, 256, 512)))
    chunk, small_tp, large_tp = next((row for limit, row in rows if gpu_mem_mib < limit), (16384, 512, 512))
    return chunk, small_tp if tp < 4 else large_tp


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """The prefill CUDA graphs' token counts (`_generate_piecewise_cuda_graph_tokens`, server_args.py@0.5.10.post1;
    `generate_prefill_cuda_graph_batch_sizes`, arg_groups/cuda_graph_hook.py@0.5.23)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]


def default_fraction(rules: SglangRules, gpu_mem_mib: int, tp: int, mla: bool,
                     prefill_graphs: bool, dp_attention_size: int = 0) -> tuple[float, str]:
    """SGLang's default mem_fraction_static and how it was reached (server_args.py, by release).
    ``dp_attention_size``: the --dp-size of an --enable-dp-attention given on the command line (0: none)."""
    parallel = tp
    if rules.fraction_rule == "table":  # server_args.py@0.4.6.post5
        steps = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
        f = next(v for n, v in steps if parallel >= n) if gpu_mem_mib <= 81920 else 0.88
        if gpu_mem_mib > 96 * 1024:
            f = min(f + 48 * 1024 * (1 - f) / gpu_mem_mib, (gpu_mem_mib - 18 * 1024) / gpu_mem_mib)
        return f, f"0.4.6's table for TP {tp} on {gpu_mem_mib:,} MiB"
    if rules.fraction_rule == "gpu_reserve":  # server_args.py@0.4.7.post1 .. 0.5.2
        rows = ((20 * 1024, 2.8, 0.1), (35 * 1024, 2.8, 0.1), (90 * 1024, 9.5, 0.5), (100 * 1024, 12, 0.5),
                (160 * 1024, 12, 0.5))
        base, per = next(((b, p) for limit, b, p in rows if gpu_mem_mib < limit), (32, 0))
        reserved = (base + parallel * per) * 1024
        how = f"1 - {reserved:,.0f} MiB reserved for a {gpu_mem_mib:,} MiB GPU at TP {tp}"
        return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3), how
    chunk, max_bs = graph_defaults(gpu_mem_mib, tp, rules)  # server_args.py@0.5.3.post3 .. memory_hook.py@0.5.23
    reserved = 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + parallel / 8 * 1024
    parts = f"512 + {max(chunk, 2048):,} x 1.5 + {max_bs} x 2 + {parallel / 8 * 1024:g}"
    if dp_attention_size:  # "DP attention needs more padding", server_args.py@0.5.3 .. memory_hook.py@0.5.23
        dp_reserve = max_bs * dp_attention_size * (3 + (1.5 if max_bs > 300 else 0))
        reserved += dp_reserve
        parts += f" + {dp_reserve:g} (DP attention: {max_bs} x {dp_attention_size} x " \
                 f"{'4.5' if max_bs > 300 else '3'})"
    if prefill_graphs:
        graphs = 1.5 * 1024 if mla else len(prefill_graph_sizes(chunk)) * 8
        reserved += graphs
        parts += f" + {graphs:g} (prefill graphs)"
    if gpu_mem_mib > 60 * 1024 and reserved < 10 * 1024:
        reserved, parts = 10 * 1024, "the 10,240 floor"
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3), f"1 - ({parts}) MiB / {gpu_mem_mib:,} MiB"


def resolve_kv_dtype(arch: Architecture, settings: Settings, rules: SglangRules) -> tuple[KVDtype, str]:
    """The cache's dtype and SGLang's flag for it: "auto" is the model dtype, or FP8 where a ModelOpt checkpoint
    declares its KV scheme (0.5.3+, `init_memory_pool`)."""
    name = settings.kv_cache_dtype
    if name not in _KV_FLAGS:
        raise KvplanError(f"SGLang has no --kv-cache-dtype {name!r} that kvplan sizes",
                          f"use one of {', '.join(sorted(_KV_FLAGS))}")
    if name != "auto":
        return kv_dtype(name), _KV_FLAGS[name]
    if rules.auto_kv_reads_checkpoint and arch.checkpoint_kv_dtype == "fp8":
        return kv_dtype("fp8_e4m3"), "auto"
    return kv_dtype(arch.model_dtype if arch.model_dtype in ("bfloat16", "float16") else "bfloat16"), "auto"


MAMBA_NOT_SIZED = ("kvplan does not size SGLang's state pool for this Mamba / linear-attention hybrid (its slots, "
                   "max_mamba_cache_size, take mamba_full_memory_ratio of the budget: `handle_max_mamba_cache`; kvplan "
                   "sizes it for Qwen3-Next and Nemotron-H of full-attention and state layers in SGLang "
                   "0.5.3.post3-0.5.15, and Qwen3.5 in 0.5.9-0.5.15; 0.5.16 on size the pool in "
                   "mem_cache/kv_cache_configurator.py and unified_memory_pool.py: not read)")


#: Every architecture SGLang has listed for its hybrid sliding-window pool in `is_hybrid_swa_model` (configs/
#: model_config.py@0.5.8.post1 .. @0.5.23, with its SWA_SINK_ARCHS and MIMO_V2_MODEL_ARCHS; Llama 4 and MiMo-V2-Flash
#: in `is_hybrid_model`@0.5.7). A sliding-window model of any other architecture is pooled as full attention, one pool
#: of full-size pages (0.4.4 priced every layer so: `profile_max_num_token`, model_executor/model_runner.py@0.4.4.post3);
#: one listed is the hybrid pool (sized where kvplan/sglang/hybrid.py has read it, else refused). Where the release
#: is known, kvplan/sglang/hybrid.py `HYBRID_SWA_ARCHS` decides for the architectures it lists (0.4.9-0.5.6 gave the
#: pool to Gemma 2 / 3 by the model class, and not to GPT-OSS). The config's own ``is_hybrid_swa`` opt-in (0.5.23) is
#: for custom code, which kvplan never runs.
SGLANG_HYBRID_SWA_LISTED = frozenset({
    "Llama4ForConditionalGeneration", "BeamForCausalLM", "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN",
    "DeepseekV4ForCausalLMDSpark", "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM",
    "IQuestQ1ForCausalLM", "IQuestQ1MTP", "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2MTP",
    "Step3p5ForCausalLM", "Step3p5MTP", "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "EmbeddingGemma2Model", "Gemma4UnifiedForConditionalGeneration",
    "DiffusionGemmaForBlockDiffusion", "LagunaForCausalLM", "MellumForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP",
    "UnlimitedOCRForCausalLM"})


def _window_as_full(arch: Architecture, version: str | None = None, swa_off: bool = False) -> bool:
    """SGLang ``version`` (None: any release) gives this sliding-window model no hybrid pool: its window layers take
    full pages. ``swa_off``: its server args turn the pool off for this deployment (`swa_memory_disabled`)."""
    if swa_off:
        return True
    read = hybrid_swa_in(arch, version) if version is not None else None
    return not read if read is not None else not SGLANG_HYBRID_SWA_LISTED.intersection(arch.architectures)


def pool_kind(arch: Architecture, version: str | None = None, swa_off: bool = False) -> str:
    """Which of SGLang's pools a model's layers take in ``version`` (None: by the newest releases' lists): "swa"
    (full-attention and sliding-window layers: the hybrid sliding-window pool), "nsa" (MLA layers with DeepSeek-V3.2's
    indexer), else "kv" (one pool; refused by ``refuse_layers`` where kvplan does not size it)."""
    kinds = {type(s) for s in arch.layers}
    if kinds == {FullAttention, MambaState}:
        return "mamba"
    if kinds == {FullAttention, SlidingWindow}:
        return "kv" if _window_as_full(arch, version, swa_off) else "swa"
    return "nsa" if kinds == {MLA, MLAIndexer} else "kv"


def refuse_layers(arch: Architecture, version: str | None = None, swa_off: bool = False) -> None:
    """Refuse, with the reason, the layer kinds SGLang's single pool (``kv_cell``) does not price."""
    kinds = {type(s) for s in arch.layers}
    whole = _window_as_full(arch, version, swa_off)
    priced_whole = (FullAttention, MLA, SlidingWindow) if whole else (FullAttention, MLA)
    other = sorted({s.kind for s in arch.layers if type(s) not in priced_whole})
    if pool_kind(arch, version, swa_off) == "swa":
        raise KvplanError("a model of sliding-window layers takes SGLang's hybrid sliding-window pool (two pools), "
                          "not one: it is sized by swa_pools / kvplan/sglang/hybrid.py")
    if pool_kind(arch) == "nsa":
        raise KvplanError("DeepSeek-V3.2 takes SGLang's NSA pool (the latent and the indexer's keys), sized by "
                          "nsa_cell / kvplan/sglang/hybrid.py")
    if pool_kind(arch) == "mamba":
        raise KvplanError("a Mamba / linear-attention hybrid takes SGLang's state pool beside its KV pool, sized by "
                          "size_pool / kvplan/sglang/hybrid.py `mamba_split`")
    if "mamba" in other:
        raise KvplanError(MAMBA_NOT_SIZED, "size it for vLLM (--engine vllm)")
    if other:
        raise KvplanError(f"kvplan does not size SGLang's pool for {', '.join(other)} layers (it sizes full attention, "
                          "MLA, the hybrid sliding-window pool and DeepSeek-V3.2's NSA pool)",
                          "size it for vLLM (--engine vllm)")
    if kinds == {FullAttention, MLA}:
        raise KvplanError("a model of both full attention and MLA layers is not sized for SGLang")


def kv_cell(arch: Architecture, tp: int, dtype: KVDtype, version: str | None = None,
            swa_off: bool = False) -> tuple[int, int, bool]:
    """(cell, K half, MLA): the bytes one token takes on one GPU, and of them the K buffer's (MLA: the latent, all
    of it). `profile_max_num_token`@0.4.6.post5: KV heads of this rank x head_dim x layers x 2 x dtype; MLA:
    (kv_lora_rank + qk_rope_head_dim) x layers x dtype on every rank."""
    refuse_layers(arch, version, swa_off)
    mla = any(isinstance(s, MLA) for s in arch.layers)
    per_rank = [s.per_rank(tp) for s in arch.layers]
    cell = round(sum(s.bytes_per_token(dtype) for s in per_rank))
    k_half = cell if mla else round(sum(s.num_kv_heads * s.head_size * dtype.bytes_per_element for s in per_rank))
    return cell, k_half, mla


#: ``--swa-full-tokens-ratio``'s default, the same in every release that has it (server_args.py@0.4.9.post6 ..
#: arg_groups/memory_hook.py@0.5.23).
SWA_FULL_TOKENS_RATIO = 0.8


@dataclass(frozen=True)
class SwaPools:
    """SGLang's hybrid sliding-window pool (``SWAKVPool``, mem_cache/swa_memory_pool.py@0.5.8.post1): one
    ``MHATokenToKVPool`` over the full-attention layers of ``full_layer_tokens`` tokens, another over the
    sliding-window layers of ``swa_layer_tokens``, each with its own KV heads and head sizes (MiMo-V2-Flash's
    ``swa_num_key_value_heads`` / ``swa_head_dim`` / ``swa_v_head_dim``). Bytes are one token on one GPU."""

    full_cell: int  # over the full-attention layers: K + V
    full_k: int
    swa_cell: int  # over the sliding-window layers
    swa_k: int
    full_layers: int
    swa_layers: int


def swa_pools(arch: Architecture, tp: int, dtype: KVDtype) -> SwaPools:
    """The two buffer sets of SGLang's sliding-window pool; a model of other layer kinds, or of sliding-window layers
    only (0.5.11+ sizes those alone), is refused with the reason."""
    other = sorted({s.kind for s in arch.layers if type(s) not in (FullAttention, SlidingWindow)})
    if other:
        raise KvplanError(f"kvplan does not size SGLang's sliding-window pool beside {', '.join(other)} layers")
    full = [s.per_rank(tp) for s in arch.layers if type(s) is FullAttention]
    swa = [s.per_rank(tp) for s in arch.layers if type(s) is SlidingWindow]
    if not full or not swa:
        raise KvplanError("SGLang printed a sliding-window pool, but the model's config has "
                          + ("no sliding-window layers" if not swa else "no full-attention layers"),
                          "check the model the log is of (--model)")

    def cell(layers: list) -> tuple[int, int]:
        return (round(sum(s.bytes_per_token(dtype) for s in layers)),
                round(sum(s.num_kv_heads * s.head_size * dtype.bytes_per_element for s in layers)))

    (full_cell, full_k), (swa_cell, swa_k) = cell(full), cell(swa)
    return SwaPools(full_cell, full_k, swa_cell, swa_k, len(full), len(swa))


def swa_tokens_of_full(full_tokens: int, ratio: float, page_size: int, aligned_first: bool) -> tuple[int, int]:
    """``swa_layer_tokens`` from ``full_layer_tokens``, as a (low, high) range. 0.5.11 on (``HybridSWAPoolConfigurator``,
    model_executor/pool_configurator.py@0.5.11 .. @0.5.23): ``align(int(align(full) x ratio))``, one value. To 0.5.10
    (`set_num_tokens_hybrid_swa`, model_runner_kv_cache_mixin.py@0.5.8.post1; model_runner.py@0.4.9.post6): the SWA
    count is taken from the full count *before* its page rounding, so any full count up to one page above the
    printed one may have given it."""
    def align(x: float) -> int:
        return int(x) // page_size * page_size

    low = align(full_tokens * ratio)
    return low, low if aligned_first else align((full_tokens + page_size - 1) * ratio)


def nsa_cell(arch: Architecture, dtype: KVDtype, kv_lora_rank: int, rope_dim: int, with_indexer: bool,
             fp8_scaled: bool = True) -> int:
    """The bytes one token takes in DeepSeek-V3.2's NSA pool (``NSATokenToKVPool``), on every rank. A layer's latent:
    FP8 ``kv_lora_rank`` bytes + one fp32 scale per 128 + the rope part in bf16 (656 for DeepSeek-V3.2:
    mem_cache/memory_pool.py@0.5.3 hard-codes it, ``override_kv_cache_dim`` @0.5.4.post3 computes it), else
    ``(kv_lora_rank + rope) x dtype``; the indexer's keys: ``index_head_dim + index_head_dim // 128 x 4`` uint8
    bytes a layer (``index_k_with_scale_buffer``, memory_pool.py@0.5.3). Both buffers hold ``#tokens + one page``
    rows when ``#tokens`` is whole pages (the indexer's ``(size + page_size + 1) // page_size`` pages).
    ``fp8_scaled`` False: the FP8 latent without its scales, ``kv_lora_rank + rope`` bytes, as the trtllm NSA backends
    keep it (`nsa_fp8_scaled`)."""
    mla = [s for s in arch.layers if type(s) is MLA]
    indexers = [s for s in arch.layers if type(s) is MLAIndexer]
    other = sorted({s.kind for s in arch.layers if type(s) not in (MLA, MLAIndexer)})
    if other or not indexers or len(mla) != len(indexers):
        raise KvplanError("kvplan prices SGLang's NSA pool only for a model of MLA layers each with an indexer "
                          f"(this one: {len(mla)} MLA, {len(indexers)} indexer" + (f", {', '.join(other)}" if other
                                                                                     else "") + ")")
    if dtype.name in ("fp8", "fp8_e4m3") and not fp8_scaled:
        latent = kv_lora_rank + rope_dim
    elif dtype.name in ("fp8", "fp8_e4m3"):
        latent = kv_lora_rank + kv_lora_rank // 128 * 4 + rope_dim * 2
    elif dtype.name in ("bfloat16", "float16"):
        latent = round(mla[0].bytes_per_token(dtype))
    else:
        raise KvplanError(f"SGLang's NSA pool takes bf16 or fp8_e4m3 (server_args.py@0.5.3), not {dtype.name}")
    index = round(indexers[0].bytes_per_token(dtype)) if with_indexer else 0
    return len(mla) * (latent + index)


def swa_memory_disabled(arch: Architecture, rules: SglangRules, device: Device) -> str | None:
    """Why SGLang's server args turn the hybrid sliding-window pool off for this deployment of a model it otherwise
    gives one (None: they do not): gpt-oss on an SM100 GPU (B200, B300, GB200) in 0.5.8-0.5.9 gets the trtllm_mha
    backend, "Disable hybrid SWA memory for GPT-OSS model with trtllm_mha attention backend" (server_args.py
    @0.5.8.post1, @0.5.9; gone @0.5.10.post1)."""
    sm100 = device.is_blackwell and not device.name.upper().startswith("RTX")  # is_sm100_supported: capability 10.x
    gpt_oss = "GptOssForCausalLM" in arch.architectures
    if gpt_oss and sm100 and (0, 5, 8) <= _version(rules) <= (0, 5, 9):
        return f"{rules.version} runs gpt-oss on {device.name} with trtllm_mha, which turns it off"
    return None


def _refuse_what_is_not_modelled(arch: Architecture, settings: Settings, version: str, swa_off: bool) -> None:
    if any(a.startswith("Gemma3n") for a in arch.architectures) and (0, 4, 9) <= _v(version) <= (0, 4, 10):
        raise KvplanError(f"SGLang {version} gives Gemma 3n a hybrid sliding-window pool by its model class "
                          "(models/gemma3n_causal.py@0.4.9.post6), whose shared-KV layers kvplan does not size",
                          "size it for vLLM (--engine vllm)")
    if pool_kind(arch, version, swa_off) == "kv":
        refuse_layers(arch, version, swa_off)
    if arch.params.towers and not settings.language_model_only:
        raise KvplanError("kvplan does not size SGLang's pool for a multimodal model (SGLang lowers its memory "
                          "fraction by the vision tower's size, adjust_mem_fraction_for_vlm, not modelled)",
                          "size its language model alone with --language-model-only, or use --engine vllm")
    for what, on in (("pipeline parallelism", settings.pipeline_parallel_size > 1),
                     ("speculative decoding", settings.speculative is not None),
                     ("decode context parallelism", settings.decode_context_parallel_size > 1),
                     ("--kv-cache-memory-bytes (a vLLM flag)", settings.kv_cache_memory_bytes is not None),
                     ("--num-gpu-blocks-override (a vLLM flag)", settings.num_gpu_blocks_override is not None),
                     ("--block-size (a vLLM flag; SGLang's is --page-size)", settings.block_size is not None)):
        if on:
            raise KvplanError(f"kvplan does not size SGLang's pool with {what}", "drop it, or use --engine vllm")


#: The releases whose NSA pool kvplan has read (memory_pool.py, server_args.py @0.5.3, 0.5.3.post1, 0.5.3.post3,
#: 0.5.4.post3, 0.5.5.post3, 0.5.6.post2, 0.5.7, 0.5.8.post1, 0.5.9, 0.5.10.post1; model_runner.py /
#: model_runner_kv_cache_mixin.py `profile_max_num_token` / `get_cell_size_per_token`: the same NSA term, page 64 on
#: CUDA and "auto" dtype rule in each). 0.5.9 passes the buffer's dim from the model runner (``kv_cache_dim``,
#: `calculate_mla_kv_cache_dim`, model_runner_kv_cache_mixin.py@0.5.9): 0.5.8's dim for the default backends, which
#: 0.5.10 changes on Blackwell (`nsa_fp8_scaled`). 0.5.11 on size pools in model_executor/pool_configurator.py and
#: pick NSA backends anew (server_args.py@0.5.11, @0.5.12.post1; arg_groups from 0.5.13): not read.
NSA_READ = ((0, 5, 3), (0, 5, 10))
#: From 0.5.6 SGLang no longer sets dp_size to the TP size for DeepSeek NSA ("NSA with TP mode", server_args.py
#: @0.5.6.post2, @0.5.7; 0.5.8.post1 no longer turns DP attention on either): its attention weights are then sharded
#: over TP, while kvplan prices NSA's weights with the attention whole on every GPU (kvplan/engines/sglang.py). Its
#: branch still runs for DeepSeek-V3.2: under the transformers==4.57.1 those wheels pin, which has no ``deepseek_v32``
#: model type, `_load_deepseek_v32_model` rewrites the config's architectures to DeepseekV3ForCausalLM
#: (utils/hf_transformers_utils.py@0.5.6.post2 .. @0.5.9), the architecture the branch is keyed by; 0.5.10.post1 pins
#: transformers==5.3.0, and its NSA branch lists DeepseekV32ForCausalLM too (`is_deepseek_nsa`,
#: configs/model_config.py@0.5.9, @0.5.10.post1), with the same "DSA with TP mode" text (server_args.py@0.5.10.post1).
NSA_DP_GIVEN_FROM = (0, 5, 6)


def nsa_fp8_scaled(rules: SglangRules, blackwell: bool) -> bool:
    """Whether an FP8 NSA buffer holds the latent's scales and a bf16 rope (656 B a layer for DeepSeek-V3.2) rather
    than ``kv_lora_rank + rope`` bytes. 0.5.10 gives FP8 on compute capability >= 10 the trtllm prefill and decode
    backends (`_set_default_nsa_backends`, server_args.py@0.5.10.post1), for which `calculate_mla_kv_cache_dim`
    keeps ``kv_lora_rank + qk_rope_head_dim`` (model_runner_kv_cache_mixin.py@0.5.10.post1); 0.5.9 gives FP8
    flashmla_auto / flashmla_kv everywhere (server_args.py@0.5.9), so the scaled layout (as 0.5.3-0.5.8 always)."""
    return not (blackwell and _version(rules) >= (0, 5, 10))


def nsa_kv_dtype(settings: Settings, rules: SglangRules, blackwell: bool) -> tuple[KVDtype, str]:
    """The NSA pool's dtype: FP8 on Blackwell whatever the flag in 0.5.3.x, for "auto" in 0.5.4; bf16 for "auto"
    elsewhere (server_args.py@0.5.3, @0.5.3.post1, @0.5.4.post3); only bf16 and fp8_e4m3 taken."""
    name = settings.kv_cache_dtype
    if blackwell and (name == "auto" or _version(rules) < (0, 5, 4)):
        return kv_dtype("fp8_e4m3"), "auto" if name == "auto" else _KV_FLAGS.get(name, name)
    if name in ("auto", "bfloat16"):
        return kv_dtype("bfloat16"), "auto" if name == "auto" else "bfloat16"
    if name in ("fp8", "fp8_e4m3"):
        return kv_dtype("fp8_e4m3"), "fp8_e4m3"
    raise KvplanError(f"SGLang's NSA pool takes bf16 or fp8_e4m3 (server_args.py@0.5.4.post3), not {name}")


def size_pool(arch: Architecture, device: Device, settings: Settings, rules: SglangRules, weights_bytes: int,
              *, mem_fraction_static: float | None = None, page_size: int = 1,
              swa_full_tokens_ratio: float | None = None, dp_attention_size: int = 0,
              mla_ranks: tuple[int, int] | None = None, max_total_tokens: int | None = None,
              mamba_full_memory_ratio: float | None = None) -> SglangPool:
    """SGLang's pool on each GPU of one replica of ``settings`` (weights: per GPU, the attention's whole on every
    GPU under DP attention). ``dp_attention_size``: --enable-dp-attention's --dp-size given (0: not given; SGLang
    turns DP attention on for DeepSeek NSA itself, after its memory fraction is set). ``mla_ranks``: the config's
    (kv_lora_rank, qk_rope_head_dim), which shape the NSA pool's FP8 buffer."""
    swa_off = swa_memory_disabled(arch, rules, device)
    _refuse_what_is_not_modelled(arch, settings, rules.version, bool(swa_off))
    kind = pool_kind(arch, rules.version, bool(swa_off))
    tp = settings.tensor_parallel_size
    gpu_mem = round(device.memory_bytes / MiB)
    mla = any(isinstance(s, MLA) for s in arch.layers)
    chunk, _ = graph_defaults(gpu_mem, tp, rules)
    if rules.fraction_rule == "gpu_reserve":  # server_args.py@0.4.7.post1 .. 0.5.2
        chunk = 2048 if gpu_mem < 35 * 1024 else 8192 if gpu_mem < 160 * 1024 else 16384
    elif rules.fraction_rule == "table":  # server_args.py@0.4.6.post5
        chunk = 2048 if gpu_mem < 25_000 else 8192
    if mem_fraction_static is not None and not 0 < mem_fraction_static < 1:
        raise KvplanError(f"invalid --mem-fraction-static {mem_fraction_static!r}", "give a fraction in (0, 1)")
    if dp_attention_size and rules.fraction_rule != "activation_reserve":
        raise KvplanError(f"kvplan sizes SGLang's DP attention from 0.5.3 on, not {rules.version}",
                          "give --engine-version 0.5.3 or later")
    notes_how = ""
    if kind == "nsa":
        if not NSA_READ[0] <= _version(rules) <= NSA_READ[1]:
            raise KvplanError(f"kvplan has read SGLang's NSA pool in 0.5.3 to 0.5.10 only, not {rules.version} (0.5.11 "
                              "on size pools in model_executor/pool_configurator.py and pick NSA backends anew)",
                              "give --engine-version 0.5.3 .. 0.5.10.post1")
        if _version(rules) >= NSA_DP_GIVEN_FROM and not dp_attention_size:
            raise KvplanError(f"SGLang {rules.version} no longer sets --dp-size to the TP size for DeepSeek NSA "
                              "(server_args.py@0.5.6.post2 .. @0.5.10.post1): its attention weights are then split over "
                              "TP, which kvplan's NSA weights (the attention whole on every GPU) do not price",
                              "give --enable-dp-attention (--dp-size = the TP size), or --engine-version 0.5.5")
        if device.vendor != "nvidia":
            raise KvplanError("kvplan sizes SGLang's NSA pool on NVIDIA GPUs only (page 64; 0.5.8 sets page 1 on ROCm, "
                              "server_args.py@0.5.8.post1)")
        if mla_ranks is None:
            raise KvplanError("the config gives no kv_lora_rank and qk_rope_head_dim, which SGLang's NSA pool is "
                              "shaped by")
        page_size = 64  # "Setting page size to 64 for DeepSeek NSA" (server_args.py@0.5.3 .. @0.5.10.post1, CUDA)
    if kind == "nsa" and rules.nsa_forced_fraction is not None:
        fraction = high_fraction = rules.nsa_forced_fraction
        how = "0.5.3 sets 0.8 for DeepSeek NSA" + (f", over the {mem_fraction_static:g} given"
                                                    if mem_fraction_static not in (None, 0.8) else "")
    elif mem_fraction_static is None:
        fraction, how = default_fraction(rules, gpu_mem, tp, mla, rules.prefill_graph_reserve, dp_attention_size)
        # SGLang turns the prefill graphs off for some architectures (`is_piecewise_cuda_graph_disabled_model`),
        # which kvplan does not list: the fraction without their reserve is the high end.
        high_fraction = default_fraction(rules, gpu_mem, tp, mla, False, dp_attention_size)[0]
    else:
        fraction, how, high_fraction = mem_fraction_static, "given", mem_fraction_static
    if kind == "nsa":
        dtype, flag = nsa_kv_dtype(settings, rules, device.is_blackwell)
        cell = k_half = nsa_profile_cell(arch, dtype, *mla_ranks, bool(rules.nsa_indexer_in_pool))
    else:
        dtype, flag = resolve_kv_dtype(arch, settings, rules)
    low_p, est_p, high_p = (device.cuda_total_bytes - s for s in reversed(STARTUP_BYTES))
    rests = (low_p * fraction - weights_bytes, est_p * fraction - weights_bytes, high_p * high_fraction - weights_bytes)
    context = settings.max_model_len or arch.max_model_len_limit or arch.max_position_embeddings or 0
    extra: dict = {"kind": kind}
    if kind == "swa":
        if rules.swa_sizing is None:  # no swa_full_tokens_ratio in server_args.py@0.4.8.post1
            raise KvplanError(f"SGLang {rules.version} has no hybrid sliding-window pool (it came in 0.4.9)",
                              "give --engine-version 0.4.9 or later")
        architecture = hybrid_swa_arch(arch, rules.version)
        pools = swa_pools(arch, tp if not dp_attention_size else max(1, tp // dp_attention_size), dtype)
        ratio = SWA_FULL_TOKENS_RATIO if swa_full_tokens_ratio is None else swa_full_tokens_ratio
        splits = [swa_split(int(r), pools.full_cell // pools.full_layers, pools.full_layers,
                            pools.swa_cell // pools.swa_layers, pools.swa_layers, ratio, page_size, rules.swa_sizing,
                            architecture, max_total_tokens) for r in rests]
        counts = [sp.full_tokens for sp in splits]
        cell, k_half = pools.full_cell + pools.swa_cell, pools.full_k + pools.swa_k  # a token in both pools
        notes_how = splits[1].how
        extra |= {"swa_tokens": splits[1].swa_tokens, "swa": pools, "swa_full_tokens_ratio": ratio,
                  "profiled_tokens": splits[1].profiled_tokens}
    elif kind == "mamba":
        # Page 1 on every NVIDIA GPU in 0.5.14-0.5.15 too: on SM100 Qwen3-Next / Qwen3.5 get triton and page 1, as the
        # trtllm_mha test reads the strategy while it is still "auto" (server_args.py@0.5.14, before
        # `_handle_mamba_radix_cache`; `_qwen3_5_hybrid_overrides`, arg_groups/overrides.py@0.5.15.post1, collected before
        # the strategy is resolved); Nemotron-H gets flashinfer, its page left to `_handle_page_size` (1).
        if rules.mamba_extra_buffer_default and device.vendor != "nvidia":
            raise KvplanError(f"SGLang {rules.version} turns --mamba-radix-cache-strategy auto into extra_buffer for "
                              "this model (the triton linear-attention backend and the overlap schedule, both "
                              "defaults), then asserts \"extra_buffer needs CUDA/MUSA/NPU (FLA)\" "
                              "(`_validate_mamba_extra_buffer`, server_args.py@0.5.14, @0.5.15.post1): it does not "
                              "start so on this GPU, and kvplan does not take --mamba-radix-cache-strategy",
                              "give --engine-version 0.5.13, or size it for vLLM")
        cell, k_half, mamba = _mamba_pool(arch, rules, tp, dp_attention_size, dtype, mamba_full_memory_ratio, rests)
        counts = [tokens_from_budget(sp.kv_budget_bytes, cell, page_size, max_total_tokens) for sp in mamba[0]]
        notes_how = mamba[1]
        extra |= mamba[2]
    else:
        if kind == "kv":
            cell, k_half, _ = kv_cell(arch, tp if not dp_attention_size else max(1, tp // dp_attention_size), dtype,
                                      rules.version, bool(swa_off))
        counts = [tokens_from_budget(r, cell, page_size, max_total_tokens) for r in rests]
        notes_how = f"{int(rests[1]):,} B // {cell:,} B a token, in pages of {page_size}"
        if kind == "nsa":
            buffer = nsa_cell(arch, dtype, *mla_ranks, bool(rules.nsa_indexer_in_pool),
                              nsa_fp8_scaled(rules, device.is_blackwell))
            extra["buffer_bytes_per_token"] = buffer
            notes_how += f"; its buffers hold {buffer:,} B a token"
        if kind == "kv" and any(isinstance(s, SlidingWindow) for s in arch.layers):
            notes_how += (f"; SGLang {rules.version} gives this model no hybrid sliding-window pool"
                          + (f" ({swa_off})" if swa_off else "") + ": its window layers take full pages in the one "
                          "pool (SGLANG_HYBRID_SWA_LISTED, HYBRID_SWA_ARCHS)")
    tokens = counts[1]
    running = max_running_requests(tokens, context, rules, extra.pop("profiled_tokens", None))
    if kind == "mamba":  # min(max_num_reqs, max_mamba_cache_size // ratio), SglangRules.mamba_slots_per_request
        running = min(running, extra["mamba_slots"] // rules.mamba_slots_per_request)
    return SglangPool(
        rules=rules, gpu_mem_mib=gpu_mem, mem_fraction_static=fraction, fraction_how=how,
        chunked_prefill_size=chunk, free_before_load=(low_p, est_p, high_p), weights_bytes=weights_bytes,
        rest_bytes=tuple(round(r) for r in rests), kv_dtype=dtype, kv_dtype_flag=flag, cell_bytes=cell,
        k_bytes_per_token=k_half, page_size=page_size, tokens=tokens, tokens_range=(counts[0], counts[2]),
        context_len=context, max_running_requests=running, mla=mla,
        dp_attention=bool(dp_attention_size) or kind == "nsa", how=notes_how, **extra)


def full_attention_cell(arch: Architecture, attention_tp: int, dtype: KVDtype) -> tuple[int, int]:
    """(cell, K half) of a Mamba / GDN hybrid's KV pool on one GPU: its full-attention layers alone
    (``HybridLinearKVPool`` builds it with ``layer_num = len(full_attention_layer_ids)``,
    mem_cache/memory_pool.py@0.5.9 .. @0.5.23)."""
    full = [s.per_rank(attention_tp) for s in arch.layers if type(s) is FullAttention]
    cell = round(sum(s.bytes_per_token(dtype) for s in full))
    return cell, round(sum(s.num_kv_heads * s.head_size * dtype.bytes_per_element for s in full))


def _mamba_pool(arch: Architecture, rules: SglangRules, tp: int, dp_attention_size: int, dtype: KVDtype,
                ratio: float | None, rests: tuple[float, ...]) -> tuple[int, int, tuple]:
    """(KV cell over the full-attention layers, its K half, (the splits of each budget, how, the pool's fields)) of
    a Mamba / GDN hybrid (kvplan/sglang/hybrid.py `mamba_split`)."""
    archs = mamba_archs_in(rules.version)
    name = next((a for a in arch.architectures if a in archs), None)
    states = [s for s in arch.layers if type(s) is MambaState]
    if not rules.mamba_ratio_split or name is None or any(s.variant != archs[name] for s in states):
        raise KvplanError(MAMBA_NOT_SIZED + f"; this is {', '.join(arch.architectures)} in SGLang {rules.version}",
                          "give --engine-version 0.5.4 .. 0.5.15 for Qwen3-Next or Nemotron-H (0.5.9 .. 0.5.15 for "
                          "Qwen3.5), or size it for vLLM")
    attention_tp = max(1, tp // dp_attention_size) if dp_attention_size else tp  # get_attention_tp_size()
    conv, ssm, ssm_how = mamba_slot_bytes(states, attention_tp, rules)
    cell, k_half = full_attention_cell(arch, attention_tp, dtype)
    ratio = 0.9 if ratio is None else ratio  # --mamba-full-memory-ratio's default (server_args.py@0.5.6.post2)
    splits = [mamba_split(r, conv + ssm, ratio) for r in rests]
    if dp_attention_size and archs[name] == "gated_delta_net" and rules.mamba_gdn_slots_per_dp:
        splits = [mamba_split_slots(sp, conv + ssm, dp_attention_size) for sp in splits]
    mid = splits[1]
    how = (f"the state pool: {mid.max_mamba_cache_size:,} slots of {conv + ssm:,} B (ratio {ratio:g}; SSM {ssm_how}), "
           f"{mid.state_bytes / GiB:,.2f} GiB; the KV pool: {int(mid.kv_budget_bytes):,} B // {cell:,} B a token")
    return cell, k_half, (splits, how, {"mamba_slots": mid.max_mamba_cache_size, "mamba_state_bytes": (conv, ssm),
                                        "mamba_full_memory_ratio": ratio})


def mamba_slot_bytes(states: list[MambaState], attention_tp: int, rules: SglangRules) -> tuple[int, int, str]:
    """(conv, SSM, how the SSM dtype was chosen): one request's state on one GPU, ``mamba_cache_per_req``
    (configs/mamba_utils.py@0.5.6.post2 .. @0.5.15.post1) split as the Mamba pool's line prints it."""
    ssm_bytes, ssm_how = mamba_ssm_dtype_bytes(states[0].config_mamba_ssm_dtype, rules.mamba_ssm_from_config)
    shaped = [replace(s.per_rank(attention_tp), conv_bytes=2, ssm_bytes=ssm_bytes, spec_tokens=0) for s in states]
    conv = sum(replace(s, ssm_bytes=0).state_bytes() for s in shaped)  # CONV_DTYPE = torch.bfloat16
    ssm = sum(replace(s, conv_bytes=0).state_bytes() for s in shaped)  # the SSM dtype (`mamba_ssm_dtype_bytes`)
    return conv, ssm, ssm_how


def mamba_split_slots(split: MambaSplit, per_request: int, dp: int) -> MambaSplit:
    """GDN under DP attention: the slots divided by the DP size, the KV pool given what they no longer take
    (``hybrid_gdn_config``, model_runner.py@0.5.3.post3 .. @0.5.6.post2; `SglangRules.mamba_gdn_slots_per_dp`)."""
    slots = split.max_mamba_cache_size // dp
    total = split.kv_budget_bytes + split.state_bytes
    return MambaSplit(slots, slots * per_request, total - slots * per_request)


def max_running_requests(tokens: int, context_len: int, rules: SglangRules, profiled_tokens: int | None = None) -> int:
    """The default cap on running requests: ``min(clamp(tokens / context x 512, 2048, 4096), tokens // 2)``
    (tp_worker.py@0.4.7.post1 .. kv_cache_configurator.py@0.5.23; 0.4.6 allows one request more). A hybrid
    sliding-window pool's estimate is of ``profiled_tokens``, the count before its split (`SwaSplit`)."""
    if tokens <= 0 or context_len <= 0:
        return 0
    estimated = min(max(int((profiled_tokens or tokens) / context_len * 512), 2048), 4096)
    if rules.fraction_rule == "table":
        estimated += 1  # ReqToTokenPool(size=max_num_reqs + 1), 0.4.6
    return min(estimated, tokens // 2)


def tokens_from_budget(rest_bytes: float, cell: int, page_size: int = 1, max_total_tokens: int | None = None) -> int:
    """``max_total_num_tokens`` from the KV budget: ``int(rest x 2^30) // cell``, capped by ``--max-total-tokens``,
    rounded down to the page (`profile_max_num_token`@0.5.6.post2, `pool_configurator.py`@0.5.23)."""
    tokens = max(0, int(rest_bytes)) // cell
    if max_total_tokens:
        tokens = min(tokens, max_total_tokens)
    return tokens // page_size * page_size


def tokens_from_buffers(pool_bytes: float, cell: int, page_size: int = 1) -> int:
    """The ``#tokens`` whose buffers take ``pool_bytes``: they hold one padding page more than the tokens
    (``torch.zeros((size + page_size, heads, head_dim))``, `mem_cache/memory_pool.py`@0.4.6.post5 .. @0.5.23), so
    this inverts the printed "K size" + "V size" (MLA: "KV size")."""
    return max(0, int(pool_bytes) // cell - page_size) // page_size * page_size
