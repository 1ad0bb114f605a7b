"""Read what a vLLM engine printed at start-up: version, model, settings and KV capacity.

Pure text in, a pydantic ``StartupReport`` out; no I/O, no vLLM import. Used by
``kvplan check-log`` (compare with the plan) and by ``kvplan bench`` (read the engine's
capacity back from its log).

Stable API
----------
``parse_startup_log(text: str) -> StartupReport``
    Never raises on odd text: fields the log does not show are ``None``. Lines may carry
    vLLM's prefixes (``(EngineCore pid=1) INFO 11-30 23:11:26 [core.py:133] ...``) and ANSI
    colours; quotes condensed onto one line (``... / ...``) work too.
``StartupReport`` fields (all optional unless said):
    - ``vllm_version`` (``"0.11.0rc2.dev98+g393de22d2"``, as printed), ``engine`` (``"v0"``/``"v1"``),
      ``platform`` (``"GPU"``, ``"CPU"``, ``"XPU"``...), ``kv_pool`` (the pool name printed before
      "KV cache size": ``"GPU"``, ``"CPU"``, ``"GPU + host"``)
    - ``model`` (path or id as vLLM printed it), ``non_default_args`` (dict, always present)
    - settings: ``max_model_len``, ``gpu_memory_utilization``, ``tensor_parallel_size``,
      ``pipeline_parallel_size``, ``block_size``, ``kv_cache_dtype``, ``dtype``, ``max_num_seqs``,
      ``max_num_batched_tokens``, ``enforce_eager``, ``num_gpu_blocks_override``,
      ``kv_cache_memory_bytes``, ``enable_prefix_caching``, ``quantization``
    - reported: ``weights_gib``, ``available_kv_gib``, ``total_memory_gib``, ``num_gpu_blocks``
      (after any override), ``num_gpu_blocks_before_override``, ``num_cpu_swap_blocks`` (V0),
      ``kv_cache_tokens``, ``max_concurrency``, ``max_concurrency_tokens`` (its L),
      ``padding_layers``
    - failure: ``failed``, ``estimated_max_model_len``, ``kv_needed_gib``, ``failure_message``
    - ``sources``: field name -> the log line (trimmed) it was read from.
When a line repeats (one per worker, or several start-ups in one file) the last one wins.

Formats read (vLLM source, see docs/vllm-accounting.md section 5):
    - ``Initializing a V1 LLM engine (v0.11.0) with config: model='...', ..., max_seq_len=4096, ...``
      (``vllm/v1/engine/core.py``; V0: ``Initializing an LLM engine (v0.6.3) with config: ...``)
    - ``non-default args: {...}`` (``entrypoints/serve/utils/api_utils.py@0.32``, ``entrypoints/utils.py``)
    - ``Using max model len N`` (``config/model.py``); ``version 0.32.0`` in the start-up banner
    - ``Model loading took X GiB [memory] and S seconds`` (V1 ``gpu_model_runner.py``), ``Model loading
      took X GB`` / ``Loading model weights took X GB`` (V0 ``worker/model_runner.py``; GB there is GiB)
    - ``Available KV cache memory: X GiB`` (V1 ``gpu_worker.py``); with 0.34's extensible KV cache that is the
      reservation before warmup, and ``Memory after warmup: ...; N KV cache blocks (X GiB) fit within the
      requested Y GiB. ...`` (``v1/worker/extensible_kv_cache.py@0.34.0``) gives the pool; V0 ``Memory profiling results:
      total_gpu_memory=XGiB ... kv_cache_size=XGiB gpu_memory_utilization=0.90`` and ``... the rest of
      the memory reserved for KV Cache is XGiB``; CPU ``Explicitly set (X/Y) GiB for KV cache`` or
      ``Auto set (X/Y) GiB for KV cache`` (``v1/worker/cpu_worker.py@0.32``)
    - V0 ``# GPU blocks: N, # CPU blocks: M`` / ``# cuda blocks: N, # CPU blocks: M`` (``executor_base.py``);
      ``Overriding num_gpu_blocks=N with num_gpu_blocks_override=M``; ``num_gpu_blocks is: N``
    - ``GPU KV cache size: N tokens`` and ``Maximum concurrency for L tokens per request: X.XXx``, on two
      lines (0.8-0.22) or one (0.28-0.34: ``GPU KV cache size: N tokens, Maximum concurrency ...``); the CPU
      build prints ``CPU KV cache size``, HiSparse ``GPU + host KV cache size``
    - ``Add N padding layers`` (hybrid KV groups)
    - failures: ``... the estimated maximum model length is N`` with ``(X GiB KV cache is needed, which is
      larger than the available KV cache memory (Y GiB)`` (``v1/core/kv_cache_utils.py``), V0 ``The
      model's max seq len (L) is larger than the maximum number of tokens that can be stored in KV cache (N)``
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from pydantic import BaseModel, Field

from kvplan.errors import KvplanError
from kvplan.model.encoders import MAX_MM_PIXELS
from kvplan.paths import iter_user_lines
from kvplan.units import parse_bytes
from kvplan.vllm.rules import parse_version

_ANSI_RE = re.compile(r"\x1b\[[0-9;]{0,32}[A-Za-z]")
# Bounded digit runs that cannot start inside a longer number: every pattern stays linear on a line
# of digits, and a 4000-digit "number" is not read at all (instead of overflowing int()).
_NUM = r"(?<![\d,])(\d{1,3}(?:,\d{3}){1,6}|\d{1,18})(?![\d,]?\d)"  # thousands separators from vLLM 0.8 on
_FLOAT = r"(?<![\d.])(-?\d{1,18}(?:\.\d{1,18})?)(?![\d.]?\d)"
MAX_LINE = 64 * 1024  # characters of one log line that are read (vLLM's longest lines are a few KB)
MAX_KEPT_LINES = 4000  # relevant lines kept from a huge log (the last ones: the last start-up wins)

# A line is worth parsing only when it holds one of these (a 100 MB log keeps a few lines).
_KEYWORDS = (
    "LLM engine", "version", "non-default args", "max model len", "detected platform", "took",
    "KV cache", "kv_cache_size", "total_gpu_memory", "model weights take", "gpu_memory_utilization",
    "blocks", "num_gpu_blocks", "Maximum concurrency", "padding layers", "maximum model length",
    "max seq len", "maximum number of tokens",
)
KEYWORDS = _KEYWORDS  # public: `kvplan check-log` keeps these lines too when it reads a log of any engine

# --- secrets ---------------------------------------------------------------------------------------
_SECRET_NAMES = r"(?:api[-_]?key|hf[-_]?token|access[-_]?token|auth[-_]?token|secret(?:[-_]?key)?|password|passwd|token)"
_SECRET_PATTERNS = (
    # user:password@ in URLs
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]{0,15}://)[^/\s:@'\"]{1,256}(?::[^/\s@'\"]{0,256})?@"), r"\1***@"),
    # --api-key X, --hf-token=X, --token X (not --max-num-batched-tokens)
    (re.compile(r"(?i)(--?(?:[\w\-]{0,40}[-_])?" + _SECRET_NAMES + r")(=|\s{1,8})(?!\*\*\*)[^\s'\",]{1,4096}"), r"\1\2***"),
    # 'api_key': ['X'], hf_token='X', "token": "X", api_key=X
    (re.compile(r"(?i)(['\"]?\b(?:[\w]{0,40}_)?" + _SECRET_NAMES + r"['\"]?\s{0,4}[:=]\s{0,4}\[?\s{0,4})(['\"]?)"
                r"(?!\*\*\*|None\b|null\b)[^'\"\s,}\]\)]{1,4096}"), r"\1\2***"),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,200}"), "hf_***"),
    (re.compile(r"(?i)\b(Bearer|Basic)\s{1,4}[A-Za-z0-9._~+/=\-]{4,4096}"), r"\1 ***"),
)


def redact(text: str) -> str:
    """``text`` with secrets masked: URL credentials, ``--api-key``/``--hf-token`` style arguments,
    ``api_key=``/``hf_token:`` values, Hugging Face tokens and bearer tokens become ``***``."""
    if not isinstance(text, str) or not text:
        return text
    for pattern, repl in _SECRET_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact_data(value: Any) -> Any:
    """``redact`` applied to every string in JSON-like data (keys named like secrets mask their value)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, str) and re.fullmatch(r"(?i)(?:[\w\-]{0,40}[-_])?" + _SECRET_NAMES, k) and v not in (None, "", False):
                out[k] = "***"
            else:
                out[k] = redact_data(v)
        return out
    if isinstance(value, (list, tuple)):
        items = []
        after_flag = False  # ["--api-key", "K"]: the value after a secret flag
        for v in value:
            items.append("***" if after_flag and isinstance(v, str) else redact_data(v))
            after_flag = isinstance(v, str) and re.fullmatch(r"(?i)--?(?:[\w\-]{0,40}[-_])?" + _SECRET_NAMES, v) is not None
        return items if isinstance(value, list) else tuple(items)
    return value


