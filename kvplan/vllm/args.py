"""vLLM's engine arguments: one typed record of them (``EngineArgs``, by vLLM's own names: the
``EngineArgs`` fields of vllm/engine/arg_utils.py), one table from those names to the flags ``vllm serve``
takes, and one writer. The ``vllm serve`` line kvplan prints and the command the bench launcher runs both
come from here, so they cannot disagree about a flag's spelling or form.

Every source converts through here: a plan's ``Settings`` (`engine_args`), a stored run.json or kvplan.yaml
entry (`EngineArgs.from_stored`), and back to ``Settings`` (kvplan.plan.schema.settings_from_engine_args)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.plan.schema import Settings

# (EngineArgs field, flag, form). "value": ``--flag V``. "switch": ``--flag`` when true.
# "bool": ``--flag`` / ``--no-flag`` (vLLM declares these with argparse's BooleanOptionalAction).
ENGINE_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("max_model_len", "--max-model-len", "value"),
    ("data_parallel_size", "--data-parallel-size", "value"),
    ("enable_expert_parallel", "--enable-expert-parallel", "switch"),
    ("tensor_parallel_size", "--tensor-parallel-size", "value"),
    ("pipeline_parallel_size", "--pipeline-parallel-size", "value"),
    ("kv_cache_memory_bytes", "--kv-cache-memory-bytes", "value"),
    ("gpu_memory_utilization", "--gpu-memory-utilization", "value"),
    ("kv_cache_dtype", "--kv-cache-dtype", "value"),
    ("block_size", "--block-size", "value"),
    ("num_gpu_blocks_override", "--num-gpu-blocks-override", "value"),
    ("max_num_seqs", "--max-num-seqs", "value"),
    ("max_num_batched_tokens", "--max-num-batched-tokens", "value"),
    ("enforce_eager", "--enforce-eager", "switch"),
    ("language_model_only", "--language-model-only", "switch"),
    ("mm_processor_kwargs", "--mm-processor-kwargs", "value"),
    ("skip_mm_profiling", "--skip-mm-profiling", "switch"),
    ("disable_hybrid_kv_cache_manager", "--disable-hybrid-kv-cache-manager", "switch"),
    ("enable_prefix_caching", "--enable-prefix-caching", "bool"),
    ("async_scheduling", "--async-scheduling", "bool"),
    ("mamba_ssm_cache_dtype", "--mamba-ssm-cache-dtype", "value"),
    ("decode_context_parallel_size", "--decode-context-parallel-size", "value"),
    ("speculative_config", "--speculative-config", "value"),
    ("kv_offloading_size", "--kv-offloading-size", "value"),
    ("kv_offloading_backend", "--kv-offloading-backend", "value"),
)
ENGINE_FIELDS = frozenset(field for field, _, _ in ENGINE_FLAGS)


@dataclass(frozen=True, kw_only=True)
class EngineArgs:
    """The vLLM engine arguments kvplan writes, by vLLM's names; ``None`` leaves vLLM's default. One field per
    row of ENGINE_FLAGS, in its order (checked below, at import). The bench's EngineConfig carries one beside
    its launch facts; a plan's Settings gives one (`engine_args`)."""

    max_model_len: int | None = None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool | None = None
    language_model_only: bool | None = None
    mm_processor_kwargs: dict[str, int] | None = None  # vLLM's --mm-processor-kwargs, as given
    skip_mm_profiling: bool | None = None
    disable_hybrid_kv_cache_manager: bool | None = None
    enable_prefix_caching: bool | None = None
    async_scheduling: bool | None = None
    mamba_ssm_cache_dtype: str | None = None
    decode_context_parallel_size: int | None = None
    speculative_config: dict | None = None  # vLLM's --speculative-config, as given
    kv_offloading_size: float | None = None  # GiB
    kv_offloading_backend: str | None = None

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> EngineArgs:
        """The engine arguments of a stored mapping (run.json's ``engine``, which also holds launch facts such as
        the model and port: those are not engine arguments and are left out)."""
        data = data or {}
        return cls(**{name: data[name] for name in ENGINE_FIELDS if data.get(name) is not None})

    def stored(self) -> dict[str, Any]:
        """The arguments as run.json keeps them: every field, by vLLM's name (``None``: vLLM's default)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def flags(self) -> list[str]:
        """The `vllm serve` flags that set these arguments (`to_vllm_args`)."""
        return to_vllm_args(self)


if tuple(f.name for f in dataclasses.fields(EngineArgs)) != tuple(field for field, _, _ in ENGINE_FLAGS):
    raise AssertionError("EngineArgs and ENGINE_FLAGS must name the same engine arguments, in the same order")


def to_vllm_args(values: EngineArgs) -> list[str]:
    """Flags for the engine arguments in ``values`` (``None`` leaves vLLM's default), in one fixed order."""
    args: list[str] = []
    for field, flag, form in ENGINE_FLAGS:
        value = getattr(values, field)
        if value is None:
            continue
        if form == "value":
            args += [flag, _text(value)]
        elif form == "switch":
            if value:
                args.append(flag)
        else:
            args.append(flag if value else "--no-" + flag[2:])
    return args


def engine_args(s: Settings) -> EngineArgs:
    """The vLLM engine arguments a ``Settings`` sets; ``None`` leaves vLLM's default. The `vllm serve` line
    and the bench launcher both start from these."""
    return EngineArgs(**{
        "max_model_len": s.max_model_len,
        "data_parallel_size": s.data_parallel_size if s.data_parallel_size > 1 else None,
        "enable_expert_parallel": s.enable_expert_parallel or None,
        "tensor_parallel_size": s.tensor_parallel_size if s.tensor_parallel_size > 1 else None,
        "pipeline_parallel_size": s.pipeline_parallel_size if s.pipeline_parallel_size > 1 else None,
        "kv_cache_memory_bytes": s.kv_cache_memory_bytes,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "kv_cache_dtype": None if s.kv_cache_dtype == "auto" else s.kv_cache_dtype,
        "block_size": s.block_size,
        "num_gpu_blocks_override": s.num_gpu_blocks_override,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "enforce_eager": s.enforce_eager or None,
        "language_model_only": s.language_model_only or None,
        "mm_processor_kwargs": {"max_pixels": s.mm_max_pixels} if s.mm_max_pixels else None,
        "skip_mm_profiling": s.skip_mm_profiling or None,
        "disable_hybrid_kv_cache_manager": True if s.hybrid_kv_cache_manager is False else None,
        "enable_prefix_caching": s.enable_prefix_caching,
        "async_scheduling": s.async_scheduling,
        "mamba_ssm_cache_dtype": None if s.mamba_ssm_cache_dtype == "auto" else s.mamba_ssm_cache_dtype,
        "decode_context_parallel_size": s.decode_context_parallel_size if s.decode_context_parallel_size > 1 else None,
        "speculative_config": s.speculative.as_vllm_dict() if s.speculative else None,
        "kv_offloading_size": s.kv_offloading_size,
        "kv_offloading_backend": s.kv_offloading_backend,
    })


#: The engine arguments a source names as vLLM does, and the planner's default when it gives none
#: (kvplan.plan.schema.settings_from_engine_args reads them back).
READ_BACK = (("tensor_parallel_size", 1), ("pipeline_parallel_size", 1), ("kv_cache_dtype", "auto"),
              ("block_size", None), ("max_model_len", None), ("gpu_memory_utilization", None),
              ("kv_cache_memory_bytes", None), ("num_gpu_blocks_override", None), ("max_num_seqs", None),
              ("max_num_batched_tokens", None), ("enforce_eager", False), ("enable_prefix_caching", None),
              ("language_model_only", False), ("skip_mm_profiling", False), ("mm_max_pixels", None),
              ("decode_context_parallel_size", 1), ("kv_offloading_size", None), ("kv_offloading_backend", None))


def _text(value: object) -> str:
    if isinstance(value, dict):  # vLLM parses dict-valued flags as JSON
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)
