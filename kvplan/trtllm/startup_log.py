"""What a TensorRT-LLM start-up log says about its KV pool, read line by line.

The lines (docs/engines-trtllm-rules.md section 3 lists them in start-up order, with the code that prints them):

- the release: ``[TensorRT-LLM] TensorRT-LLM version: X`` (`tensorrt_llm/__init__.py`, older commits),
  ``TensorRT LLM version: X`` (`__init__.py@c40f115`), ``TensorRT LLM version: X (backend: cuda)`` (`@083a741`);
  trtllm-bench's report prints ``TensorRT-LLM Version: X``;
- the pool, C++ `KVCacheManager::allocatePools` (`cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp@b35ac1b`):
  ``Number of tokens per block: T.`` then ``[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N).``
  with N = primary blocks x T. The PyTorch backend sizes twice (a small estimation pool, then the real one), so the
  **last** such line is the pool;
- the PyTorch backend's profile (`_torch/pyexecutor/_util.py@b35ac1b` `_cal_max_memory`): ``Peak memory during memory
  usage profiling (torch + non-torch): P GiB, available KV cache memory when calculating max tokens: A GiB, fraction
  is set F, kv size is K. device total memory T GiB, , tmp kv_mem M GiB`` (2026 commits: ``kv size per token is K
  bytes/token. ... temporary kv cache memory during profiling M GiB``), then ``Estimated max memory in KV cache :
  X GiB`` (before PR #5933, spring 2025: ``Estimated max tokens in KV cache : N``);
- a TensorRT engine's sizing (`kvCacheManager.cpp`, `calculateMaxNumBlocks`): ``Memory usage when calculating max
  tokens in paged kv cache: total: T GiB, available: A GiB`` and ``Number of blocks in KV cache primary pool: B``;
- ``Both free_gpu_memory_fraction and max_tokens are set (to F and N, respectively)`` (`resource_manager.py`
  `calculate_max_num_blocks`; the C++ text names ``freeGpuMemoryFraction (aka kv_cache_free_gpu_mem_fraction)``);
- ``Use X GB for model weights.`` (GiB, printed "GB"); 2023 releases: ``Using N tokens in paged KV cache.``;
- releases 0.8-0.9 (early 2024; the batch manager that prints them shipped as a binary library, so the format is
  read from their logs): ``Allocate B bytes for k/v cache.`` then ``Using N tokens in paged KV cache.`` (0.9: ``Using N
  total tokens in paged KV cache, and M blocks per sequence``): the pool in bytes, exact, and its tokens (blocks x T).
  Such a pair is read as the pool line is, with X = B / 2^30; a lone 2023 ``Using N tokens`` prints no memory;
- a TensorRT engine's build log (`trtllm-build`) prints its paged block size as ``Set tokens_per_block to T.``

Every GiB is ``1 << 30`` bytes (``GB = 1 << 30`` in `_util.py@b35ac1b`; the C++ divides by ``1 << 30``).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from kvplan.units import GiB
from kvplan.vllm.startup_log import redact

_F = r"(-?\d{1,9}(?:\.\d{1,18})?)"
_N = r"(\d{1,12})"
_VERSION = re.compile(r"TensorRT[- ]LLM [Vv]ersion: v?(\d{1,3}\.\d{1,3}\.\d{1,3}[\w.]{0,24})")
_ALLOCATED = re.compile(r"Allocated " + _F + r" GiB for max tokens in paged KV cache \(" + _N + r"\)")
_TOKENS_PER_BLOCK = re.compile(r"(?:Number of tokens per block: |tokens per block=|Set tokens_per_block to )" + _N)
_PRIMARY = re.compile(r"(?:Number of blocks in KV cache primary pool: |primary blocks=)" + _N)
_MEM_USAGE = re.compile(r"Memory usage when calculating max tokens in paged kv cache: total: " + _F
                        + r" GiB, available: " + _F + " GiB")
_PROFILE = re.compile(r"Peak memory during memory usage profiling \(torch \+ non-torch\): " + _F + r" GiB, available KV "
                      r"cache memory when calculating max tokens: " + _F + r" GiB, fraction is set " + _F
                      + r", kv size(?: per token)? is " + _N + r"(?: bytes/token)?")
_PROFILE_TOTAL = re.compile(r"device total memory " + _F + r" GiB, ,? ?(?:tmp kv_mem|temporary kv cache memory during "
                            r"profiling) " + _F + " GiB")
_ESTIMATED_MEMORY = re.compile(r"Estimated max memory in KV cache ?: " + _F + " GiB")
_ESTIMATED_TOKENS = re.compile(r"Estimated max tokens in KV cache ?: " + _N)
_BOTH = re.compile(r"Both (?:free_gpu_memory_fraction|freeGpuMemoryFraction)[^(]{0,80}and (?:max_tokens|maxTokens)[^(]{0,80}"
                   r"are set \(to " + _F + " and " + _N)
_WEIGHTS = re.compile(r"Use " + _F + r" GB for model weights")
_SEQ = re.compile(r"max_seq_len=" + _N + r", max_num_requests=" + _N + r", max_num_tokens=" + _N)
_OLD_TOKENS = re.compile(r"Using " + _N + r" (?:total )?tokens in paged KV cache")
_OLD_BYTES = re.compile(r"Allocate " + _N + r" bytes for k/v cache")
# Lines only the PyTorch backend prints (`_torch/pyexecutor/_util.py`, `resource_manager.py` snake_case warning; the
# C++ one names freeGpuMemoryFraction).
_PYTORCH = re.compile(r"PyTorch backend|Peak memory during memory usage profiling|Memory used after loading model weights"
                      r"|Estimated max (?:memory|tokens) in KV cache|Both free_gpu_memory_fraction and max_tokens")
# Settings a log may show: a trtllm-serve / trtllm-bench command, an LLM-args dump or a YAML option file.
_FRACTION = re.compile(r"(?:--kv_cache_free_gpu_memory_fraction|--kv_cache_free_gpu_mem_fraction|free_gpu_memory_fraction"
                       r"|kv_cache_free_gpu_mem_fraction)['\"]?(?:=|:|\s)\s{0,4}" + _F)
_MODEL = re.compile(r"trtllm-serve(?: serve)? (?!--)([\w./\-]{1,200})|trtllm-bench (?:[^\n]{0,200}?)--model[ =]([\w./\-]{1,200})"
                    r"|^\s*Model: ([\w./\-]{1,200})\s*$")
_TP = re.compile(r"(?:--tp_size|--tp|tensor_parallel_size|tp_size)['\"]?(?:=|:|\s)\s{0,4}(\d{1,4})\b|TP Size: (\d{1,4})")
_KV_DTYPE = re.compile(r"KV Cache Dtype: (\w{1,16})|(?:--kv_cache_dtype|kv_cache_dtype)['\"]?(?:=|:|\s)\s{0,4}['\"]?(\w{1,16})")

KEYWORDS = ("TensorRT", "TRT-LLM", "paged KV cache", "for k/v cache", "paged kv cache", "tokens per block", "primary pool",
            "primary blocks", "memory usage profiling", "Estimated max", "are set (to", "for model weights",
            "max_seq_len=", "trtllm-serve", "trtllm-bench", "Model: ", "free_gpu_mem", "tp_size", "TP Size",
            "kv_cache_dtype", "KV Cache Dtype")


class TrtllmPool(BaseModel):
    gib: float = Field(description="'Allocated X GiB ...'")
    tokens: int = Field(description="'(N)': primary blocks x tokens per block")


class TrtllmStartup(BaseModel):
    """What one TensorRT-LLM start-up log says. ``None``: the log does not show it."""

    trtllm_version: str | None = None
    backend: str | None = Field(None, description="pytorch (the profiling lines) or tensorrt (an engine's C++ sizing)")
    model: str | None = None
    tensor_parallel_size: int | None = None
    kv_cache_dtype: str | None = None
    free_gpu_memory_fraction: float | None = Field(None, description="as the log states it (profile line or settings)")
    tokens_per_block: int | None = None
    pools: list[TrtllmPool] = Field(default_factory=list, description="every 'Allocated ... paged KV cache' line, in order")
    primary_blocks: int | None = None
    peak_gib: float | None = Field(None, description="PyTorch: the profiled peak, torch + non-torch")
    profiled_kv_gib: float | None = Field(None, description="PyTorch: 'available KV cache memory when calculating max tokens'")
    kv_bytes_per_token: int | None = Field(None, description="PyTorch: 'kv size is K' (the estimator's bytes a token)")
    device_total_gib: float | None = Field(None, description="'device total memory' or the C++ line's 'total'")
    estimation_pool_gib: float | None = Field(None, description="PyTorch: 'tmp kv_mem' (the first pass's pool, added back)")
    estimated_kv_gib: float | None = Field(None, description="PyTorch: 'Estimated max memory in KV cache'")
    estimated_max_tokens: int | None = Field(None, description="PyTorch before PR #5933: 'Estimated max tokens in KV cache'")
    max_tokens_used: int | None = Field(None, description="the last 'Both ... are set (to F and N)': the tokens kept")
    engine_available_gib: float | None = Field(None, description="TensorRT engine: the C++ line's 'available'")
    weights_gib: float | None = None
    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    legacy_tokens: int | None = Field(None, description="2023: 'Using N tokens in paged KV cache'")
    legacy_kv_bytes: int | None = Field(None, description="0.8-0.9: 'Allocate B bytes for k/v cache' (with 'Using N "
                                                          "tokens' after it, read as a pool line)")
    sources: dict[str, str] = Field(default_factory=dict, description="field -> the log line it came from")

    @property
    def pool(self) -> TrtllmPool | None:
        """The real pool: the last 'Allocated' line (the PyTorch backend's first is its estimation pool)."""
        return self.pools[-1] if self.pools else None

    @property
    def has_pool_lines(self) -> bool:
        return bool(self.pools) or self.legacy_tokens is not None


def parse_trtllm_log(text: str) -> TrtllmStartup:
    """Parse a TensorRT-LLM start-up log (PyTorch backend or a TensorRT engine)."""
    found: dict[str, Any] = {}
    sources: dict[str, str] = {}
    pools: list[TrtllmPool] = []
    pending_bytes: int | None = None  # 0.8-0.9: 'Allocate B bytes', waiting for its 'Using N tokens'

    def put(field: str, value: Any, line: str, *, first: bool = False) -> None:
        if value is None or (first and field in found):
            return
        found[field] = value
        sources[field] = line.strip()[:400]

    for line in (redact(raw) for raw in text.splitlines()):
        if (m := _VERSION.search(line)) is not None:
            put("trtllm_version", m.group(1).rstrip("."), line)
        if _PYTORCH.search(line):
            put("backend", "pytorch", line, first=True)
        if (m := _ALLOCATED.search(line)) is not None:
            pools.append(TrtllmPool(gib=float(m.group(1)), tokens=int(m.group(2))))
            sources["pools"] = line.strip()[:400]
        if (m := _TOKENS_PER_BLOCK.search(line)) is not None:
            put("tokens_per_block", int(m.group(1)), line)
        if (m := _PRIMARY.search(line)) is not None:
            put("primary_blocks", int(m.group(1)), line)
        if (m := _MEM_USAGE.search(line)) is not None:
            put("device_total_gib", float(m.group(1)), line)
            put("engine_available_gib", float(m.group(2)), line)
        if (m := _PROFILE.search(line)) is not None:
            put("peak_gib", float(m.group(1)), line)
            put("profiled_kv_gib", float(m.group(2)), line)
            put("free_gpu_memory_fraction", float(m.group(3)), line)
            put("kv_bytes_per_token", int(m.group(4)), line)
        if (m := _PROFILE_TOTAL.search(line)) is not None:
            put("device_total_gib", float(m.group(1)), line)
            put("estimation_pool_gib", float(m.group(2)), line)
        if (m := _ESTIMATED_MEMORY.search(line)) is not None:
            put("estimated_kv_gib", float(m.group(1)), line)
        if (m := _ESTIMATED_TOKENS.search(line)) is not None:
            put("estimated_max_tokens", int(m.group(1)), line)
        if (m := _BOTH.search(line)) is not None:
            put("free_gpu_memory_fraction", found.get("free_gpu_memory_fraction") or float(m.group(1)), line)
            put("max_tokens_used", int(m.group(2)), line)
        if (m := _WEIGHTS.search(line)) is not None:
            put("weights_gib", float(m.group(1)), line)
        if (m := _SEQ.search(line)) is not None:
            put("max_seq_len", int(m.group(1)), line)
            put("max_num_tokens", int(m.group(3)), line)
        if (m := _OLD_BYTES.search(line)) is not None:
            pending_bytes = int(m.group(1))
            put("legacy_kv_bytes", pending_bytes, line)
        if (m := _OLD_TOKENS.search(line)) is not None:
            put("legacy_tokens", int(m.group(1)), line)
            if pending_bytes is not None:  # every rank prints its pair: one pool line each, as the C++ one
                pools.append(TrtllmPool(gib=pending_bytes / GiB, tokens=int(m.group(1))))
                sources["pools"] = line.strip()[:400]
                pending_bytes = None
        if (m := _FRACTION.search(line)) is not None and "peak_gib" not in found:
            put("free_gpu_memory_fraction", float(m.group(1)), line, first=True)
        if (m := _MODEL.search(line)) is not None:
            put("model", next(g for g in m.groups() if g), line, first=True)
        if (m := _TP.search(line)) is not None:
            put("tensor_parallel_size", int(m.group(1) or m.group(2)), line, first=True)
        if (m := _KV_DTYPE.search(line)) is not None:
            put("kv_cache_dtype", (m.group(1) or m.group(2)).lower(), line, first=True)
    if "backend" not in found and found.get("engine_available_gib") is not None:
        found["backend"] = "tensorrt"
        sources["backend"] = sources["engine_available_gib"]
    return TrtllmStartup(pools=pools, sources=sources, **found)


def looks_like_trtllm(text: str) -> int:
    """How many of TensorRT-LLM's own start-up lines the text holds (0: none)."""
    return sum(bool(p.search(text)) for p in (_VERSION, _ALLOCATED, _TOKENS_PER_BLOCK, _MEM_USAGE, _PROFILE,
                                               _ESTIMATED_MEMORY, _OLD_TOKENS, re.compile(r"\[TensorRT-LLM\]|\[TRT-LLM\]")))


__all__ = ["KEYWORDS", "TrtllmPool", "TrtllmStartup", "looks_like_trtllm", "parse_trtllm_log"]