def relevant_lines(lines, max_line: int = MAX_LINE, keep: int = MAX_KEPT_LINES) -> str:
    """The lines of a log that any pattern here can use, each cut to ``max_line`` characters, the
    last ``keep`` of them: bounded memory and linear time whatever the log holds."""
    from collections import deque

    kept: deque[str] = deque(maxlen=keep)
    for line in lines:
        if len(line) > max_line:
            line = line[:max_line]
        if any(word in line for word in _KEYWORDS):
            kept.append(line.rstrip("\r\n"))
    return "\n".join(kept)


def read_startup_log(path: str, what: str = "log") -> str:
    """The parseable part of a log file, streamed (a 100 MB log is read in bounded memory); the file
    must be a regular file (never a device or FIFO). Errors are KvplanError naming the file."""

    return relevant_lines(iter_user_lines(path, what, max_line=MAX_LINE))


class StartupReport(BaseModel):
    """What one vLLM start-up log says. ``None``: the log does not show it."""

    vllm_version: str | None = None
    engine: str | None = Field(None, description='"v0" (legacy engine) or "v1"')
    platform: str | None = Field(None, description='"GPU", "CPU", ... (the device the KV cache lives on)')
    kv_pool: str | None = Field(None, description='pool name before "KV cache size": GPU, CPU, "GPU + host"')
    model: str | None = None
    non_default_args: dict[str, Any] = Field(default_factory=dict)
    # Settings (effective where the config dump shows them, else as the user passed them).
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    decode_context_parallel_size: int | None = Field(None, description="--decode-context-parallel-size (DCP)")
    block_size: int | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool | None = None
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool | None = None
    quantization: str | None = None
    # Multimodal: what the profile run's encoder pass depends on (kvplan.model.encoders).
    language_model_only: bool | None = Field(None, description="--language-model-only, or every modality limit 0")
    skip_mm_profiling: bool | None = None
    mm_max_pixels: int | None = Field(None, description="--mm-processor-kwargs max_pixels")
    kv_offloading_size: float | None = Field(None, description="--kv-offloading-size GiB (the CPU offload tier)")
    kv_offloading_backend: str | None = Field(None, description="--kv-offloading-backend (native, lmcache)")
    speculative_config: dict[str, Any] | None = Field(
        None, description="--speculative-config as the log shows it (the engine's resolved method, else as given)")
    # Reported numbers.
    weights_gib: float | None = Field(None, description="Model loading took X GiB (per device)")
    available_kv_gib: float | None = Field(None, description="Available KV cache memory (per device)")
    total_memory_gib: float | None = Field(None, description="device total vLLM started from, when printed")
    num_gpu_blocks: int | None = Field(None, description="blocks in the KV pool, after any override")
    num_gpu_blocks_before_override: int | None = None
    num_cpu_swap_blocks: int | None = Field(None, description='V0 "# CPU blocks" (swap space)')
    kv_cache_tokens: int | None = Field(None, description='"KV cache size: N tokens"')
    max_concurrency: float | None = Field(None, description='"Maximum concurrency for L tokens per request: X"')
    max_concurrency_tokens: int | None = Field(None, description="the L of that line")
    padding_layers: int | None = None
    # Failure to start because max_model_len does not fit.
    failed: bool = False
    estimated_max_model_len: int | None = None
    kv_needed_gib: float | None = None
    failure_message: str | None = None
    sources: dict[str, str] = Field(default_factory=dict, description="field -> the log line it came from")

    @property
    def has_capacity(self) -> bool:
        """The log reports the KV pool (blocks, tokens or concurrency)."""
        return any(v is not None for v in (self.num_gpu_blocks, self.kv_cache_tokens, self.max_concurrency))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _line_of(text: str, pos: int, whole: bool = False, limit: int = 240) -> str:
    """The log text from ``pos`` (or the whole line) to the end of its line, trimmed."""
    start = text.rfind("\n", 0, pos) + 1 if whole else pos
    end = text.find("\n", pos)
    line = text[start : end if end >= 0 else len(text)].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _smallest_of_last_start(pattern: re.Pattern[str], text: str, group: int = 1) -> re.Match[str] | None:
    """The match of the smallest figure (``group``) among those of the last start-up: every TP / PP worker prints
    its own "Available KV cache memory" ("(Worker_TP1 pid=...) ..."), and up to 0.11.0 the engine its "GPU KV cache
    size" and "Maximum concurrency" once per rank from that rank's memory (``capacity_logged_per_rank``); the
    engine gives every rank the blocks of the smallest ("Change the num_blocks of each rank to the smallest among
    all ranks", ``get_kv_cache_configs``, v1/core/kv_cache_utils.py@0.32.0). The last start-up: the lines after
    the last engine banner before the last match (a log of several starts keeps only the last one's)."""
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    starts = [b.start() for b in _ENGINE_INIT.finditer(text, 0, matches[-1].start())]
    starts += [b.start() for b in _BANNER_VERSION.finditer(text, 0, matches[-1].start())]
    since = max(starts, default=-1)
    return min((m for m in matches if m.start() > since), key=lambda m: float(m.group(group).replace(",", "")))


