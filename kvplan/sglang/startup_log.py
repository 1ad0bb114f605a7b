"""What an SGLang start-up log says about its KV pool, read line by line.

The lines, as SGLang's source prints them (docs/engines-sglang-rules.md section 5 lists them by release):

- ``server_args=ServerArgs(model_path='...', tp_size=4, mem_fraction_static=0.93, ...)``
  (`entrypoints/engine.py@0.4.9.post6`: ``logger.info(f"{server_args=}")``); a dict from 0.5.19
  (``server_args={'model_path': ...}``, `entrypoints/engine.py@0.5.23` `_server_args_for_logging`);
- ``Load weight begin. avail mem=P GB`` and ``Load weight end. [elapsed=T s, ]type=CLS, [dtype=torch.X, ]
  avail mem=A GB, mem usage=W GB.`` (`model_executor/model_runner.py@0.4.6.post5` .. `@0.5.23`);
- ``[LABEL ]KV Cache is allocated. [dtype: torch.X, ]#tokens: N, K size: K GB, V size: V GB`` or ``KV size: X GB``
  for MLA (`mem_cache/memory_pool.py@0.4.6.post5`; ``dtype:`` from 0.5.13.post1; the label and ``VA upper bound``
  in `memory_pool.py@0.5.23` `_finalize_allocation_log`); before 0.4.6 some releases printed no ``#tokens``;
- ``Use [Ss]liding window memory pool. full_layer_tokens=F, swa_layer_tokens=S`` (`model_runner.py@0.4.9.post6`,
  `model_executor/pool_configurator.py@0.5.23`), ``Mamba Cache is allocated. ...``;
- ``max_total_num_tokens=N, chunked_prefill_size=C, max_prefill_tokens=M, max_running_requests=R, context_len=L[,
  available_gpu_mem=G GB]`` (`managers/scheduler.py@0.4.6.post5` .. `@0.5.23`, TP rank 0; no ``chunked_prefill_size``
  in `managers/scheduler.py@0.4.1.post7`);
- ``Memory pool end. avail mem=X GB``;
- the release and the GPU where ``python3 -m sglang.check_env`` output is pasted with the log (`sglang/check_env.py
  @0.5.23` prints ``sglang: 0.5.23`` and ``GPU 0,1,2,3: NVIDIA H100 80GB HBM3``; SGLang's bug template asks for it).

Every "GB" SGLang prints is GiB (``GB = 1024 * 1024 * 1024`` in `mem_cache/memory_pool.py@0.4.6.post5`). Lines carry
a ``[YYYY-MM-DD HH:MM:SS TPn]`` prefix (``DPd TPn``, ``PPp TPn``): each rank prints its own memory lines, and SGLang
sizes with the minimum over ranks, so the smallest printed figure is kept.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvplan.vllm.startup_log import redact

_F = r"(-?\d{1,9}(?:\.\d{1,9})?)"  # a printed figure (bounded: linear on any line)
_N = r"(\d{1,12})"
_RANK = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d((?: [A-Z]{2,4}\d{1,5}){0,4})\]")
_SERVER_ARGS = re.compile(r"server_args=(?:ServerArgs\(|\{)")
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=" + _F + " GB")
_LOAD_END = re.compile(r"Load weight end\. (?:elapsed=[\d.]{1,12} s, )?type=(\w{1,120}), (?:dtype=torch\.(\w{1,20}), )?"
                       r"(?:[^,\n]{0,200}, )?avail mem=" + _F + r" GB, mem usage=" + _F + " GB")
_KV_LINE = re.compile(r"(?:([\w\- ]{1,60}) )?KV Cache (?:is allocated|VA upper bound)\. (?:dtype: torch\.(\w{1,20}), )?"
                      r"(?:#tokens: " + _N + r", )?(?:K size: " + _F + r" GB, V size: " + _F + r" GB|KV size: " + _F + " GB)")
_KV_DTYPE = re.compile(r"Using KV cache dtype: torch\.(\w{1,20})")
_SWA = re.compile(r"Use [Ss]liding window memory pool\. full_layer_tokens=" + _N + r", swa_layer_tokens=" + _N)
_MAMBA = re.compile(r"Mamba Cache is allocated\.(?: max_mamba_cache_size: " + _N + r", conv_state size: " + _F
                    + r" ?GB, ssm_state size: " + _F + " ?GB)?")  # mem_cache/memory_pool.py@0.5.6.post2 .. @0.5.15.post1
# ``chunked_prefill_size`` is absent from `managers/scheduler.py@0.4.1.post7`'s line (sglang docs' own January 2025 log).
_SCHEDULER = re.compile(r"max_total_num_tokens=" + _N + r"(?:, chunked_prefill_size=(-?\d{1,9}))?, max_prefill_tokens=" + _N
                        + r", max_running_requests=" + _N + r", context_len=" + _N
                        + r"(?:, available_gpu_mem=" + _F + " GB)?")
_POOL_END = re.compile(r"Memory pool end\. avail mem=" + _F + " GB")
_VERSION = re.compile(r"(?:^|\s)sglang(?::\s{1,8}|==|\s+version:?\s{1,4})v?(\d{1,3}\.\d{1,3}\.\d{1,3}(?:\.post\d{1,3}|rc\d{1,3})?)\b",
                      re.IGNORECASE)
_DOCKER_VERSION = re.compile(r"lmsysorg/sglang:v(\d{1,3}\.\d{1,3}\.\d{1,3}(?:\.post\d{1,3}|rc\d{1,3})?)")
_GPU = re.compile(r"^\s*GPU ([\d,]{1,200}): (NVIDIA [^\n]{1,80}|AMD [^\n]{1,80})$")

#: server_args keys kvplan reads, and their types (`srt/server_args.py`).
_ARG_KEYS: dict[str, type] = {
    "model_path": str, "tp_size": int, "pp_size": int, "dp_size": int, "enable_dp_attention": bool,
    "mem_fraction_static": float, "page_size": int, "kv_cache_dtype": str, "context_length": int,
    "max_total_tokens": int, "chunked_prefill_size": int, "max_running_requests": int, "dtype": str,
    "quantization": str, "speculative_algorithm": str, "disable_radix_cache": bool, "swa_full_tokens_ratio": float,
    "attention_backend": str, "device": str,
}
#: launch_server flags -> server_args keys (`srt/server_args.py` `add_cli_args`: ``--tp`` is ``--tp-size``'s alias).
_FLAGS = {"--model-path": "model_path", "--model": "model_path", "--tp-size": "tp_size", "--tp": "tp_size",
          "--pp-size": "pp_size", "--dp-size": "dp_size", "--dp": "dp_size", "--mem-fraction-static": "mem_fraction_static",
          "--page-size": "page_size", "--kv-cache-dtype": "kv_cache_dtype", "--context-length": "context_length",
          "--max-total-tokens": "max_total_tokens", "--chunked-prefill-size": "chunked_prefill_size",
          "--max-running-requests": "max_running_requests", "--dtype": "dtype", "--quantization": "quantization",
          "--speculative-algorithm": "speculative_algorithm", "--swa-full-tokens-ratio": "swa_full_tokens_ratio",
          "--attention-backend": "attention_backend"}
_BOOL_FLAGS = {"--enable-dp-attention": "enable_dp_attention", "--disable-radix-cache": "disable_radix_cache"}
_LAUNCH = re.compile(r"sglang\.launch_server|sglang serve\b")
_VALUE = r"('(?:[^'\\\n]|\\.){0,1000}'|\"[^\"\n]{0,1000}\"|True|False|None|-?\d{1,12}(?:\.\d{1,12})?(?:e-?\d{1,3})?)"

# A line is kept for parsing only when it holds one of these (a 100 MB log keeps a few hundred lines).
KEYWORDS = ("server_args=", "launch_server", "sglang serve", "Load weight", "KV Cache", "KV cache dtype", "memory pool", "Memory pool",
            "Mamba Cache", "max_total_num_tokens=", "sglang", "GPU 0")


class SglangStartup(BaseModel):
    """What one SGLang start-up log says. ``None``: the log does not show it."""

    # pydantic before 2.10 warns on stderr about fields named model_*: its namespace, not ours
    model_config = ConfigDict(protected_namespaces=())

    sglang_version: str | None = None
    gpu: str | None = Field(None, description="the GPU check_env names ('GPU 0,1: NVIDIA H100 80GB HBM3')")
    gpu_count: int | None = None
    model: str | None = Field(None, description="server_args model_path")
    model_class: str | None = Field(None, description="'Load weight end. type=...'")
    model_dtype: str | None = None
    server_args: dict[str, Any] = Field(default_factory=dict, description="the server_args fields kvplan reads")
    ranks: int = Field(0, description="ranks whose lines the log shows")
    free_before_load_gib: float | None = Field(None, description="'Load weight begin. avail mem', smallest over ranks")
    free_after_load_gib: float | None = Field(None, description="'Load weight end ... avail mem', smallest over ranks")
    weights_gib: float | None = Field(None, description="'Load weight end ... mem usage' of the rank with the least free")
    kv_cache_dtype: str | None = Field(None, description="torch dtype of the pool, as printed")
    pool_tokens: int | None = Field(None, description="'#tokens' of the first pool line (the target model's)")
    k_size_gib: float | None = None
    v_size_gib: float | None = None
    kv_size_gib: float | None = Field(None, description="MLA: one latent buffer")
    pool_label: str | None = Field(None, description="a labelled pool line (0.5.23 MiniMax pools): not the usual pool")
    draft_pools: int = Field(0, description="further pool lines of the same rank (a speculative draft's); a "
                                            "sliding-window pool's own two lines are not counted")
    swa_full_tokens: int | None = None
    swa_tokens: int | None = None
    mamba: bool = False
    mamba_slots: int | None = Field(None, description="max_mamba_cache_size of the Mamba pool line")
    mamba_conv_gib: float | None = None
    mamba_ssm_gib: float | None = None
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    chunked_prefill_size: int | None = None
    available_gpu_mem_gib: float | None = Field(None, description="scheduler line: free after CUDA graphs")
    pool_end_free_gib: float | None = None
    sources: dict[str, str] = Field(default_factory=dict, description="field -> the log line it came from")

    @property
    def mem_fraction_static(self) -> float | None:
        return self.server_args.get("mem_fraction_static")

    @property
    def page_size(self) -> int:
        return self.server_args.get("page_size") or 1

    @property
    def pool_gib(self) -> float | None:
        """The pool's buffers as printed: K + V, or the MLA latent."""
        if self.kv_size_gib is not None:
            return self.kv_size_gib
        if self.k_size_gib is not None and self.v_size_gib is not None:
            return self.k_size_gib + self.v_size_gib
        return None

    @property
    def has_pool_lines(self) -> bool:
        return self.pool_gib is not None or self.max_total_num_tokens is not None or self.pool_tokens is not None