# --- patterns -------------------------------------------------------------------------------

# "Initializing an LLM engine (v0.6.3)" (V0 to 0.6), "a V0 LLM engine (v0.7.3)" (V0 in 0.6.5-0.10),
# "a V1 LLM engine (v0.8.3)" (vllm/v1/engine/core.py).
_ENGINE_INIT = re.compile(r"Initializing an? (V[01] )?LLM engine \(v([^)\s]+)\)(?: with config:)? ?(.*)")
_BANNER_VERSION = re.compile(r"(?:vLLM API server version|█\s+version)\s+v?(\d+\.\d+[\w.+\-]*)")
_NON_DEFAULT = re.compile(r"non-default args: ?\{")
_USING_MAX_LEN = re.compile(r"Using max model len " + _NUM)
_PLATFORM = re.compile(r"Automatically detected platform (\w+)\.")

_WEIGHTS = re.compile(r"(?:Model loading took|Loading model weights took) " + _FLOAT + r" ?(GiB|GB)")
_AVAILABLE_V1 = re.compile(r"Available KV cache memory: " + _FLOAT + r" ?GiB")
# 0.34's extensible KV cache, after warmup (v1/worker/extensible_kv_cache.py@0.34.0 `measure_kv_cache_blocks`):
# "...; %d KV cache blocks (%s GiB) fit within the requested %s GiB."
_AFTER_WARMUP = re.compile(r"Memory after warmup: [^;]{0,400}; " + _NUM + r" KV cache blocks \(" + _FLOAT
                           + r" ?GiB\) fit within")
_AVAILABLE_V0_REST = re.compile(r"the rest of the memory reserved for KV Cache is " + _FLOAT + r" ?GiB")
_V0_PROFILE_TOTAL = re.compile(r"total_gpu_memory ?[=(] ?" + _FLOAT + r" ?GiB")
_V0_KV_SIZE = re.compile(r"\bkv_cache_size=" + _FLOAT + r" ?GiB")
_V0_MODEL_WEIGHTS_TAKE = re.compile(r"model weights take " + _FLOAT + r" ?GiB")
_V0_UTIL = re.compile(r"gpu_memory_utilization ?[=(] ?" + _FLOAT)
_CPU_KV_SET = re.compile(r"(Explicitly|Auto) set \(" + _FLOAT + r"/" + _FLOAT + r"\) GiB for KV cache")

_V0_BLOCKS = re.compile(r"#? ?(?<!\w)(\w{1,16}) blocks: " + _NUM + r", # CPU blocks: " + _NUM)
# (?!,?\d) stops the match from backtracking into a shorter prefix of "7,290" when the V0 tail follows.
_V1_GPU_BLOCKS = re.compile(r"# GPU blocks: " + _NUM + r"(?!,?\d)(?!, # CPU)")
_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=" + _NUM + r" with num_gpu_blocks_override=" + _NUM)
_NUM_GPU_BLOCKS_IS = re.compile(r"num_gpu_blocks is: " + _NUM)
_KV_TOKENS = re.compile(r"(?:\b([A-Z]{2,4}(?: \+ host)?) )?KV cache size: " + _NUM + r" tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _FLOAT + r"x")
_PADDING = re.compile(r"Add (\d{1,9}) padding layers")

_EST_MAX_LEN = re.compile(r"the estimated maximum model length is " + _NUM)
_MAX_SEQ_LEN_FAIL = re.compile(r"max seq len \(" + _NUM + r"\)")
_KV_NEEDED = re.compile(
    _FLOAT + r" ?GiB KV cache is needed, which is larger than the available KV cache memory \(" + _FLOAT + r" ?GiB\)"
)
_V0_TOKENS_FAIL = re.compile(r"maximum number of tokens that can be stored in KV cache \(" + _NUM + r"\)")

# Keys of the engine config dump (VllmConfig.__str__, config/vllm.py) -> report field.
_CONFIG_KEYS: dict[str, tuple[str, str]] = {
    "max_seq_len": ("max_model_len", r"(\d{1,18})(?!\d)"),
    "tensor_parallel_size": ("tensor_parallel_size", r"(\d{1,9})(?!\d)"),
    "pipeline_parallel_size": ("pipeline_parallel_size", r"(\d{1,9})(?!\d)"),
    "decode_context_parallel_size": ("decode_context_parallel_size", r"(\d{1,9})(?!\d)"),
    "kv_cache_dtype": ("kv_cache_dtype", r"([\w.]+)"),
    "dtype": ("dtype", r"([\w.]+)"),
    "enforce_eager": ("enforce_eager", r"(True|False)"),
    "quantization": ("quantization", r"([\w\-]+)"),
    "enable_prefix_caching": ("enable_prefix_caching", r"(True|False)"),
    "device_config": ("platform", r"([\w:]+)"),
}

# Engine arguments in "non-default args" -> report field (same names as vLLM's EngineArgs).
_ARG_FIELDS = (
    "max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "pipeline_parallel_size", "block_size",
    "kv_cache_dtype", "dtype", "max_num_seqs", "max_num_batched_tokens", "enforce_eager",
    "num_gpu_blocks_override", "kv_cache_memory_bytes", "enable_prefix_caching", "quantization",
    "decode_context_parallel_size", "kv_offloading_size", "kv_offloading_backend",
)


def multimodal_settings(args: dict[str, Any]) -> dict[str, Any]:
    """The multimodal engine arguments kvplan plans with, from vLLM's "non-default args": the towers are
    not built with ``language_model_only`` or when every ``limit_mm_per_prompt`` modality is 0
    (``MultiModalConfig.get_limit_per_prompt``, config/multimodal.py@0.32.0; a limit is a count or
    ``{"count": N, ...}``); ``mm_processor_kwargs`` may set the largest image (``max_pixels``)."""
    out: dict[str, Any] = {}
    limits = args.get("limit_mm_per_prompt")
    if args.get("language_model_only") is True:
        out["language_model_only"] = True
    elif isinstance(limits, dict) and limits:
        counts = [v.get("count") if isinstance(v, dict) else v for v in limits.values()]
        if all(c == 0 and not isinstance(c, bool) for c in counts):
            out["language_model_only"] = True
    if isinstance(args.get("skip_mm_profiling"), bool):
        out["skip_mm_profiling"] = args["skip_mm_profiling"]
    kwargs = args.get("mm_processor_kwargs")
    pixels = kwargs.get("max_pixels") if isinstance(kwargs, dict) else None
    if isinstance(pixels, int) and not isinstance(pixels, bool) and 0 < pixels <= MAX_MM_PIXELS:
        out["mm_max_pixels"] = pixels
    return out


def _balanced_braces(text: str, start: int) -> str | None:
    """The ``{...}`` starting at ``text[start]``, honouring quotes; None if unclosed."""
    depth, quote, i = 0, "", start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        elif ch == "\n":
            return None
        i += 1
    return None


_PAIR_RE = re.compile(r"'(\w{1,64})': ('(?:[^'\\]|\\.)*'|\"[^\"]*\"|True|False|None|-?\d+(?:\.\d+)?(?:e-?\d+)?)")


def parse_non_default_args(body: str) -> dict[str, Any]:
    """``{'model': 'x', 'max_model_len': 512}`` -> dict; falls back to simple pairs when the dict
    holds reprs that are not Python literals (config objects, enums)."""
    try:
        value = ast.literal_eval(body)
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    out: dict[str, Any] = {}
    for key, raw in _PAIR_RE.findall(body):
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def _coerce(field: str, value: Any) -> Any:
    """A non-default arg value as the report field's type, or None when it is not usable."""
    if value is None:
        return None
    if field in ("enforce_eager", "enable_prefix_caching"):
        return value if isinstance(value, bool) else None
    if field in ("gpu_memory_utilization", "kv_offloading_size"):
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if field in ("kv_cache_dtype", "dtype", "quantization", "kv_offloading_backend"):
        return str(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.replace(",", "").isdigit():
        return int(value.replace(",", ""))
    if field == "kv_cache_memory_bytes" and isinstance(value, str):
        try:
            return parse_bytes(value)
        except KvplanError:
            return None
    return None


def _platform_name(device: str) -> str:
    device = device.split(":")[0].lower()
    return "GPU" if device in ("cuda", "gpu", "rocm") else device.upper()


def _engine_from(version: str | None, text: str) -> str | None:
    """V1-only lines say V1; else the release (the V1 engine is the default from 0.8)."""
    if _AVAILABLE_V1.search(text) or _KV_TOKENS.search(text):
        return "v1"
    if version:
        try:
            return "v0" if parse_version(version) < (0, 8, 0) else "v1"
        except KvplanError:
            return None
    return None


def speculative_from_args(args: dict[str, Any]) -> dict[str, Any] | None:
    """The speculative config of a log's non-default args: ``speculative_config`` as given (a dict, or its
    JSON text), or the shorthand ``--spec-method`` / ``--spec-model`` / ``--spec-tokens`` vLLM merges into it
    (`EngineArgs.create_speculative_config`, engine/arg_utils.py@0.32.0)."""
    given = args.get("speculative_config")
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except ValueError:
            given = None
    doc = dict(given) if isinstance(given, dict) else {}
    for flag, key in (("spec_method", "method"), ("spec_model", "model"), ("spec_tokens", "num_speculative_tokens")):
        if args.get(flag) is not None:
            doc.setdefault(key, args[flag])
    return doc or None


_SPEC_REPR = re.compile(r"(?<![\w])speculative_config=SpeculativeConfig\(([^)]*)\)")


def speculative_from_dump(dump: str) -> dict[str, Any] | None:
    """The engine's resolved speculative config from its config dump:
    ``speculative_config=SpeculativeConfig(method='mtp', model='...', num_spec_tokens=3)``
    (`SpeculativeConfig.__repr__`, config/speculative.py@0.32.0), the MTP aliases already folded."""
    m = _SPEC_REPR.search(dump)
    if not m:
        return None
    body = m.group(1)
    method = re.search(r"method='([^']+)'", body)
    tokens = re.search(r"num_spec_tokens=(\d+)", body)
    model = re.search(r"model='((?:[^'\\]|\\.)*)'", body)
    if not (method and tokens):
        return None
    doc: dict[str, Any] = {"method": method.group(1), "num_speculative_tokens": int(tokens.group(1))}
    if model:
        doc["model"] = model.group(1)
    return doc


class _Found:
    """What a start-up log says so far: each field, and the (redacted) line it came from. A later reader's
    value replaces an earlier one's: the readers run from the lowest precedence up."""

    def __init__(self, text: str):
        self.text = text
        self.fields: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def put(self, field: str, value: Any, pos: int) -> None:
        if value is None:
            return
        self.fields[field] = redact(value) if isinstance(value, str) else value
        self.sources[field] = redact(_line_of(self.text, pos))


def _read_non_default_args(found: _Found) -> dict[str, Any]:
    """The settings the user passed (``non-default args: {...}``): the lowest precedence."""
    text = found.text
    args: dict[str, Any] = {}
    m = _last(_NON_DEFAULT, text)
    if m:
        body = _balanced_braces(text, m.end() - 1)
        if body is None:  # unclosed (a cut log line): take what is there
            end = text.find("\n", m.end())
            body = text[m.end() - 1 : end if end >= 0 else len(text)]
        args = parse_non_default_args(body)
        for field in _ARG_FIELDS:
            found.put(field, _coerce(field, args.get(field)), m.start())
        model = args.get("model") or args.get("model_tag")
        if isinstance(model, str):
            found.put("model", model, m.start())
        for field, value in multimodal_settings(args).items():
            found.put(field, value, m.start())
        spec = speculative_from_args(args)
        found.put("speculative_config", redact_data(spec) if spec else None, m.start())
    return args


def _read_banner(found: _Found) -> None:
    """The release banner, the max_model_len vLLM settled on, the platform."""
    text = found.text
    m = _last(_BANNER_VERSION, text)
    if m:
        found.put("vllm_version", m.group(1), m.start())
    m = _last(_USING_MAX_LEN, text)
    if m:
        found.put("max_model_len", _int(m.group(1)), m.start())
    m = _last(_PLATFORM, text)
    if m:
        found.put("platform", _platform_name(m.group(1)), m.start())


def _read_engine_config(found: _Found) -> None:
    """The engine's own config dump (``Initializing a V1 LLM engine ... with config: ...``)."""
    text = found.text
    m = _last(_ENGINE_INIT, text)
    if m:
        found.put("vllm_version", m.group(2), m.start())
        found.put("engine", "v1" if m.group(1) == "V1 " else "v0", m.start())
        dump = m.group(3)
        spec = speculative_from_dump(dump)
        if spec:  # the engine's resolved method and K, over what was given
            found.put("speculative_config", redact_data({**(found.fields.get("speculative_config") or {}), **spec}), m.start())
        mm = re.search(r"(?<![\w])model='((?:[^'\\]|\\.)*)'", dump)
        if mm:
            found.put("model", mm.group(1), m.start())
        for key, (field, value_re) in _CONFIG_KEYS.items():
            km = re.search(r"(?<![\w])" + key + "=" + value_re, dump)
            if not km:
                continue
            raw = km.group(1)
            if field == "platform":
                found.put(field, _platform_name(raw), m.start())
            elif raw in ("True", "False"):
                found.put(field, raw == "True", m.start())
            elif raw == "None":
                continue
            elif raw.isdigit():
                found.put(field, int(raw), m.start())
            else:
                found.put(field, raw.removeprefix("torch."), m.start())


def _read_memory(found: _Found) -> None:
    """Weights and memory."""
    text = found.text
    m = _last(_WEIGHTS, text)
    if m or (m := _last(_V0_MODEL_WEIGHTS_TAKE, text)) is not None:
        found.put("weights_gib", float(m.group(1)), m.start())
    m = _last(_V0_PROFILE_TOTAL, text)
    if m:
        found.put("total_memory_gib", float(m.group(1)), m.start())
    if "gpu_memory_utilization" not in found.fields:
        m = _last(_V0_UTIL, text)
        if m:
            found.put("gpu_memory_utilization", float(m.group(1)), m.start())
    for pattern in (_V0_KV_SIZE, _AVAILABLE_V0_REST):
        m = _last(pattern, text)
        if m:
            found.put("available_kv_gib", float(m.group(1)), m.start())
    m = _smallest_of_last_start(_AVAILABLE_V1, text)
    if m:
        found.put("available_kv_gib", float(m.group(1)), m.start())
    # With the extensible KV cache (0.34+, CUDA) "Available KV cache memory" is the reservation before warmup;
    # the pool is what each rank measures after it, and the engine keeps the smallest rank's blocks
    # (`_min_across_ranks`, v1/worker/gpu_worker.py@0.34.0).
    m = _smallest_of_last_start(_AFTER_WARMUP, text)
    if m:
        found.put("available_kv_gib", float(m.group(2)), m.start())
        found.put("num_gpu_blocks", _int(m.group(1)), m.start())
    m = _last(_CPU_KV_SET, text)
    if m:
        found.put("available_kv_gib", float(m.group(2)), m.start())
        found.put("total_memory_gib", float(m.group(3)), m.start())
        found.put("platform", "CPU", m.start())


def _read_blocks(found: _Found) -> None:
    """Blocks."""
    text = found.text
    m = _last(_V0_BLOCKS, text)
    if m:
        found.put("num_gpu_blocks", _int(m.group(2)), m.start())
        found.put("num_cpu_swap_blocks", _int(m.group(3)), m.start())
        found.put("engine", found.fields.get("engine") or "v0", m.start())
        if "platform" not in found.fields:
            found.put("platform", _platform_name(m.group(1)), m.start())
    m = _last(_V1_GPU_BLOCKS, text)
    if m:
        found.put("num_gpu_blocks", _int(m.group(1)), m.start())
    m = _last(_NUM_GPU_BLOCKS_IS, text)
    if m:
        found.put("num_gpu_blocks", _int(m.group(1)), m.start())
    m = _last(_OVERRIDE, text)
    if m:
        found.put("num_gpu_blocks_before_override", _int(m.group(1)), m.start())
        found.put("num_gpu_blocks_override", _int(m.group(2)), m.start())
        if "num_gpu_blocks" not in found.fields:
            found.put("num_gpu_blocks", _int(m.group(2)), m.start())
    m = _last(_PADDING, text)
    if m:
        found.put("padding_layers", int(m.group(1)), m.start())


def _read_tokens(found: _Found) -> None:
    """Tokens and concurrency (two lines or one)."""
    text = found.text
    m = _smallest_of_last_start(_KV_TOKENS, text, group=2)
    if m:
        found.put("kv_cache_tokens", _int(m.group(2)), m.start())
        if m.group(1):
            found.put("kv_pool", m.group(1), m.start())
            found.put("platform", found.fields.get("platform") or _platform_name(m.group(1).split(" ")[0]), m.start())
    m = _smallest_of_last_start(_CONCURRENCY, text, group=2)
    if m:
        found.put("max_concurrency_tokens", _int(m.group(1)), m.start())
        found.put("max_concurrency", float(m.group(2)), m.start())
        if "max_model_len" not in found.fields:
            found.put("max_model_len", _int(m.group(1)), m.start())


def _read_failure(found: _Found) -> None:
    """A failed start-up: max_model_len does not fit."""
    text = found.text
    m = _last(_EST_MAX_LEN, text)
    if m:
        found.put("estimated_max_model_len", _int(m.group(1)), m.start())
    m = _last(_KV_NEEDED, text)
    if m:
        found.put("kv_needed_gib", float(m.group(1)), m.start())
        found.put("available_kv_gib", found.fields.get("available_kv_gib", float(m.group(2))), m.start())
    m = _last(_V0_TOKENS_FAIL, text)
    if m:
        found.put("kv_cache_tokens", found.fields.get("kv_cache_tokens", _int(m.group(1))), m.start())
    fail = _last(_KV_NEEDED, text) or _last(_V0_TOKENS_FAIL, text) or _last(_EST_MAX_LEN, text)
    if fail:
        found.fields["failed"] = True
        found.fields["failure_message"] = redact(_line_of(text, fail.start(), whole=True, limit=600))
        mm = _last(_MAX_SEQ_LEN_FAIL, text)
        if mm and "max_model_len" not in found.fields:
            found.put("max_model_len", _int(mm.group(1)), mm.start())


#: After the user's settings, in precedence order (a later reader overrides an earlier one).
_READERS = (_read_banner, _read_engine_config, _read_memory, _read_blocks, _read_tokens, _read_failure)


def parse_startup_log(text: str) -> StartupReport:
    """Parse a vLLM start-up log (any release from 0.6 to 0.34; GPU or CPU build)."""
    if len(text) > MAX_LINE or text.count("\n") > MAX_KEPT_LINES:
        text = relevant_lines(text.splitlines())
    text = _ANSI_RE.sub("", text.replace("\r\n", "\n"))
    found = _Found(text)
    args = _read_non_default_args(found)
    for read in _READERS:
        read(found)
    r = found.fields
    if r.get("engine") is None:
        r["engine"] = _engine_from(r.get("vllm_version"), text)
    r = {k: v for k, v in r.items() if v is not None}
    return StartupReport(non_default_args=redact_data(args), sources=found.sources, **r)


__all__ = ["StartupReport", "parse_startup_log", "parse_non_default_args", "read_startup_log", "redact", "redact_data"]