def parse_server_args(line: str) -> dict[str, Any]:
    """The ``_ARG_KEYS`` fields of a ``server_args=ServerArgs(k=v, ...)`` or ``server_args={'k': v, ...}`` line."""
    out: dict[str, Any] = {}
    for key, kind in _ARG_KEYS.items():
        m = re.search(r"(?<![\w'])'?" + key + r"'?(?:=|: )" + _VALUE, line)
        if not m or m.group(1) == "None":
            continue
        raw = m.group(1)
        try:
            if kind is bool:
                out[key] = raw == "True"
            elif kind is str:
                out[key] = raw[1:-1] if raw[:1] in "'\"" else raw
            else:
                out[key] = kind(raw)
        except ValueError:
            continue
    return out


def parse_launch_flags(line: str) -> dict[str, Any]:
    """The ``_ARG_KEYS`` fields a ``python -m sglang.launch_server --tp 4 ...`` command line gives."""
    out: dict[str, Any] = {}
    words = line.split()
    for i, word in enumerate(words):
        flag, _, inline = word.partition("=")
        if flag in _BOOL_FLAGS:
            out[_BOOL_FLAGS[flag]] = True
        elif flag in _FLAGS and (inline or i + 1 < len(words)):
            key, raw = _FLAGS[flag], inline or words[i + 1]
            try:
                out[key] = _ARG_KEYS[key](raw.strip("'\"`"))
            except ValueError:
                continue
    return out


def last_start(lines: list[str]) -> list[str]:
    """The lines of the log's last start-up: from its last ``server_args=`` line, when it has one."""
    starts = [i for i, line in enumerate(lines) if _SERVER_ARGS.search(line)]
    return lines[starts[-1]:] if starts else lines


def parse_sglang_log(text: str) -> SglangStartup:
    """Parse an SGLang start-up log (any release from 0.4 to 0.5.23)."""
    lines = last_start([redact(line) for line in text.splitlines()])
    found: dict[str, Any] = {}
    sources: dict[str, str] = {}
    ranks: set[str] = set()
    pools_of_rank: dict[str, int] = {}
    pool_seen = False
    before: list[tuple[float, str]] = []
    after: list[tuple[float, float, str]] = []

    def put(field: str, value: Any, line: str, *, first: bool = False) -> None:
        if value is None or (first and field in found):
            return
        found[field] = value
        sources[field] = line.strip()[:400]

    for line in lines:
        rank_m = _RANK.search(line)
        rank = rank_m.group(1).strip() if rank_m else ""
        if rank:
            ranks.add(rank)
        if (m := _SERVER_ARGS.search(line)) is not None:
            put("server_args", parse_server_args(line[m.start():]), line)
        if _LAUNCH.search(line) and "server_args" not in found:  # the resolved server_args win over the command
            flags = parse_launch_flags(line)
            if flags:
                put("launch_flags", flags, line, first=True)
        if (m := _VERSION.search(line)) is not None or (m := _DOCKER_VERSION.search(line)) is not None:
            put("sglang_version", m.group(1), line)
        if (m := _GPU.match(line)) is not None and "Compute Capability" not in line:
            put("gpu", m.group(2).strip(), line, first=True)
            put("gpu_count", len([x for x in m.group(1).split(",") if x]), line, first=True)
        if (m := _LOAD_BEGIN.search(line)) is not None:
            before.append((float(m.group(1)), line))
        if (m := _LOAD_END.search(line)) is not None:
            put("model_class", m.group(1), line, first=True)
            put("model_dtype", m.group(2), line, first=True)
            after.append((float(m.group(3)), float(m.group(4)), line))
        if (m := _KV_DTYPE.search(line)) is not None:
            put("kv_cache_dtype", m.group(1), line, first=True)
        if (m := _KV_LINE.search(line)) is not None:
            seen = pools_of_rank.get(rank, 0)
            pools_of_rank[rank] = seen + 1
            if seen == 0 and not pool_seen:  # the first pool line: the target model's
                pool_seen = True
                label = (m.group(1) or "").strip()
                put("pool_label", label or None, line)
                put("kv_cache_dtype", m.group(2), line)
                put("pool_tokens", int(m.group(3)) if m.group(3) else None, line)
                put("k_size_gib", float(m.group(4)) if m.group(4) else None, line)
                put("v_size_gib", float(m.group(5)) if m.group(5) else None, line)
                put("kv_size_gib", float(m.group(6)) if m.group(6) else None, line)
        if (m := _SWA.search(line)) is not None:
            put("swa_full_tokens", int(m.group(1)), line, first=True)
            put("swa_tokens", int(m.group(2)), line, first=True)
        if (m := _MAMBA.search(line)) is not None:
            put("mamba", True, line, first=True)
            if m.group(1):
                put("mamba_slots", int(m.group(1)), line, first=True)
                put("mamba_conv_gib", float(m.group(2)), line, first=True)
                put("mamba_ssm_gib", float(m.group(3)), line, first=True)
        if (m := _SCHEDULER.search(line)) is not None:
            put("max_total_num_tokens", int(m.group(1)), line, first=True)
            put("chunked_prefill_size", int(m.group(2)) if m.group(2) else None, line, first=True)
            put("max_running_requests", int(m.group(4)), line, first=True)
            put("context_len", int(m.group(5)), line, first=True)
            put("available_gpu_mem_gib", float(m.group(6)) if m.group(6) else None, line, first=True)
        m = _POOL_END.search(line)
        if m is not None and float(m.group(1)) < found.get("pool_end_free_gib", float("inf")):
            put("pool_end_free_gib", float(m.group(1)), line)
    if before:  # SGLang sizes with the minimum over ranks (`get_available_gpu_memory(distributed=True)`)
        value, line = min(before)
        put("free_before_load_gib", value, line)
    if after:
        free, used, line = min(after)
        put("free_after_load_gib", free, line)
        put("weights_gib", used, line)
    flags = found.pop("launch_flags", None)
    if flags and "server_args" not in found:
        found["server_args"] = flags
        sources["server_args"] = sources.pop("launch_flags")
    if "model" not in found and found.get("server_args", {}).get("model_path"):
        found["model"] = found["server_args"]["model_path"]
        sources["model"] = sources["server_args"]
    # A sliding-window pool prints two lines a rank, its SWA and full layers' (`SWAKVPool`, swa_memory_pool.py@0.5.8.post1)
    own = 2 if "swa_full_tokens" in found else 1
    found["draft_pools"] = max(0, max(pools_of_rank.values(), default=0) - own)
    return SglangStartup(ranks=len(ranks), sources=sources, **found)


def looks_like_sglang(text: str) -> int:
    """How many of SGLang's own start-up lines the text holds (0: none)."""
    return sum(bool(p.search(text)) for p in (_SERVER_ARGS, _LOAD_END, _KV_LINE, _SCHEDULER, _POOL_END, _SWA))


__all__ = ["KEYWORDS", "SglangStartup", "looks_like_sglang", "parse_launch_flags", "parse_server_args", "parse_sglang_log"]
